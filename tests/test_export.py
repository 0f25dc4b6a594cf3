"""`python -m llasmol.export`: the adapter merged into its base, a folder plain transformers loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import compose_config
from refusals import refused

from llasmol.core.files import write_json, write_jsonl
from llasmol.export import export
from llasmol.metrics.scoring import score_records


def _export(ckpt, output: Path, *extra: str) -> Path:
    return export(compose_config([f"ckpt={ckpt}", f"output={output}", *extra], "export"))


def test_an_exported_run_loads_with_plain_transformers_and_computes_what_the_adapter_does(trained_run, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llasmol.inference.loading import load_model, resolve_checkpoint

    folder = _export(trained_run, tmp_path / "merged")
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {
        p.name for p in folder.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # the staging folder was renamed into place
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    assert names and not [n for n in names if "lora" in n.lower()]  # no adapter weights: merged
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert not hasattr(merged, "peft_config")
    cfg = compose_config([f"ckpt={trained_run}", f"output={tmp_path / 'x'}"], "export")
    model_cfg, adapter, _ = resolve_checkpoint(str(trained_run), cfg)
    with_adapter, _ = load_model(model_cfg, adapter, None, merge=False)
    bare, _ = load_model(model_cfg, None)
    ids = tokenizer("[INST] Is <SMILES> CCO </SMILES> toxic? [/INST]", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs, base = merged(ids).logits, with_adapter(ids).logits, bare(ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4)  # the merge computes what the adapter on its base does
    assert not torch.equal(ours, base)  # and is not the bare base
    out = merged.generate(ids, max_new_tokens=3, num_beams=1, do_sample=False)  # plain transformers generates
    assert out.shape[1] == ids.shape[1] + 3 or out[0, -1].item() == tokenizer.eos_token_id
    gen = json.loads((folder / "generation_config.json").read_text())
    # one question, greedy, as the official LlaSMolGeneration.generate decodes it without settings
    assert (gen["num_beams"], gen["max_new_tokens"], gen["early_stopping"]) == (1, 1024, False)
    card = (folder / "README.md").read_text()
    assert "- LoRA `lite`: r=" in card and "the demo base pretrained by llasmol on RDKit facts" in card
    assert "- data: SMolInstruct, the excerpt bundled with llasmol" in card
    # the facts the run saved at train time, said as its adapters' cards say them (one renderer)
    adapter_card = (trained_run / "checkpoints" / "last.adapter" / "README.md").read_text()
    facts = [line for line in adapter_card.splitlines() if line.startswith(("- LoRA", "- trainable", "- data", "- recipe"))]
    assert len(facts) == 4 and all(line in card.splitlines() for line in facts)
    assert "on SMolInstruct (SMolInstruct:" in card and "SMolInstruct and SMolInstruct" not in card
    assert str(trained_run) not in card.split("## Evaluation")[0]  # no machine path in a card meant for the Hub
    assert "- adapter: `checkpoints/" in card
    assert f"Not evaluated on the test split yet: `python -m llasmol.evaluate ckpt={trained_run} data.split=test`" in card
    assert oct(folder.stat().st_mode & 0o777) != oct(0o700)  # not the staging folder's private mode
    # The decoding section names the beams of the tasks the run trained, not of all 14.
    decoding = card.split("## Decoding")[1].split("## Evaluation")[0]
    trained = json.loads((trained_run / "card.json").read_text())["tasks"]
    for task in compose_config(["paths.output_dir=/x"]).generation.tasks:
        assert (f"{task} " in decoding) == (task in trained), task
    assert "molecule_captioning" not in decoding  # the bundled data has no captions
    # A tokenizer every transformers release the package allows reads: the class 4.x knows, its inputs named (4.x
    # would add token_type_ids, which generate refuses), nothing about how this machine read the files.
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] in ("PreTrainedTokenizerFast", "LlamaTokenizerFast", "LlamaTokenizer")
    if config["tokenizer_class"] == "PreTrainedTokenizerFast":  # the tiny model's (4.x reads its default inputs)
        assert config["model_input_names"] == ["input_ids", "attention_mask"]
    assert not {"is_local", "local_files_only"} & set(config)
    assert set(tokenizer("CCO")) == {"input_ids", "attention_mask"}


def _lowest_allowed(package: str) -> str:
    """The lower bound pyproject.toml gives `package` (`package>=X` in the dependencies)."""
    import re
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    (bound,) = [m.group(1) for d in project["dependencies"] if (m := re.fullmatch(rf"{package}>=([\w.]+)(,.*)?", d))]
    return bound


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").environ.get("LLASMOL_TEST_OLDEST_TRANSFORMERS"),
                    reason="set LLASMOL_TEST_OLDEST_TRANSFORMERS=<python of an environment with torch and the oldest "
                           "transformers pyproject.toml allows> (docs/install.md says how)")
def test_an_export_loads_and_generates_alike_under_the_oldest_transformers_allowed(trained_run, tmp_path):
    import os
    import subprocess

    from transformers import AutoModelForCausalLM, AutoTokenizer

    python = os.environ["LLASMOL_TEST_OLDEST_TRANSFORMERS"]
    folder = _export(trained_run, tmp_path / "merged")
    code = ("import json, sys, transformers\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); m = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
            "ids = t(sys.argv[2], return_tensors='pt', add_special_tokens=False)\n"
            "out = m.generate(**ids, max_new_tokens=6, num_beams=3, do_sample=False)\n"
            "print(json.dumps([transformers.__version__, out.tolist()]))\n")
    prompt = "<s>[INST] Is <SMILES> CCO </SMILES> toxic? [/INST]"
    proc = subprocess.run([python, "-c", code, str(folder), prompt], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, old = json.loads(proc.stdout.strip().splitlines()[-1])
    from packaging.version import Version

    assert Version(version) == Version(_lowest_allowed("transformers"))  # the oldest the package allows
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    now = model.generate(**tokenizer(prompt, return_tensors="pt", add_special_tokens=False), max_new_tokens=6,
                         num_beams=3, do_sample=False)
    assert old == now.tolist()  # the same beams under both releases


def test_the_model_card_sets_the_runs_test_metrics_beside_the_paper_with_intervals(trained_run, tmp_path):
    run = Path(shutil.copytree(trained_run, tmp_path / "run"))
    records = [{"task": "property_prediction-bbbp", "index": i, "input": f"b{i}", "gold": ["Yes"],
                "predictions": ["<BOOLEAN> Yes </BOOLEAN>" if i % 4 else "<BOOLEAN> No </BOOLEAN>"]} for i in range(20)]
    write_json(run / "metrics" / "test.json", score_records(records))
    write_jsonl(run / "predictions" / "test.jsonl", records)
    card = (_export(run, tmp_path / "merged") / "README.md").read_text()
    assert "| task | metric | ours | 95% interval | paper |" in card
    row = next(line for line in card.splitlines() if line.startswith("| property_prediction-bbbp | accuracy |"))
    lo, hi = (float(x) for x in row.split("[")[1].split("]")[0].split(", "))
    assert row.startswith("| property_prediction-bbbp | accuracy | 0.750 | [") and lo < 0.75 < hi
    assert "Paper column empty: the paper reports no results for the tiny demo model" in card


@pytest.mark.parametrize("extra,named", [(["quantization=4bit"], ("quantization.bits=4", "quantization=none")),
                                         (["ckpt=none"], ("ckpt=none", "adapter folder"))])
def test_what_cannot_be_merged_is_one_line(trained_run, tmp_path, extra, named):
    with refused(*named):
        _export(trained_run, tmp_path / "out", *extra)
    assert not (tmp_path / "out").exists()


def test_a_folder_with_files_is_never_replaced_and_offline_push_says_where_the_folder_is(trained_run, tmp_path,
                                                                                        monkeypatch):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with refused(f"output={taken}", "holds files"):
        _export(trained_run, taken)
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with refused("push_to_hub=me/llasmol-tiny", "HF_HUB_OFFLINE", f"hf upload me/llasmol-tiny {tmp_path / 'sent'}"):
        _export(trained_run, tmp_path / "sent", "push_to_hub=me/llasmol-tiny")
    assert (tmp_path / "sent" / "model.safetensors").is_file()  # the folder it would send is there


def test_the_command_without_a_checkpoint_is_one_line(tmp_path):
    from refusals import error_line, run_cli

    error_line(run_cli(["llasmol.export", f"output={tmp_path / 'out'}"], tmp_path), "ckpt", "ckpt=<value>")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pad", [None, 7])
def test_the_generation_config_carries_the_tokenizers_special_ids_and_one_questions_decoding(pad):
    """What an exported folder decodes with: one question's settings field by field (generation.question, not a
    task's default beams), and the tokenizer's own ids (its end-of-sequence as padding when it has no pad token, as
    generate would pad)."""
    from types import SimpleNamespace

    from llasmol.inference.beam_search import generation_config

    gen = compose_config(["ckpt=/x", "output=/y", "generation.question.num_beams=3", "generation.default.num_beams=5",
                          "generation.question.num_return_sequences=2", "generation.question.max_new_tokens=17"],
                         "export").generation
    tokenizer = SimpleNamespace(eos_token_id=2, pad_token_id=pad, bos_token_id=1)
    config = generation_config(gen, tokenizer)
    assert (config.num_beams, config.num_return_sequences, config.max_new_tokens) == (3, 2, 17)
    assert config.early_stopping is False and config.do_sample is False
    assert (config.eos_token_id, config.pad_token_id, config.bos_token_id) == (2, 2 if pad is None else pad, 1)


def test_a_runs_card_facts_and_tasks_read_back_in_another_process_as_train_wrote_them(trained_run):
    """card.json and tasks.json are read by a later command in a process of its own: the same facts, field by field,
    as the training process gathered (a run of SMolInstruct alone declares no tasks)."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom pathlib import Path\nfrom llasmol.core.run_dir import read_card, read_tasks\n"
            "folder = Path(sys.argv[1])\nprint(json.dumps({'card': read_card(folder), "
            "'declared': read_tasks(folder).declared}))")
    proc = subprocess.run([sys.executable, "-c", code, str(trained_run)], capture_output=True, text=True, check=True)
    read = json.loads(proc.stdout)
    params = json.loads((trained_run / "params.json").read_text())
    card = read["card"]
    assert read["declared"] == {} and card["own_tasks"] == {}
    assert card["params"] == params and card["model"] == "tiny" and card["tiny"] is False and card["demo"] is True
    assert card["lora"]["name"] == "lite" and card["lora"]["r"] == 16 and card["lora"]["train_head"] is False
    assert card["data"].startswith("SMolInstruct, the excerpt bundled") and str(trained_run) not in json.dumps(card)
    assert ", at most 4 steps, " in card["recipe"] and card["recipe"].endswith("seed 13")
    from llasmol.data.source import BUNDLED_DATA, SMolInstructSource

    assert card["tasks"] == SMolInstructSource(path=str(BUNDLED_DATA)).task_names()  # the 11 the excerpt has


HOLDER = """
import sys, time
from llasmol.core.run_lock import hold_run_lock
hold_run_lock(sys.argv[1], "export")
print("holding", flush=True)
time.sleep(600)
"""


@pytest.fixture
def merges(monkeypatch) -> list:
    """The merges an export starts (load_model with merge=True), counted: a refused target must come first."""
    import llasmol.inference.loading as loading

    started, real = [], loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: started.append(a) or real(*a, **k))
    return started


@pytest.mark.parametrize("target, named", [
    ("file/out", ["output=", "is a file, not a folder"]),  # under a file
    ("/proc/llasmol-export", ["output=/proc/llasmol-export", "virtual file system"]),
    ("link", ["output=", "is a symbolic link", "would be replaced"]),
])
def test_an_output_that_cannot_be_made_is_one_line_before_the_merge(trained_run, tmp_path, merges, target, named):
    (tmp_path / "file").write_text("mine")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with refused(*named):
        _export(trained_run, tmp_path / target)
    assert merges == [] and sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "link"]


def test_a_shard_size_transformers_cannot_read_is_one_line_at_the_config_check(tmp_path):
    from llasmol.core.schema import check_config

    for bad in ("bogus", "0GB", "1.5GB", "5 GB", "5TB"):  # a bare 5 is no string: the type check says so
        with refused(f"max_shard_size={bad!r}", "5GB"):
            check_config(compose_config([f"ckpt={tmp_path}", f"output={tmp_path / 'o'}", f"max_shard_size={bad}"],
                                        "export"))
    for good in ("5GB", "200MB", "2GiB", "512KiB"):
        check_config(compose_config([f"ckpt={tmp_path}", f"output={tmp_path / 'o'}", f"max_shard_size={good}"],
                                    "export"))


def test_a_second_export_into_one_output_is_one_line_before_its_merge(trained_run, tmp_path, merges):
    import subprocess
    import sys

    staging = tmp_path / ".merged.exporting"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(staging)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with refused(f"{staging} is in use by another llasmol.export", f"pid {holder.pid}",
                     f"name another output= than {tmp_path / 'merged'}"):
            _export(trained_run, tmp_path / "merged")
        assert merges == [] and not (tmp_path / "merged").exists()
    finally:
        holder.kill()
        holder.wait()
    (staging / "model.safetensors").write_text("half")  # what the killed export left
    _export(trained_run, tmp_path / "merged")  # cleared and written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"] and len(merges) == 1
    assert (tmp_path / "merged" / "model.safetensors").stat().st_size > 100


def test_an_export_that_fails_while_writing_leaves_nothing_beside_its_output(trained_run, tmp_path, monkeypatch):
    import llasmol.model.adapters as adapters

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / ".merged.exporting" / "model.safetensors"))

    monkeypatch.setattr(adapters, "_portable_tokenizer_config", broken)
    with refused("no space left on device"):
        _export(trained_run, tmp_path / "merged")
    assert list(tmp_path.iterdir()) == []
