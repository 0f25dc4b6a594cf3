"""The paper's format under the real tokenizers of current Mistral bases, offline (issue 25).

`mistral_common`'s wheel ships Mistral-7B-v0.3's SentencePiece v3 model and Mistral-NeMo's Tekken
vocabulary; `load_tokenizer` reads them from a `model.path` folder as a user's run reads the Hub's files.
Ground truth is mistral_common's own encoder for the same files. Under both, `[INST]` and `[/INST]` in the
paper's string are single control tokens (ids 3 and 4), as in Mistral's own instruct format.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import MAX_LENGTH, compose_config
from test_real_tokenizer import (
    BUNDLED_TASKS,
    official_string,
    official_tokenize,
    samples,
)

from llasmol.data.formatting import IGNORE_INDEX, PromptFormatter
from llasmol.inference.beam_search import task_settings
from llasmol.model.base import arch_facts, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import WHEEL_TOKENIZERS, wheel_tokenizer_folder  # noqa: E402
from token_lengths import answer_length  # noqa: E402


def own_encoder(model: str):
    """mistral_common's encoder for the same file, and how it reads a text segment after a control token."""
    import mistral_common
    from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    path = str(Path(mistral_common.__file__).parent / "data" / WHEEL_TOKENIZERS[model][0])
    if path.endswith(".json"):
        tekken = Tekkenizer.from_file(path)
        return tekken, lambda text: tekken.encode(text, bos=False, eos=False)
    sp = SentencePieceTokenizer(path)
    # SentencePiece marks a word start with its own '▁' prefix: a segment's leading space is that mark.
    return sp, lambda text: sp.encode(text.removeprefix(" "), bos=False, eos=False)


@pytest.fixture(scope="module", params=list(WHEEL_TOKENIZERS))
def real(request, tmp_path_factory):
    model = request.param
    folder = wheel_tokenizer_folder(tmp_path_factory.mktemp("tok"), model)
    cfg = compose_config([f"model={model}", f"model.path={folder}"])
    return model, cfg, load_tokenizer(cfg.model)


def test_the_tokenizer_is_the_bases_own(real):
    model, cfg, tok = real
    own, _ = own_encoder(model)
    facts = arch_facts(cfg.model.arch)
    assert len(tok) == facts["vocab_size"] == own.n_words
    assert (tok.bos_token_id, tok.eos_token_id) == (facts["bos_token_id"], facts["eos_token_id"]) == (own.bos_id, own.eos_id)
    assert tok.pad_token_id is not None
    assert tok.convert_tokens_to_ids(["[INST]", "[/INST]"]) == [own.get_special_token("[INST]"),
                                                               own.get_special_token("[/INST]")] == [3, 4]


def test_every_sample_is_the_official_string_and_mistral_commons_ids(real):
    model, cfg, tok = real
    _, segment = own_encoder(model)
    formatter = PromptFormatter(tok, cfg.model.prompt_template, max_length=MAX_LENGTH)
    checked = 0
    for sample in samples():
        enc = formatter.encode(sample["input"], sample["output"])
        assert enc.input_ids == official_tokenize(tok, official_string(sample), MAX_LENGTH)
        want = [1, 3, *segment(f" {sample['input']} "), 4, *segment(f" {sample['output']}"), 2]
        assert enc.input_ids == want[:MAX_LENGTH] and enc.truncated == (len(want) > MAX_LENGTH)
        assert enc.labels == enc.input_ids
        checked += 1
    assert checked == 300 * len(BUNDLED_TASKS)


def test_the_512_token_cut_drops_eos_and_masking_covers_the_prompt(real):
    model, cfg, tok = real
    plain = PromptFormatter(tok, cfg.model.prompt_template, max_length=MAX_LENGTH)
    masked = PromptFormatter(tok, cfg.model.prompt_template, max_length=MAX_LENGTH, train_on_inputs=False)
    cut = 0
    for sample in samples("train") + samples("dev") + samples("test"):
        enc = plain.encode(sample["input"], sample["output"])
        assert len(enc.input_ids) <= MAX_LENGTH and (enc.input_ids[-1] == tok.eos_token_id) == (not enc.truncated)
        prompt = plain.prompt_ids(sample["input"])
        assert prompt[-1] == 4 and enc.input_ids[: len(prompt)] == prompt[:MAX_LENGTH]
        labels = masked.encode(sample["input"], sample["output"]).labels
        assert labels == ([IGNORE_INDEX] * len(prompt) + enc.input_ids[len(prompt):])[: len(enc.input_ids)]
        cut += enc.truncated
    assert cut > 0  # the longest IUPAC names pass 512 tokens under both vocabularies


def test_every_gold_answer_fits_its_tasks_generation_budget(real):
    model, cfg, tok = real
    formatter = PromptFormatter(tok, cfg.model.prompt_template)
    longest: dict[str, int] = {}
    for split in ("train", "dev", "test"):
        for sample in samples(split):
            longest[sample["task"]] = max(longest.get(sample["task"], 0), answer_length(tok, formatter, sample))
    assert set(longest) == set(BUNDLED_TASKS)
    for task, n in longest.items():
        assert n <= task_settings(cfg.generation, task).max_new_tokens, (task, n)
