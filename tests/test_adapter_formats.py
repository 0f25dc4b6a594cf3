"""Adapters in PEFT's older pickled `adapter_model.bin` load through a weights-only reader, a crafted pickle is
refused without running, the conversion command writes safetensors, and adapter keys must fit the model."""

from __future__ import annotations

import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import HANG_TIMEOUT, compose_config
from refusals import error_line, refused, run_cli

from llasmol.convert_adapter import convert
from llasmol.inference.loading import load_model
from llasmol.model.adapters import WEIGHTS_PICKLE, WEIGHTS_SAFETENSORS
from llasmol.model.base import load_base_model, load_tokenizer
from llasmol.model.lora import apply_lora

PROMPT = "[INST] What is the molecular formula of <SMILES> CCO </SMILES> ? [/INST]"


@pytest.fixture(scope="module")
def cfg():
    return compose_config(["paths.output_dir=/tmp/unused"])


@pytest.fixture(scope="module")
def twins(cfg, tmp_path_factory):
    """One trained-looking adapter of the tiny model, saved as safetensors and in the old `.bin` layout."""
    root = tmp_path_factory.mktemp("adapters")
    model = apply_lora(load_base_model(cfg.model, load_tokenizer(cfg.model)), cfg.model, cfg.lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.05)  # lora_B starts at zero: give the adapter an effect
    model.save_pretrained(str(root / "new"))
    model.save_pretrained(str(root / "old"), safe_serialization=False)
    assert (root / "old" / WEIGHTS_PICKLE).is_file() and not (root / "old" / WEIGHTS_SAFETENSORS).exists()
    return root / "new", root / "old"


def greedy_tokens(cfg, folder, merge: bool = False) -> list[int]:
    model, tok = load_model(cfg.model, str(folder), merge=merge)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def test_an_old_bin_adapter_loads_and_generates_as_its_safetensors_twin(cfg, twins, caplog):
    new, old = twins
    want = greedy_tokens(cfg, new)
    with caplog.at_level(logging.WARNING, logger="llasmol.model.adapters"):
        got = greedy_tokens(cfg, old)
    assert got == want
    said = [r.getMessage() for r in caplog.records if WEIGHTS_PICKLE in r.getMessage()]
    assert len(said) == 1 and "weights-only" in said[0] and "convert_adapter" in said[0]
    base_only, tok = load_model(cfg.model, None)
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    plain = base_only.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                               do_sample=False, pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
    assert plain != want  # the adapter changed the output: the comparison above means something


class MakesAFile:
    """A pickle payload: unpickling it would create `path` (as a real attack would run a command)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["torch.save", "plain pickle"])
def test_a_crafted_pickle_is_refused_in_one_line_and_nothing_runs(cfg, twins, tmp_path, layout):
    _, old = twins
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "adapter_config.json").write_text((old / "adapter_config.json").read_text())
    marker = tmp_path / "pwned"
    payload = {"base_model.model.x": MakesAFile(str(marker))}
    if layout == "torch.save":
        torch.save(payload, evil / WEIGHTS_PICKLE)
    else:
        (evil / WEIGHTS_PICKLE).write_bytes(pickle.dumps(payload))
    with refused(evil / WEIGHTS_PICKLE, "nothing in it was run"):
        load_model(cfg.model, str(evil))
    assert not marker.exists()
    proc = run_cli(["llasmol.generate", "What is <SMILES> CCO </SMILES> ?", f"ckpt={evil}"], tmp_path)
    error_line(proc, evil / WEIGHTS_PICKLE)
    assert not marker.exists()


def test_the_conversion_command_writes_safetensors_that_load_without_the_bin(cfg, twins, tmp_path):
    new, old = twins
    folder = tmp_path / "converted"
    folder.mkdir()
    for name in ("adapter_config.json", WEIGHTS_PICKLE):
        (folder / name).write_bytes((old / name).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "llasmol.convert_adapter", str(folder)], capture_output=True,
                          text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0 and f"wrote {folder / WEIGHTS_SAFETENSORS}" in proc.stdout, proc.stderr[-800:]
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    (folder / WEIGHTS_PICKLE).unlink()
    assert load_file(str(folder / WEIGHTS_SAFETENSORS)).keys() == load_file(str(new / WEIGHTS_SAFETENSORS)).keys()
    assert greedy_tokens(cfg, folder) == greedy_tokens(cfg, new)
    with refused(folder, WEIGHTS_PICKLE, f"{WEIGHTS_SAFETENSORS} already"):
        convert(folder)


def test_conversion_copies_every_tensor_and_names_a_folder_it_cannot_convert(tmp_path, capsys):
    """Without a model: the command's help, its refusals, and a two-tensor `.bin` copied exactly."""
    from llasmol.convert_adapter import main

    folder = tmp_path / "adapter"
    folder.mkdir()
    with refused(folder, "adapter_config.json"):
        convert(folder)
    (folder / "adapter_config.json").write_text("{}")
    with refused(folder, WEIGHTS_PICKLE) as seen:
        convert(folder)
    assert WEIGHTS_SAFETENSORS not in seen.message  # there is no safetensors either
    weights = {"a.lora_A.weight": torch.arange(6.0).reshape(2, 3).t(), "a.lora_B.weight": torch.ones(1, 2)}
    torch.save(weights, folder / WEIGHTS_PICKLE)  # the transposed tensor is not contiguous: saved as it reads
    main([str(folder)])
    assert capsys.readouterr().out == f"wrote {folder / WEIGHTS_SAFETENSORS}: later loads read it and need no pickle\n"
    copied = load_file(str(folder / WEIGHTS_SAFETENSORS))
    assert copied.keys() == weights.keys() and all(torch.equal(copied[k], weights[k]) for k in weights)
    assert (folder / WEIGHTS_PICKLE).is_file()  # the .bin stays
    # Views of one buffer, and one tensor under two names (a tied pair): each gets its own copy.
    buffer = torch.arange(8.0)
    shared = {"a.lora_A.weight": buffer[:6].view(2, 3), "a.lora_B.weight": buffer[6:].view(1, 2)}
    shared["b.lora_A.weight"] = shared["a.lora_A.weight"]
    torch.save(shared, folder / WEIGHTS_PICKLE)
    main([str(folder)])
    capsys.readouterr()
    copied = load_file(str(folder / WEIGHTS_SAFETENSORS))
    assert copied.keys() == shared.keys() and all(torch.equal(copied[k], shared[k]) for k in shared)
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    help_text = capsys.readouterr().out
    assert done.value.code == 0 and help_text.startswith("usage: python -m llasmol.convert_adapter [-h] folder")
    words = " ".join(help_text.split())  # argparse wraps the description: its first paragraph only
    assert "the safetensors copy of an adapter saved as `.bin`. positional" in words and "PEFT" not in words


@pytest.mark.parametrize("change", ["missing", "extra", "shape"])
def test_adapter_keys_must_fit_the_model_and_are_named(cfg, twins, tmp_path, change):
    """A tensor missing, one more, or one of another shape (an adapter of another base): one short line naming it
    (torch's own message lists every tensor over many lines)."""
    new, _ = twins
    folder = tmp_path / change
    folder.mkdir()
    (folder / "adapter_config.json").write_text((new / "adapter_config.json").read_text())
    weights = load_file(str(new / WEIGHTS_SAFETENSORS))
    name = sorted(weights)[0]
    if change == "missing":
        del weights[name]
        needle = f"1 missing, e.g. {name}"
    elif change == "extra":
        weights["base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight"] = torch.zeros(2, 2)
        needle = "1 not in the model, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight"
    else:
        rows, columns = weights["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape
        weights = {k: torch.zeros(v.shape[0], v.shape[1] + 1) if "lora_A" in k else v for k, v in weights.items()}
        needle = (f"layers.0.self_attn.q_proj.lora_A.default.weight is [{rows}, {columns + 1}] in the adapter and "
                  f"[{rows}, {columns}] in the model")
    save_file(weights, str(folder / WEIGHTS_SAFETENSORS))
    with refused(folder, needle, "does not fit model") as said:
        load_model(cfg.model, str(folder))
    assert len(said.message) < 400


@pytest.mark.parametrize("damage,needle", [
    ("truncated", "adapter_model.safetensors"),
    ("rank_zero", "the value passed is 0"),
    ("foreign_targets", "{'nope_proj'}"),
    ("config_not_json", "adapter_config.json"),
])
def test_a_damaged_adapter_is_one_line_naming_the_bad_value(cfg, twins, tmp_path, damage, needle):
    import json
    import shutil

    new, _ = twins
    folder = tmp_path / damage
    shutil.copytree(new, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    if damage == "truncated":
        data = (folder / WEIGHTS_SAFETENSORS).read_bytes()
        (folder / WEIGHTS_SAFETENSORS).write_bytes(data[: len(data) // 2])
    elif damage == "rank_zero":
        (folder / "adapter_config.json").write_text(json.dumps({**config, "r": 0}))
    elif damage == "foreign_targets":
        (folder / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["nope_proj"]}))
    else:
        (folder / "adapter_config.json").write_text("{not json")
    from llasmol.inference.loading import resolve_checkpoint

    with refused(folder, needle):
        model_cfg, adapter, _ = resolve_checkpoint(str(folder), cfg)
        load_model(model_cfg, adapter)


def test_a_hub_adapter_offline_and_not_cached_is_one_line(cfg, monkeypatch):
    import llasmol.core.offline

    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: "HF_HUB_OFFLINE is set")
    with refused("someone/old-lora", "HF_HUB_OFFLINE is set", "hf download someone/old-lora"):
        load_model(cfg.model, "someone/old-lora")


def test_a_merged_adapter_generates_as_the_separate_one(cfg, twins):
    """evaluate and generate fold the adapter into the base (merge_adapter=true), as the official evaluation
    does; in fp32 the answers are those of PEFT's separate adapter layers."""
    new, _ = twins
    merged, tok = load_model(cfg.model, str(new), merge=True)
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    separate, _ = load_model(cfg.model, str(new))
    assert any("lora_" in name for name, _ in separate.named_parameters())  # unless asked, the adapter stays apart
    ids = tok(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        # float32 rounding of W + BA against W x + B(A x), on logits of size ~10 (the demo base's)
        torch.testing.assert_close(merged(input_ids=ids).logits, separate(input_ids=ids).logits, rtol=1e-5, atol=1e-4)
    assert greedy_tokens(cfg, new, merge=True) == greedy_tokens(cfg, new)
    assert compose_config([], "evaluate").merge_adapter is True and compose_config([], "generate").merge_adapter is True


def test_the_model_card_of_a_real_base_names_it_and_shows_how_to_load_it_with_peft():
    from llasmol.model.cards import adapter_card

    facts = {"base": "mistralai/Mistral-7B-v0.1", "model": "mistral", "tiny": False,
             "lora": {"name": "full", "r": 16, "alpha": 16, "dropout": 0.05, "targets": ["q_proj", "v_proj"]},
             "params": {"trainable": 41_943_040, "total": 7_283_675_136, "percent": 0.58},
             "data": "osunlp/SMolInstruct at revision v1.0.0", "tasks": ["forward_synthesis"], "recipe": "AdamW8bit"}
    card = adapter_card(facts, {"val/loss": 0.5}, 800)
    assert "base_model: mistralai/Mistral-7B-v0.1" in card and "datasets: [osunlp/SMolInstruct]" in card
    assert "LoRA adapter for `mistralai/Mistral-7B-v0.1`" in card and "random weights" not in card
    assert 'base = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1", torch_dtype="bfloat16")' in card
    tiny = adapter_card({**facts, "tiny": True}, {}, 800)
    assert "PeftModel" not in tiny and "base_model:" not in tiny and "random weights" in tiny


def test_adapter_weights_say_which_format_they_came_from(tmp_path):
    from llasmol.model.adapters import adapter_weights

    weights = {"base_model.model.x.lora_A.weight": torch.ones(2, 3)}
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir()
    old.mkdir()
    save_file(weights, str(new / WEIGHTS_SAFETENSORS))
    torch.save(weights, old / WEIGHTS_PICKLE)
    for folder, pickled in ((new, False), (old, True)):
        got, was_pickled = adapter_weights(folder)
        assert was_pickled is pickled and got.keys() == weights.keys() and torch.equal(got[next(iter(got))],
                                                                                       torch.ones(2, 3))
    with refused(tmp_path, "adapter_config.json", WEIGHTS_SAFETENSORS, WEIGHTS_PICKLE):
        adapter_weights(tmp_path)


@pytest.mark.parametrize("content, kind", [([torch.ones(1)], "list"), ({"a": 1}, "dict"), ({1: torch.ones(1)}, "dict")])
def test_a_pickle_that_is_not_names_to_tensors_is_no_adapter(tmp_path, content, kind):
    from llasmol.model.adapters import read_pickled_weights

    path = tmp_path / WEIGHTS_PICKLE
    torch.save(content, path)
    with refused(path, f"a {kind}"):
        read_pickled_weights(path)


def test_an_unreadable_pickle_is_one_line_with_the_first_120_characters_of_why(tmp_path, monkeypatch):
    from llasmol.model.adapters import read_pickled_weights

    path = tmp_path / WEIGHTS_PICKLE
    path.write_bytes(b"not a pickle at all")
    with refused(path, "nothing in it was run", WEIGHTS_SAFETENSORS):
        read_pickled_weights(path)
    for error, reason in ((RuntimeError("  " + "x" * 130 + "\nsecond line"), "x" * 120),
                          (RuntimeError("  "), "RuntimeError")):
        monkeypatch.setattr(torch, "load", lambda *args, error=error, **kwargs: (_ for _ in ()).throw(error))
        with refused(path, f"({reason})", "nothing in it was run"):  # the first 120 characters, no more
            read_pickled_weights(path)


class _Saver:
    """Stands in for a PEFT model: writes a config, or fails as a full disk or a bug would."""

    def __init__(self, error=None):
        self.error = error

    def save_pretrained(self, folder, state_dict=None, **kwargs):
        assert kwargs == {"save_embedding_layers": False}  # LoRA here never resizes embeddings
        if self.error is not None:
            raise self.error
        (Path(folder) / "adapter_config.json").write_text("{}")


def test_an_adapter_save_writes_its_card_and_step_and_a_failed_one_leaves_nothing(tmp_path):
    import errno

    from llasmol.model.adapters import adapter_step, readable_adapter, save_adapter_atomically

    target = tmp_path / "deep" / "checkpoints" / "best.adapter"
    save_adapter_atomically(_Saver(), target, card="# card\n", step=7)
    assert (target / "README.md").read_text() == "# card\n"
    assert (target / "trainer_state.json").read_text() == '{"global_step": 7}\n'
    assert adapter_step(target) == 7 and readable_adapter(target) == target
    save_adapter_atomically(_Saver(), target)  # no card, no step: none written
    assert sorted(p.name for p in target.iterdir()) == ["adapter_config.json"] and adapter_step(target) is None
    for error in (OSError(errno.ENOSPC, "No space left on device"), ValueError("bug")):
        with refused(target, "no space left on device") if isinstance(error, OSError) else pytest.raises(ValueError):
            save_adapter_atomically(_Saver(error), target)
        assert sorted(p.name for p in target.parent.iterdir()) == ["best.adapter"]  # the temporary went
    # A folder that was never saved, with no stepped-aside copy: itself.
    assert readable_adapter(tmp_path / "never.adapter") == tmp_path / "never.adapter"
    # Both present (a stale copy beside a whole adapter): the adapter itself.
    (target.parent / ".best.adapter.old").mkdir()
    (target.parent / ".best.adapter.old" / "adapter_config.json").write_text("{}")
    assert readable_adapter(target) == target


@pytest.mark.parametrize("text, step", [('{"global_step": 4}', 4), ('{"global_step": "4"}', None), ("[4]", None),
                                        ("{}", None), ("not json", None)])
def test_an_adapters_step_is_read_when_it_is_an_integer(tmp_path, text, step):
    from llasmol.model.adapters import adapter_step

    (tmp_path / "trainer_state.json").write_text(text)
    assert adapter_step(tmp_path) == step


def test_the_model_cards_adapter_line_lists_the_lora_settings():
    from llasmol.model.cards import adapter_card

    facts = {"base": "b", "model": "tiny", "tiny": True,
             "lora": {"name": "full", "r": 16, "alpha": 32, "dropout": 0.05, "targets": ["q_proj", "v_proj"]},
             "params": {"trainable": 1234567, "total": 7654321, "percent": 16.129},
             "data": "d", "tasks": ["forward_synthesis", "retrosynthesis"], "recipe": "r"}
    lines = adapter_card(facts, {"val/loss": 0.51234, "val/step": 3}, 12).splitlines()
    assert "- LoRA `full`: r=16, alpha=32, dropout=0.05, on q_proj, v_proj" in lines
    assert "- trainable parameters: 1,234,567 of 7,654,321 (16.13%)" in lines
    assert "- data: d; tasks: forward_synthesis, retrosynthesis" in lines and "- this checkpoint: optimizer step 12" in lines
    assert "| val/loss | 0.5123 |" in lines and not any("val/step" in line for line in lines)  # floats only
    head = adapter_card({**facts, "lora": {**facts["lora"], "train_head": True}}, {}, 12).splitlines()
    assert "- LoRA `full`: r=16, alpha=32, dropout=0.05, on q_proj, v_proj and a trained output head" in head


def test_both_cards_say_what_the_adapter_learnt_from_once_and_alike(tmp_path):
    """One renderer of the run's saved facts: the adapter's card and the merged model's say the same training
    lines, and the subject reads right for SMolInstruct alone, tasks of one's own alone, and both (the export
    card once read "on SMolInstruct and SMolInstruct")."""
    from omegaconf import OmegaConf

    from llasmol.model.cards import adapter_card, merged_card, trained_on, training_lines

    facts = {"base": "b", "model": "tiny", "tiny": True,
             "lora": {"name": "lite", "r": 8, "alpha": 16, "dropout": 0.05, "targets": ["q_proj"]},
             "params": {"trainable": 10, "total": 100, "percent": 10.0}, "data": "d",
             "tasks": ["forward_synthesis", "logp"], "recipe": "r", "own_tasks": {"logp": "number"}}
    assert trained_on({**facts, "own_tasks": {}}) == "SMolInstruct"
    assert trained_on(facts) == "SMolInstruct and tasks of its own (logp)"
    assert trained_on({**facts, "tasks": ["logp"]}) == "tasks of its own (logp)"
    model_cfg = OmegaConf.create({"name": "tiny", "hf_id": None, "dtype": "float32", "random_init": True,
                                  "prompt_template": "llasmol"})
    merged = merged_card(model_cfg, facts, "checkpoints/last.adapter", "beams", ["scores"]).splitlines()
    adapter = adapter_card(facts, {}, 3).splitlines()
    lines = training_lines(facts)
    assert "- tasks of its own (data.new_tasks, scored as their family): logp (number)" in lines
    assert all(line in merged and line in adapter for line in lines)
    assert "# tiny + LoRA `lite` on SMolInstruct and tasks of its own (logp)" in adapter
    bare = merged_card(model_cfg, None, "my.adapter", "beams", []).splitlines()  # an adapter folder: no run facts
    assert "- adapter: `my.adapter`" in bare and not any(line.startswith("- LoRA") for line in bare)


def test_markup_in_a_runs_own_words_is_shown_on_the_cards_never_rendered():
    """The Hub renders a card's HTML: a model name, the data in words or the recipe holding markup is escaped; a
    backtick cannot end a code span, a line break cannot start a YAML key or a heading."""
    from omegaconf import OmegaConf

    from llasmol.model.cards import adapter_card, merged_card

    facts = {"base": "someone/b\nbase_model: evil", "model": "<script>alert(1)</script>", "tiny": False,
             "lora": {"name": "x`<b>y</b>", "r": 8, "alpha": 16, "dropout": 0.05, "targets": ["q_proj"]},
             "params": {"trainable": 10, "total": 100, "percent": 10.0}, "data": "<img src=x onerror=alert(1)>",
             "tasks": ["forward_synthesis"], "recipe": "a & <i>b</i>"}
    model_cfg = OmegaConf.create({"name": "<svg onload=x>", "hf_id": "someone/b\nlicense: x", "dtype": "float32",
                                  "random_init": False, "prompt_template": "llasmol"})
    for card in (adapter_card(facts, {"val/<u>t</u>/em": 0.5}, 3), merged_card(model_cfg, facts, "a`b", "d", [])):
        rendered = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", card, flags=re.S))  # code is shown as is
        for raw in ("<script", "<img", "<b>", "<i>", "<svg", "<u>"):
            assert raw not in rendered
        assert "&lt;img src=x onerror=alert(1)&gt;" in card and "a &amp; &lt;i&gt;b&lt;/i&gt;" in card
        lines = card.splitlines()
        assert [line for line in lines if line.startswith(("base_model:", "license:"))] == [
            "base_model: someone/b base_model: evil" if "peft" in card else "base_model: someone/b license: x"]
        assert all(line.count("`") % 2 == 0 for line in lines if not line.startswith("```"))  # spans closed
    adapter = adapter_card(facts, {"val/<u>t</u>/em": 0.5}, 3)
    assert "# &lt;script&gt;alert(1)&lt;/script&gt; + LoRA `x'<b>y</b>`" in adapter  # literal inside the span
    assert "| val/&lt;u&gt;t&lt;/u&gt;/em | 0.5000 |" in adapter


@pytest.mark.parametrize("written, said", [("[1, 2]", "holds a JSON list"), ("{\"model\": \"tiny\"}", "lacks lora"),
                                           ("{", "is not valid JSON (Expecting property name"), (None, "not a regular file")])
def test_a_runs_card_facts_that_are_not_what_train_wrote_are_one_line(tmp_path, written, said):
    from llasmol.core.run_dir import CARD, read_card

    assert read_card(tmp_path) is None  # none: an adapter folder, or an older run
    path = tmp_path / CARD
    path.mkdir() if written is None else path.write_text(written)
    with refused(path, said):
        read_card(tmp_path)


@pytest.mark.parametrize("kind, said", [("fifo", "is a named pipe"), ("loop", "is a symbolic link loop"),
                                        ("device", "character device"), ("absent", "no adapter_model.safetensors")])
def test_an_adapter_whose_weights_are_no_regular_file_is_named_as_what_it_is(tmp_path, kind, said):
    import json
    import os

    from refusals import refused

    from conftest import compose_config
    from llasmol.inference.loading import _check_adapter_base

    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    path = tmp_path / "adapter_model.safetensors"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        path.symlink_to(tmp_path / "x")
        (tmp_path / "x").symlink_to(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    with refused(said):
        _check_adapter_base(tmp_path, compose_config(["paths.output_dir=/x"]).model)
