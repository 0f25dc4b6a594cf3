"""`model.prompt_template=chat_template`: the tokenizer's own chat template instead of the paper's string."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import MAX_LENGTH, compose_config
from refusals import refused
from test_real_tokenizer import samples

from llasmol.data.formatting import IGNORE_INDEX, PromptFormatter
from llasmol.model.base import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import wheel_tokenizer_folder  # noqa: E402

# Mistral's first instruct template (one user and one assistant turn): the paper's string is this format.
MISTRAL_V1_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} "
                       "[/INST]{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
# ChatML, as Qwen's chat checkpoints write turns.
CHATML_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def mistral_v03(tmp_path_factory):
    folder = wheel_tokenizer_folder(tmp_path_factory.mktemp("tok"), "mistral_v03")
    return load_tokenizer(compose_config(["model=mistral_v03", f"model.path={folder}"]).model)


def test_mistrals_own_template_gives_the_papers_ids(mistral_v03):
    mistral_v03.chat_template = MISTRAL_V1_TEMPLATE
    paper = PromptFormatter(mistral_v03, "llasmol", max_length=MAX_LENGTH, train_on_inputs=False)
    chat = PromptFormatter(mistral_v03, "chat_template", max_length=MAX_LENGTH, train_on_inputs=False)
    for sample in samples("dev"):
        assert chat.prompt_ids(sample["input"]) == paper.prompt_ids(sample["input"])
        assert chat.encode(sample["input"], sample["output"]) == paper.encode(sample["input"], sample["output"])


def chatml_tokenizer():
    tok = load_tokenizer(compose_config([]).model)  # the tiny model's bundled tokenizer
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML_TEMPLATE
    return tok


def test_chatml_turns_mask_the_prompt_and_end_the_answer_at_end_of_turn():
    tok = chatml_tokenizer()
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    formatter = PromptFormatter(tok, "chat_template", max_length=MAX_LENGTH, train_on_inputs=False)
    sample = samples("dev")[0]
    prompt = formatter.prompt_ids(sample["input"])
    enc = formatter.encode(sample["input"], sample["output"])
    assert tok.decode(prompt) == f"<|im_start|>user\n{sample['input']}<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.count(start) == 2 and enc.input_ids[: len(prompt)] == prompt
    answer = enc.input_ids[len(prompt):]
    assert tok.decode(answer) == f"{sample['output']}<|im_end|>\n" and answer[-2] == end == tok.eos_token_id
    assert enc.labels == [IGNORE_INDEX] * len(prompt) + answer
    cut = PromptFormatter(tok, "chat_template", max_length=len(prompt) + 3).encode(sample["input"], sample["output"])
    assert cut.truncated and cut.input_ids == enc.input_ids[: len(prompt) + 3]


def test_generation_prompts_come_from_the_chat_template():
    import torch
    from transformers import AutoModelForCausalLM

    from llasmol.inference.beam_search import BeamGenerator, BeamSettings
    from llasmol.model.base import arch_config

    tok = chatml_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(arch_config("tiny-mistral", vocab_size=len(tok))).eval()
    generator = BeamGenerator(model, tok, PromptFormatter(tok, "chat_template"))
    query = samples("test")[0]["input"]
    assert generator.encode(query) == tok(tok.apply_chat_template(
        [{"role": "user", "content": query}], tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
    [texts] = generator.generate([query], BeamSettings(2, 2, 4, False))
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


def test_a_tokenizer_without_a_chat_template_stops_with_one_line(mistral_v03):
    mistral_v03.chat_template = None
    with refused("model.prompt_template=chat_template", "model.prompt_template=llasmol"):
        PromptFormatter(mistral_v03, "chat_template")


def test_a_template_that_rewrites_the_prompt_in_the_conversation_is_refused():
    tok = chatml_tokenizer()
    tok.chat_template = CHATML_TEMPLATE.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>model\n{% endif %}")
    with refused("model.prompt_template=chat_template", "model.prompt_template=llasmol"):
        PromptFormatter(tok, "chat_template").encode("q", "a")


# Qwen3's own chat template (one template for the whole Qwen3 family, Qwen3-0.6B to Qwen3-8B and up), as
# vendored by llama.cpp in models/templates/Qwen-Qwen3-0.6B.jinja (read from the ye-NX/llama.cpp copy at
# b354d7c9ecb76c97c07098617cdebbdfffa2583e, line endings LF): model data, kept byte for byte.
QWEN3_TEMPLATE = (Path(__file__).parent / "data" / "qwen3_chat_template.jinja").read_text()
EMPTY_THINK = "<think>\n\n</think>\n\n"


def qwen3_tokenizer():
    """The tiny tokenizer with Qwen3's turn markers (special) and think tags (added, not special, as Qwen3's
    tokenizer has them: decoding keeps them) and Qwen3's real chat template."""
    tok = load_tokenizer(compose_config([]).model)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.add_tokens(["<think>", "</think>"])
    tok.eos_token = "<|im_end|>"
    tok.chat_template = QWEN3_TEMPLATE
    return tok


def test_qwen3s_template_asks_for_the_answer_after_the_empty_think_block_it_trains_after():
    """Qwen3's template writes a final answer turn as `<think>\\n\\n</think>\\n\\n{answer}`; its non-thinking
    generation prompt ends with that same empty block. The block belongs to the (masked) prompt, so the
    target is the answer and its end of turn alone, and generation starts where training taught the answer."""
    tok = qwen3_tokenizer()
    think_open, think_close, end = tok.convert_tokens_to_ids(["<think>", "</think>", "<|im_end|>"])
    formatter = PromptFormatter(tok, "chat_template", max_length=MAX_LENGTH, train_on_inputs=False)
    for sample in samples("dev"):
        prompt = formatter.prompt_ids(sample["input"])
        enc = formatter.encode(sample["input"], sample["output"])
        assert tok.decode(prompt) == f"<|im_start|>user\n{sample['input']}<|im_end|>\n<|im_start|>assistant\n{EMPTY_THINK}"
        assert prompt.count(think_open) == prompt.count(think_close) == 1
        assert enc.input_ids[: len(prompt)] == prompt  # prompt/response identity
        answer = enc.input_ids[len(prompt):]
        assert think_open not in answer and think_close not in answer
        assert tok.decode(answer) == f"{sample['output']}<|im_end|>\n" and answer[-2] == end == tok.eos_token_id
        assert enc.labels == [IGNORE_INDEX] * len(prompt) + answer and not enc.truncated
        # The generation prompt is the one the template itself gives for non-thinking answers.
        assert prompt == tok(tok.apply_chat_template([{"role": "user", "content": sample["input"]}], tokenize=False,
                                                     add_generation_prompt=True, enable_thinking=False),
                             add_special_tokens=False)["input_ids"]


def test_qwen3s_template_truncates_to_512_tokens_from_the_end():
    """As for the paper's format: the first 512 tokens are kept, so a cut sample loses its end of turn."""
    tok = qwen3_tokenizer()
    sample = samples("dev")[0]
    response = " ".join([sample["output"]] * 200)  # far over 512 tokens
    plain = PromptFormatter(tok, "chat_template", max_length=MAX_LENGTH)
    masked = PromptFormatter(tok, "chat_template", max_length=MAX_LENGTH, train_on_inputs=False)
    whole = PromptFormatter(tok, "chat_template", max_length=10**6).encode(sample["input"], response)
    cut, cut_masked = plain.encode(sample["input"], response), masked.encode(sample["input"], response)
    assert len(whole.input_ids) > MAX_LENGTH and whole.input_ids[-2] == tok.eos_token_id
    assert cut.truncated and cut.input_ids == whole.input_ids[:MAX_LENGTH] == cut_masked.input_ids
    assert tok.eos_token_id not in cut.input_ids[len(plain.prompt_ids(sample["input"])):]
    n_prompt = len(masked.prompt_ids(sample["input"]))
    assert cut_masked.labels == [IGNORE_INDEX] * n_prompt + cut.input_ids[n_prompt:]


def test_an_answer_after_an_empty_think_block_is_read_as_the_answer():
    """A model that writes Qwen3's empty think block before its answer (asked without the block in its
    prompt) is scored on the answer: the block is not the caption, and tags inside a think block are not
    the answer."""
    from llasmol.metrics import any_answer, extract_answer

    assert extract_answer("molecule_captioning", f"{EMPTY_THINK}The molecule is an acid.") == "The molecule is an acid."
    assert extract_answer("forward_synthesis", f"{EMPTY_THINK}<SMILES> CCO </SMILES>") == "CCO"
    assert extract_answer("forward_synthesis", "<think>\nmaybe <SMILES> C </SMILES>\n</think>\n\n<SMILES> CCO </SMILES>") == "CCO"
    assert extract_answer("molecule_captioning", EMPTY_THINK) is None
    assert extract_answer("forward_synthesis", "<think>\nmaybe <SMILES> C </SMILES>") is None  # still thinking
    assert any_answer(f"{EMPTY_THINK}<NUMBER> -1.4 </NUMBER>") == "-1.4"
    # Only a leading block is the model's reasoning; the tags elsewhere are text like any other.
    assert extract_answer("molecule_captioning", "It is <think> an acid.") == "It is <think> an acid."
