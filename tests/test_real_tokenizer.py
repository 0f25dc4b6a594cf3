"""The paper's formatting, truncation and generation budget under a real base-model tokenizer.

Mistral-7B's SentencePiece model ships inside the `mistral_common` wheel (`data/tokenizer.model.v1`), so
these tests load it the way a user's run would: a local `model.path` folder read by `load_tokenizer`.
A stand-in tokenizer hides what matters here: SentencePiece splits digits one per token and each answer
tag into 6-7 pieces, so `<MOLFORMULA> C15H11NO </MOLFORMULA>` alone is 21 tokens.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from conftest import MAX_LENGTH, compose_config
from refusals import refused

from llasmol.core.tasks import TASK_NAMES
from llasmol.data.formatting import IGNORE_INDEX, PromptFormatter
from llasmol.data.smolinstruct import SMolInstructSplit
from llasmol.inference.beam_search import task_settings
from llasmol.model.base import ARCH_DIR, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _common import mistral_tokenizer_folder  # noqa: E402
from token_lengths import answer_length  # noqa: E402  (the benchmark's count, tested here)

BUNDLED = ROOT / "llasmol" / "data" / "bundled"
BUNDLED_TASKS = sorted(p.stem for p in (BUNDLED / "core_tag").glob("*.json"))


@pytest.fixture(scope="module", params=[True, False], ids=["legacy", "non-legacy"])
def mistral(request, tmp_path_factory):
    folder = mistral_tokenizer_folder(tmp_path_factory.mktemp("mistral"), legacy=request.param)
    # model.tokenizer_legacy=null: the folder's own setting, so both encodings are checked below.
    return load_tokenizer(compose_config(["model=mistral", f"model.path={folder}", "model.tokenizer_legacy=null"]).model)


@pytest.mark.parametrize("files_legacy", [True, False])
def test_the_paper_bases_encode_the_prompt_as_the_released_models_were_trained(tmp_path, files_legacy):
    """The 2024 runs' tokenizer was legacy ('▁[' after '<s>'); a non-legacy tokenizer_config.json (as current
    Hub files have) must not change the prompts released adapters are evaluated on."""
    folder = mistral_tokenizer_folder(tmp_path, legacy=files_legacy)
    for model in ("mistral", "llama2", "codellama", "llama2_13b"):
        tok = load_tokenizer(compose_config([f"model={model}", f"model.path={folder}"]).model)
        ids = tok("<s>[INST] CCO [/INST]", add_special_tokens=False)["input_ids"]
        assert tok.convert_ids_to_tokens(ids)[:3] == ["<s>", "\u2581[", "INST"]
    own = load_tokenizer(compose_config(["model=mistral", f"model.path={folder}", "model.tokenizer_legacy=null"]).model)
    pieces = own.convert_ids_to_tokens(own("<s>[INST]", add_special_tokens=False)["input_ids"])
    assert pieces[1] == ("\u2581[" if files_legacy else "[")


def test_tokenizer_legacy_false_gives_the_current_encoding_and_is_checked(tmp_path, monkeypatch):
    """`model.tokenizer_legacy=false` on Mistral's real SentencePiece model: '[' after '<s>' whatever the files
    say; a tokenizer that does not take the setting (here its argument dropped, so legacy files keep '▁[')
    is refused, not run with the other encoding."""
    import transformers

    folders = {legacy: mistral_tokenizer_folder(tmp_path, legacy=legacy) for legacy in (True, False)}
    for folder in folders.values():
        cfg = compose_config(["model=mistral", f"model.path={folder}", "model.tokenizer_legacy=false"]).model
        tok = load_tokenizer(cfg)
        assert tok.convert_ids_to_tokens(tok("<s>[INST] CCO", add_special_tokens=False)["input_ids"])[:3] == [
            "<s>", "[", "INST"]
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *args, legacy=None, **kwargs: real(*args, **kwargs))
    legacy_files = compose_config(["model=mistral", f"model.path={folders[True]}"]).model
    for asked, refuse in ((False, True), (True, False)):
        legacy_files.tokenizer_legacy = asked
        if refuse:
            with refused("'<s>[INST]'", "model.tokenizer_legacy=false"):
                load_tokenizer(legacy_files)
        else:
            load_tokenizer(legacy_files)


def test_a_tokenizer_that_cannot_honour_the_pinned_encoding_is_one_line(tmp_path):
    from llasmol.model.base import TINY_TOKENIZER_DIR

    folder = tmp_path / "bpe"
    shutil.copytree(TINY_TOKENIZER_DIR, folder)  # a BPE tokenizer: no SentencePiece legacy switch
    cfg = compose_config(["model=mistral", f"model.path={folder}"]).model
    with refused("'<s>[INST]'", "model.tokenizer_legacy=null"):
        load_tokenizer(cfg)


def samples(split: str = "train"):
    data = SMolInstructSplit(BUNDLED, split, BUNDLED_TASKS)
    return [data[i] for i in range(len(data))]


def official_string(sample: dict) -> str:
    # LLM4Chem utils/general_prompter.py get_chat_content: '<s>' + '[INST] %s [/INST]' + ' %s</s>'.
    return f"<s>[INST] {sample['input']} [/INST] {sample['output']}</s>"


def official_tokenize(tok, text: str, cutoff: int, add_eos_token: bool = True) -> list[int]:
    """finetune.py `tokenize`: encode without special tokens, truncate, add EOS only when it still fits."""
    ids = tok(text, add_special_tokens=False, truncation=True, max_length=cutoff)["input_ids"]
    if ids[-1] != tok.eos_token_id and len(ids) < cutoff and add_eos_token:
        ids.append(tok.eos_token_id)
    return ids


def test_the_real_tokenizer_is_mistrals(mistral):
    assert len(mistral) == 32000 and (mistral.bos_token_id, mistral.eos_token_id) == (1, 2)
    pieces = mistral.convert_ids_to_tokens(mistral("C15H11NO", add_special_tokens=False)["input_ids"])
    assert pieces[-6:] == ["1", "5", "H", "1", "1", "NO"]  # digits one per token


def test_every_sample_encodes_as_the_official_string(mistral):
    formatter = PromptFormatter(mistral, "[INST] {input} [/INST]", max_length=MAX_LENGTH)
    checked = 0
    for sample in samples():
        enc = formatter.encode(sample["input"], sample["output"])
        want = official_tokenize(mistral, official_string(sample), MAX_LENGTH)
        assert enc.input_ids == want, sample["input"]
        assert enc.labels == want  # the paper trains on the whole sequence
        assert enc.input_ids[0] == 1 and (enc.input_ids[-1] == 2) == (not enc.truncated)
        checked += 1
    assert checked == 300 * len(BUNDLED_TASKS)


def test_generation_prompts_encode_as_the_official_prompt(mistral):
    formatter = PromptFormatter(mistral, "[INST] {input} [/INST]")
    for sample in samples("dev"):
        want = mistral(f"<s>[INST] {sample['input']} [/INST]", add_special_tokens=False)["input_ids"]
        assert formatter.prompt_ids(sample["input"]) == want


@pytest.mark.parametrize("quantile", [0.25, 0.5, 0.9])
def test_truncation_and_prompt_masking_keep_the_official_semantics(mistral, quantile):
    """Cut at the limit without EOS; a sample exactly as long as the limit keeps it; train_on_inputs=false
    masks the length of the separately encoded prompt (finetune.py lines 165-201)."""
    chosen = samples("dev") + samples("test")
    lengths = [len(mistral(official_string(s), add_special_tokens=False)["input_ids"]) for s in chosen]
    cutoff = sorted(lengths)[int(quantile * len(lengths))]  # some sample fits exactly
    plain = PromptFormatter(mistral, max_length=cutoff)
    masked = PromptFormatter(mistral, max_length=cutoff, train_on_inputs=False)
    for sample, full in zip(chosen, lengths):
        want = official_tokenize(mistral, official_string(sample), cutoff)
        enc = plain.encode(sample["input"], sample["output"])
        assert enc.input_ids == want
        assert enc.truncated == (full > cutoff)
        assert (want[-1] == mistral.eos_token_id) == (full <= cutoff)
        n_prompt = len(official_tokenize(mistral, f"<s>[INST] {sample['input']} [/INST]", cutoff, add_eos_token=False))
        want_labels = ([IGNORE_INDEX] * n_prompt + want[n_prompt:])[: len(want)]
        assert masked.encode(sample["input"], sample["output"]).labels == want_labels
    assert cutoff in lengths and any(n > cutoff for n in lengths)


def test_every_gold_answer_fits_its_tasks_generation_budget(mistral):
    """With the paper's budgets every gold answer completes; at the 20 tokens of the official config.py
    (never applied there) almost no formula answer would reach its closing tag."""
    gen = compose_config(["model=mistral"]).generation
    formatter = PromptFormatter(mistral)
    longest: dict[str, int] = {}
    for split in ("train", "dev", "test"):
        for sample in samples(split):
            n = answer_length(mistral, formatter, sample)
            longest[sample["task"]] = max(longest.get(sample["task"], 0), n)
    for task, n in longest.items():
        assert n <= task_settings(gen, task).max_new_tokens, (task, n)
    assert min(longest["name_conversion-i2f"], longest["name_conversion-s2f"], longest["property_prediction-lipo"]) > 20


def test_the_paper_configuration_lets_every_task_generate_1024_tokens():
    """generate_on_dataset.py's exec() cannot rebind max_new_tokens, so every official run used 1024."""
    cfg = compose_config(["model=mistral"])
    for task in TASK_NAMES:
        settings = task_settings(cfg.generation, task)
        assert settings.max_new_tokens >= 1024, task
        assert settings.early_stopping is False, task
    assert cfg.trainer.gradient_clip_val == 1.0 and cfg.trainer.gradient_clip_algorithm == "norm"


# ------------------------------------------------------------------ tokenizers without Llama's conventions


def galactica_like_folder(root: Path, name_specials: bool) -> Path:
    """A byte-level BPE laid out as Galactica's: <s>=0, <pad>=1, </s>=2, <unk>=3; it adds no BOS, and
    (`name_specials=False`) names no EOS or pad token either."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([s["input"] + " " + s["output"] for s in samples("dev")], trainer=trainer)
    names = {"eos_token": "</s>", "pad_token": "<pad>"} if name_specials else {}
    folder = root / f"galactica-{name_specials}"
    PreTrainedTokenizerFast(tokenizer_object=tok, **names).save_pretrained(str(folder))
    shutil.copy(ARCH_DIR / "galactica-6.7b.json", folder / "config.json")
    return folder


@pytest.mark.parametrize("name_specials", [True, False])
def test_a_tokenizer_without_bos_takes_its_special_ids_from_config_json(tmp_path, name_specials):
    folder = galactica_like_folder(tmp_path, name_specials)
    tok = load_tokenizer(compose_config(["model=galactica", f"model.path={folder}"]).model)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 2, 1)
    assert len(tok) == 400  # named, not added
    formatter = PromptFormatter(tok)
    sample = samples("dev")[0]
    enc = formatter.encode(sample["input"], sample["output"])
    text = tok(f"[INST] {sample['input']} [/INST] {sample['output']}", add_special_tokens=False)["input_ids"]
    assert enc.input_ids == [0, *text, 2]
    assert formatter.prompt_ids(sample["input"])[0] == 0 and None not in enc.input_ids
