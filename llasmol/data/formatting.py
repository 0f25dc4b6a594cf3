"""Turn a (query, response) pair into token ids and labels, exactly as the paper's scripts do.

The official code (LLM4Chem `utils/general_prompter.py`, `finetune.py` lines 165-201) writes every sample as
the *string* `<s>[INST] {query} [/INST] {response}</s>`, for every base, and encodes it with
`add_special_tokens=False`, truncated to 512 tokens (so a cut sample loses its EOS). Generation encodes
`<s>[INST] {query} [/INST]` the same way (`generation.py` line 82). Encoding that same string here, rather
than ids around an encoded text, keeps the result equal to the official one under any tokenizer: whether
text after `<s>` gets a leading '▁' is the tokenizer's own (legacy) behaviour, as it was for the paper.
With `train_on_inputs=false` the first len(encode(prompt)) labels are masked, as `finetune.py` does.

`model.prompt_template=chat_template` instead renders the query as the user turn and the response as the
assistant turn of the tokenizer's own chat template (for instruct/chat checkpoints), without thinking (a
Qwen3 template's empty think block ends the prompt); the rendered prompt must be a prefix of the rendered
conversation, so the same mask, truncation and packing apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from llasmol.core.errors import UserError

IGNORE_INDEX = -100

# `model.prompt_template` by name (or any literal with `{input}`). `llasmol`: the paper's, for every base.
# `alpaca`: Mol-Instructions' default (its `generate.py` uses alpaca-lora's Prompter), for evaluating its
# Molinst adapters as the paper did (App. A.2.4, with our queries as the instruction). `plain`: the query
# alone, for a base model asked zero-shot without any chat markup.
PROMPT_TEMPLATES = {
    "llasmol": "[INST] {input} [/INST]",
    "alpaca": ("Below is an instruction that describes a task. Write a response that appropriately completes "
               "the request.\n\n### Instruction:\n{input}\n\n### Response:\n"),
    "plain": "{input}",
}
DEFAULT_PROMPT_TEMPLATE = "llasmol"  # the paper's, for every base (the formatter's and the datamodule's default)


# The tokenizer's own chat template, rendered by `apply_chat_template`, rather than a string template.
CHAT_TEMPLATE = "chat_template"


def resolve_prompt_template(value: str) -> str:
    """A template by name from `PROMPT_TEMPLATES`, `chat_template`, or `value` itself when it holds `{input}`."""
    if value in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[value]
    if value == CHAT_TEMPLATE:
        return value
    if "{input}" not in value:
        raise UserError(f"model.prompt_template={value!r} is neither a template name ({', '.join(PROMPT_TEMPLATES)}) "
                        "nor a template with the {input} placeholder, nor chat_template")
    return value


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    truncated: bool


class PromptFormatter:
    """Formats and tokenizes samples; `prompt_template` is a name from `PROMPT_TEMPLATES` or holds `{input}`.

    The tokenizer must name its BOS and EOS tokens (`llasmol.model.base.load_tokenizer` fills them in from
    the base's config.json when its files do not).
    """

    def __init__(
        self,
        tokenizer,
        prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
        max_length: Optional[int] = None,
        train_on_inputs: bool = True,
    ) -> None:
        prompt_template = resolve_prompt_template(prompt_template)
        named = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__  # the files it was read from
        if tokenizer.eos_token is None:
            raise UserError(f"the tokenizer {named} defines no EOS token and the base's config.json names none: "
                            "set model.arch to a config with eos_token_id")
        if prompt_template == CHAT_TEMPLATE and not getattr(tokenizer, "chat_template", None):
            raise UserError(f"model.prompt_template=chat_template, but the tokenizer {named} has no chat template (a "
                            "base checkpoint's usually has none): use model.prompt_template=llasmol, the paper's format")
        self.tokenizer = tokenizer
        self.prompt_template = prompt_template
        self.chat = prompt_template == CHAT_TEMPLATE
        self.max_length = max_length
        self.train_on_inputs = train_on_inputs
        self.bos_text = tokenizer.bos_token or ""
        self.eos_text = tokenizer.eos_token

    def prompt(self, query: str) -> str:
        if self.chat:
            return self._render([{"role": "user", "content": query}], add_generation_prompt=True)
        # str.replace, not str.format: queries contain braces (SMILES ring bonds, SELFIES never, JSON maybe).
        return self.prompt_template.replace("{input}", query)

    def _render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        # enable_thinking=False: SMolInstruct answers carry no reasoning. Qwen3's template writes a final
        # answer turn as `<think>\n\n</think>\n\n{answer}` and, asked without thinking, ends its generation
        # prompt with that same empty block: the block is then prompt (never generated; masked with
        # train_on_inputs=false) and the model answers exactly where training taught it to. Templates that
        # do not read the flag ignore it.
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  enable_thinking=False)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_text(self, query: str) -> str:
        """The text a model is given to answer `query`: `<s>[INST] {query} [/INST]`, or the chat template's
        user turn and assistant header (which carries its own BOS text, if any)."""
        return self.prompt(query) if self.chat else self.bos_text + self.prompt(query)

    def full_text(self, query: str, response: str) -> str:
        """The prompt followed by `response` and the end of the sequence (EOS, or the end of the assistant turn)."""
        if not self.chat:
            return f"{self.bos_text}{self.prompt(query)} {response}{self.eos_text}"
        prompt = self.prompt(query)
        full = self._render([{"role": "user", "content": query}, {"role": "assistant", "content": response}])
        if not full.startswith(prompt):
            raise UserError("model.prompt_template=chat_template: this tokenizer's chat template does not render "
                            "the conversation as its prompt followed by the answer, so the prompt cannot be masked "
                            "or generated from: use model.prompt_template=llasmol")
        return full

    def prompt_ids(self, query: str) -> list[int]:
        """The ids a model is given to answer `query` (see `prompt_text`)."""
        return self._ids(self.prompt_text(query))

    def encode(self, query: str, response: str) -> Encoded:
        full = self._ids(self.full_text(query, response))
        ids = full[: self.max_length]
        if self.train_on_inputs:
            labels = list(ids)
        else:
            n_prompt = min(len(self.prompt_ids(query)), len(ids))
            labels = [IGNORE_INDEX] * n_prompt + ids[n_prompt:]
        return Encoded(input_ids=ids, labels=labels, truncated=len(ids) < len(full))
