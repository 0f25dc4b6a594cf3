"""Turn a (query, response) pair into token ids and labels, the way the paper trains.

The paper wraps every sample as `<s>[INST] {query} [/INST] {response}</s>` for every base model,
truncates to 512 tokens (EOS only when it still fits) and trains on the whole sequence by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from llasmol.errors import UserError

IGNORE_INDEX = -100


@dataclass
class Encoded:
    input_ids: list[int]
    labels: list[int]
    truncated: bool


class PromptFormatter:
    """Formats and tokenizes samples; `prompt_template` must contain `{input}`."""

    def __init__(
        self,
        tokenizer,
        prompt_template: str = "[INST] {input} [/INST]",
        max_length: int = 512,
        train_on_inputs: bool = True,
    ) -> None:
        if "{input}" not in prompt_template:
            raise UserError(f"model.prompt_template {prompt_template!r} lacks the {{input}} placeholder")
        self.tokenizer = tokenizer
        self.prompt_template = prompt_template
        self.max_length = max_length
        self.train_on_inputs = train_on_inputs

    def prompt(self, query: str) -> str:
        # str.replace, not str.format: queries contain braces (SMILES ring bonds, SELFIES never, JSON maybe).
        return self.prompt_template.replace("{input}", query)

    def encode(self, query: str, response: str) -> Encoded:
        prompt = self.prompt(query)
        text = f"{prompt} {response}"
        enc = self.tokenizer(text, add_special_tokens=True, return_offsets_mapping=not self.train_on_inputs)
        ids = list(enc["input_ids"])
        full_length = len(ids) + 1  # + EOS
        ids = ids[: self.max_length]
        if self.train_on_inputs:
            labels = list(ids)
        else:
            # A token belongs to the response when it starts at or after the end of the prompt text;
            # special tokens (BOS) report the empty span (0, 0) and so count as prompt.
            cut = len(prompt)
            spans = enc["offset_mapping"][: len(ids)]
            labels = [
                IGNORE_INDEX if start < cut or start == end == 0 else tok for (start, end), tok in zip(spans, ids)
            ]
        if len(ids) < self.max_length:
            ids.append(self.tokenizer.eos_token_id)
            labels.append(self.tokenizer.eos_token_id)
        return Encoded(input_ids=ids, labels=labels, truncated=full_length > self.max_length)
