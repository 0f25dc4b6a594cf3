"""The one place a refusal's wording is checked: each message docs/troubleshooting.md lists is what the code says.

The page quotes each message with `…` for what varies; every row below produces that message in process (the
cheapest way there) and the quote, read as a pattern, must match it. Elsewhere tests say only which names and
values a refusal holds (tests/refusals.py), so rewording a message means changing the page and this table.
"""

from __future__ import annotations

import errno
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from conftest import compose_config
from llasmol.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
PAGE = " ".join((ROOT / "docs" / "troubleshooting.md").read_text().split())  # a quote may wrap


def _config(*overrides: str, name: str = "train"):
    from llasmol.core.schema import check_config

    check_config(compose_config(list(overrides), config_name=name))


def _offline():
    from llasmol.model.base import _offline_error

    raise _offline_error(OmegaConf.create({"hf_id": "mistralai/Mistral-7B-v0.1", "path": None}), "base weights")


def _batch():
    from llasmol.data.datamodule import SMolInstructDataModule

    datamodule = object.__new__(SMolInstructDataModule)
    datamodule.micro_batch_size, datamodule.effective_batch_size = 3, 8
    datamodule.gradient_accumulation(1)


def _task():
    from llasmol.core.tasks import get_task

    get_task("forward_synthesiss", "data.tasks")


def _look_alike():
    from llasmol.core.tasks import get_task

    get_task("\uff46orward_synthesis", "data.tasks")


def _data_changed(tmp_path):
    from smolinstruct_fixture import write_smolinstruct

    from llasmol.data.smolinstruct import SMolInstructSplit

    root = write_smolinstruct(tmp_path / "data", tasks=("name_conversion-s2f",))
    split = SMolInstructSplit(root, "train", ["name_conversion-s2f"])
    raw = root / "raw" / "train" / "name_conversion-s2f.jsonl"
    raw.write_text(raw.read_text() + "\n")
    split[0]


def _partial_edited(tmp_path):
    from llasmol.inference.partial import PartialPredictions, partial_path

    final = tmp_path / "test.jsonl"
    partial_path(final).write_text('{"settings": {}}\n{"index": 0, "predictions": ["C"\n')
    PartialPredictions(final, {}).resume({0})


def _logger_folder(tmp_path):
    from llasmol.finetune.tracking import check_loggers

    (tmp_path / "file").write_text("")
    check_loggers({"wandb": {"_target_": "x.WandbLogger", "save_dir": str(tmp_path / "file" / "wandb")}})


def _wandb_mode(tmp_path):
    from llasmol.finetune.tracking import check_wandb_mode

    check_wandb_mode({"WANDB_MODE": "onilne"})


def _method(name):
    from llasmol.classical import get_method

    get_method(name)


def _cannot_answer():
    from llasmol.classical import get_method
    from llasmol.classical.runner import choose_tasks

    from llasmol.core.tasks import SMOLINSTRUCT

    source = SimpleNamespace(task_names=lambda: ["name_conversion-s2i"], table=SMOLINSTRUCT)
    choose_tasks(get_method("rdkit")(), source, named=True)


def _no_java(monkeypatch):
    import shutil

    from llasmol.classical import opsin_names

    monkeypatch.setattr(shutil, "which", lambda name: None)
    opsin_names.opsin_smiles(["ethanol"])


def _no_py2opsin(monkeypatch):
    import shutil

    from llasmol.classical import opsin_names

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/java")
    monkeypatch.setitem(sys.modules, "py2opsin", None)
    opsin_names.opsin_smiles(["ethanol"])


def _lacks(tmp_path):
    from llasmol.inference.predictions import read_predictions

    (tmp_path / "p.jsonl").write_text(json.dumps({"task": "forward_synthesis", "input": "CCO"}) + "\n")
    read_predictions(tmp_path / "p.jsonl")


def _no_adapter(tmp_path):
    from llasmol.inference.loading import resolve_checkpoint

    resolve_checkpoint(str(tmp_path), compose_config([], config_name="evaluate"))


def _trained_on(tmp_path):
    from llasmol.inference.loading import _check_adapter_base

    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA",
                                                              "base_model_name_or_path": "mistralai/Mistral-7B-v0.1"}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    _check_adapter_base(tmp_path, OmegaConf.create({"name": "llama2", "hf_id": "meta-llama/Llama-2-7b-hf"}))


def _other_tiny(tmp_path):
    from llasmol.inference.loading import _check_adapter_base

    (tmp_path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "base_model_name_or_path": "llasmol/tiny-qwen3 (random weights, rebuilt from model.init_seed=0)"}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    _check_adapter_base(tmp_path, OmegaConf.create({"name": "tiny", "random_init": True, "arch": "tiny-mistral",
                                                    "init_seed": 0}))


def _thread_count():
    from llasmol.core.threads import thread_count

    thread_count(None, {"OMP_NUM_THREADS": "100000000"})


def _not_plain(tmp_path):
    from llasmol.model.adapters import read_pickled_weights

    torch.save({"w": torch.zeros(1), "f": SimpleNamespace()}, tmp_path / "adapter_model.bin")
    read_pickled_weights(tmp_path / "adapter_model.bin")


def _does_not_fit(tmp_path):
    from llasmol.model.adapters import load_adapter

    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = torch.nn.Linear(2, 2)

    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 1, "lora_alpha": 1,
                                                              "target_modules": ["q_proj"]}))
    from safetensors.torch import save_file

    save_file({"base_model.model.k_proj.lora_A.weight": torch.zeros(1, 2)}, tmp_path / "adapter_model.safetensors")
    load_adapter(Base(), tmp_path)


def _unwritable(code):
    def make(tmp_path):
        from llasmol.core.files import raise_if_unwritable

        raise_if_unwritable(OSError(code, "x"), tmp_path / "last.ckpt")
    return make


def _read_only(tmp_path, monkeypatch):
    import os

    from llasmol.core.config import check_writable

    monkeypatch.setattr(os, "access", lambda *a: False)
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY))
    check_writable(tmp_path / "run")


def _busy(tmp_path):
    from llasmol.core.run_lock import LOCK, _busy

    (tmp_path / LOCK).write_text(json.dumps({"pid": 12, "host": "node7", "started": 0}))
    raise _busy(tmp_path)


def _busy_evaluating(tmp_path):
    from llasmol.core.run_lock import LOCK, _busy

    (tmp_path / LOCK).write_text(json.dumps({"command": "evaluate", "pid": 12, "host": "node7", "started": 0}))
    raise _busy(tmp_path)


def _huge_row(tmp_path):
    from llasmol.core.tasks import TaskTable
    from llasmol.data.custom import read_table

    (tmp_path / "own.csv").write_text("input,output\n" + "C" * 5000 + ",1\n")
    read_table(tmp_path / "own.csv", table=TaskTable({"own": {"family": "number"}}))


def _pooled_past_the_bound(tmp_path):
    from llasmol.core.tasks import TaskTable
    from llasmol.data.custom import read_table

    rows = "".join(f"a drug,{'C' * (1 + i % 40)}{'O' * (i // 40)}\n" for i in range(1_001))
    (tmp_path / "gen.csv").write_text("input,output\n" + rows)
    read_table(tmp_path / "gen.csv", table=TaskTable({"gen": {"family": "smiles"}}))


def _maybe_gold(tmp_path):
    from llasmol.inference.predictions import read_predictions

    (tmp_path / "p.jsonl").write_text('{"task": "property_prediction-bbbp", "input": "C", "gold": "maybe", '
                                      '"predictions": ["Yes"]}\n')
    read_predictions(tmp_path / "p.jsonl")


def _edited_tasks(tmp_path):
    from llasmol.core.run_dir import read_tasks, write_tasks

    write_tasks(tmp_path, {"own": {"family": "number"}})
    (tmp_path / "tasks.json").write_text((tmp_path / "tasks.json").read_text().replace("number", "boolean"))
    read_tasks(tmp_path)


def _peer_lost(tmp_path, capsys):
    from types import SimpleNamespace

    from llasmol.finetune.fit import fit

    def fails(*args, **kwargs):
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:30099.")
    trainer = SimpleNamespace(fit=fails, world_size=2, global_step=4, global_rank=0, default_root_dir=str(tmp_path))
    with pytest.raises(SystemExit):
        fit(trainer, None, None, None)
    raise UserError(capsys.readouterr().err.strip().removeprefix("error: "))  # the line, as a refusal's


def _no_question():
    from llasmol import generate

    generate._has_question(["model=tiny", "hydra.run.dir=/x"])


def _option_quoted_whole():
    from llasmol.core.config import check_options

    check_options(["--cfg job"])


def _table(name, text):
    def produce(tmp_path):
        from llasmol.core.tasks import TaskTable
        from llasmol.data.custom import read_table

        (tmp_path / name).write_text(text)
        read_table(tmp_path / name, table=TaskTable({"own": {"family": "caption"}}))
    return produce


def _other_model(trained_run, monkeypatch):
    from llasmol.inference import loading

    monkeypatch.setattr(loading, "_model_chosen", lambda: True)  # as when the command line says model=
    loading.resolve_checkpoint(str(trained_run), compose_config(["model=mistral"], "evaluate"))


def _nul_byte(tmp_path):
    from llasmol.core.tasks import TaskTable
    from llasmol.data.custom import read_table

    (tmp_path / "own.csv").write_text("input,output\nC\x00C,1\n")
    read_table(tmp_path / "own.csv", table=TaskTable({"own": {"family": "number"}}))


def _no_cuda(monkeypatch):
    from llasmol.inference.loading import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    pick_device("cuda")


def _sweep_one_answer():
    from llasmol.frame import _no_sweeps

    _no_sweeps("generate")


def _huge_question():
    from llasmol.generate import generate

    generate(compose_config(["model=tiny", "ckpt=none"], "generate"), "<SMILES> " + "C" * 5000 + " </SMILES>")


def _fresh_start(tmp_path):
    from llasmol.core.run_lock import check_fresh_start

    (tmp_path / "result.json").write_text("{}")
    check_fresh_start(tmp_path, None, False)


def _command_line(*args):
    def make():
        from llasmol.core.config import check_overrides

        check_overrides("train", list(args))
    return make


def _logger(*overrides):
    def make():
        from llasmol.finetune.tracking import check_loggers

        check_loggers(compose_config(["paths.output_dir=/tmp", *overrides]).logger)
    return make


def _no_tensorboard(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    _logger("logger=tensorboard")()


def _no_last(tmp_path):
    from llasmol.finetune.resume import Resume

    (tmp_path / "run").mkdir()
    Resume.plan("last", tmp_path / "run", "tiny", "attn")


def _other_objective(tmp_path):
    from llasmol.core.run_lock import check_objective

    torch.save({"objective": "grpo", "global_step": 3}, tmp_path / "last.ckpt")
    check_objective(tmp_path / "last.ckpt", "sft")


def _adapter_of(tmp_path, base: str, *overrides: str):
    from llasmol.inference.loading import _check_adapter_base

    folder = tmp_path / "x.adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": base}))
    (folder / "adapter_model.safetensors").write_bytes(b"")
    _check_adapter_base(folder, compose_config(["paths.output_dir=/unused", *overrides]).model)


def _reward_function(target: str):
    def produce():
        from llasmol.core.tasks import SMOLINSTRUCT
        from llasmol.metrics.rewards import Rewards

        rewards = Rewards({"families": {"smiles": {"exact": 1}}, "custom": {"mine": {"_target_": target, "weight": 1}}},
                          SMOLINSTRUCT, ["forward_synthesis"])
        rewards.probe({"forward_synthesis": ("<SMILES> CCO </SMILES>", ["CCO"])})

    return produce


def _rollouts_link(tmp_path):
    from llasmol.finetune.preflight import check_rollouts_folder

    (tmp_path / "rollouts").symlink_to(tmp_path)
    check_rollouts_folder(tmp_path)


def _cut_adapter_config(tmp_path):
    from llasmol.inference.loading import adapter_config

    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LO')
    adapter_config(tmp_path)


def _no_corpus(tmp_path):
    from llasmol.audit import run_audit

    run_audit(compose_config([f"paths.output_dir={tmp_path}", f"corpus={tmp_path / 'corpus.jsonl'}"], "audit"))


def _data_position():
    from llasmol.data.resumable_loader import ResumableDataLoader

    loader = object.__new__(ResumableDataLoader)
    loader._shape = lambda: {"num_samples": 8, "batch_size": 2, "world_size": 1, "seed": 4, "group_by_length": False}
    loader.load_state_dict({"num_samples": 8, "batch_size": 2, "world_size": 1, "seed": 3, "group_by_length": False})


def _launch(world, sharded):
    def make(tmp_path):
        from llasmol.finetune.resume import check_same_launch

        torch.save({"dm": {"train_position": {"world_size": 2}}}, tmp_path / "x.ckpt")
        check_same_launch(str(tmp_path / "x.ckpt"), world, sharded)
    return make


def _not_in_split(tmp_path, smol_root):
    from llasmol.core.tasks import SMOLINSTRUCT
    from llasmol.inference.jobs import with_split_golds

    cfg = compose_config([f"data.path={smol_root}"], config_name="evaluate")
    with_split_golds([{"task": "forward_synthesis", "input": "CCCCCCCCCCCC", "gold": ["C"]}], cfg, SMOLINSTRUCT)


def _nan_loss():
    from test_train import _batch as batch
    from test_train import _module

    module = _module(loss=float("nan"), gradient_clip_val=None, checkpoint_callbacks=[])
    module.training_step(batch(), 0)


# (the quote as the page has it, what produces it)
def _weights(how: str, folder: Path):
    """A folder of the tiny base's weights, damaged `how`, read as trainer=fsdp reads it."""
    from llasmol.model.base import load_base_model, load_tokenizer
    from llasmol.model.deferred import DeferredWeights, fill_from_files

    cfg = compose_config([], "train")
    model = load_base_model(cfg.model, load_tokenizer(cfg.model))
    model.save_pretrained(folder)
    path = folder / "model.safetensors"
    if how == "header":
        path.write_bytes(path.read_bytes()[:8] + b"x" + path.read_bytes()[9:])
    elif how == "gone":
        path.unlink()
    weights = DeferredWeights(folder, "model", {})
    if how == "renamed":
        model.model.embed_tokens.weight = torch.nn.Parameter(torch.empty_like(model.model.embed_tokens.weight,
                                                                              device="meta"))
        weights = DeferredWeights(folder, "other", {"model.embed_tokens.weight": ("nothing.weight",)})
    fill_from_files(model, weights, torch.device("cpu"))


def _nodes(environ=None):
    from llasmol.finetune.preflight import check_nodes

    check_nodes({"num_nodes": 2}, environ or {})


ROWS = [
    ("… are not available offline …", _offline),
    ("the base's safetensors files in … have no tensor …", lambda tmp_path: _weights("renamed", tmp_path)),
    ("trainer.num_nodes=… but no launcher started this process …", lambda: _nodes()),
    ("NODE_RANK=… but trainer.num_nodes=…", lambda: _nodes({"MASTER_ADDR": "h", "NODE_RANK": "5"})),
    ("… has a damaged safetensors header …", lambda tmp_path: _weights("header", tmp_path)),
    ("… has no model.safetensors: trainer=fsdp reads the base from safetensors files …", lambda tmp_path: _weights("gone", tmp_path)),
    ("data.effective_batch_size=… is not a multiple of …", _batch),
    ("unknown task …", _task),
    ("unknown method=…", lambda: _method("nope")),
    ("no method given", lambda: _method(None)),
    ("morgan.n_bits=100 must be … a multiple of 8", lambda: _config("method=morgan", "morgan.n_bits=100",
                                                                    name="baseline")),
    ("method=… cannot answer <task>", _cannot_answer),
    ("method=opsin … no java is on PATH", _no_java),
    ("… needs the py2opsin package", _no_py2opsin),
    ("<file> line … lacks …", _lacks),
    ("ckpt=… holds no adapter", _no_adapter),
    ("adapter … was trained on …", _trained_on),
    ("OMP_NUM_THREADS=… is no thread count from 1 to 1024", _thread_count),
    ("… but this model is … from model.init_seed=…", _other_tiny),
    ("… adapter_model.bin is not a plain tensor file", _not_plain),
    ("adapter … does not fit model", _does_not_fit),
    ("cannot write <file>: no space left on device (… GB free there)", _unwritable(errno.ENOSPC)),
    ("disk quota exceeded", _unwritable(errno.EDQUOT)),
    ("… is on a read-only file system, so the run folder … cannot be written", _read_only),
    ("… already holds a run, and starting fresh there would replace its checkpoints, result and config …",
     _fresh_start),
    ("… is in use by another llasmol.train (pid … on …)", _busy),
    ("… in use by another llasmol.evaluate …", _busy_evaluating),
    ("<file> line …: the input of task … is a SMILES of … characters, past the 4,096 any molecule is read with here …",
     _huge_row),
    ("the query's SMILES is … characters, past the 4,096 …", _huge_question),
    ("<file> line …: the input … of task … has more than 1,000 different golds, which every answer to it would be "
     "scored against …", _pooled_past_the_bound),
    ("data.columns reads column … as both input and output …", lambda: _config("data=custom", "data.path=/x/t.csv",
                                                                              "data.columns.input=output")),
    ("… differ only by letter case or '-' and '_' …", lambda: _config("+data.new_tasks.LogP={family: number}",
                                                                      "+data.new_tasks.logp={family: number}")),
    ("<file> line …: input holds a NUL byte …", _nul_byte),
    ("data.new_tasks.<name>.query holds …, a chat-template marker …",
     lambda: _config("data=custom", "data.path=/x/t.csv", "+data.new_tasks.name={family: number, query: 'a <pad> <INPUT>'}")),
    ("ckpt=… is a run of model=…, and model=… was given …", _other_model),
    ("<file> line …: a quote opened in this row is never closed …", _table("q.csv", 'input,output\nC,"a\nCC,b\n')),
    ("<file>'s header starts with a second byte-order mark …", _table("b.csv", "\ufeff\ufeffinput,output\nC,a\n")),
    ("<file> is read at tabs (.tsv) and its header has none, only commas …", _table("c.tsv", "input,output\nC,a\n")),
    ("<file> has no column 'input' …", _table("n.csv", "smiles,output\nC,a\n")),
    ("<file> line … holds an integer of more than 4,300 digits …",
     _table("d.jsonl", '{"input": "C", "output": ' + "9" * 5000 + "}\n")),
    ('no query: run python -m llasmol.generate "<your question>" … read as setting(s): …', _no_question),
    ("'--cfg job' is one argument …", _option_quoted_whole),
    ("another of this run's … processes ended at step … (torch.distributed: Connection closed by peer), and rank … "
     "cannot go on without it …", _peer_lost),
    ("<run>/tasks.json was changed after the command that wrote it …", _edited_tasks),
    ("<file> line …: gold … of yes/no task … is not Yes or No …", _maybe_gold),
    ("trainer.devices=-1 means every GPU, and trainer.accelerator=cpu has none …", lambda: _config("trainer.devices=-1")),
    ("device=cuda but torch sees 0 CUDA GPU(s) …", _no_cuda),
    ("llasmol.generate runs once: --multirun sweeps train, evaluate and baseline …", _sweep_one_answer),
    ("logger.wandb.log_model=… needs an online run", _logger("logger=wandb", "logger.wandb.offline=true",
                                                             "logger.wandb.log_model=true")),
    ("logger=tensorboard needs the tensorboard package", _no_tensorboard),
    ("optimizer._target_=bitsandbytes.optim.PagedAdamW8bit pages its state through CUDA memory …",
     lambda: _config("optimizer=paged_adamw8bit")),
    ("trainer.strategy='deepspeed' must be auto or ddp …", lambda: _config("trainer=ddp", "trainer.strategy=deepspeed")),
    ("quantization=4bit does not shard under trainer=fsdp …", lambda: _config("model=mistral", "quantization=4bit",
                                                                              "trainer=fsdp")),
    ("optimizer._target_=bitsandbytes.optim.AdamW8bit cannot update trainer=fsdp's sharded parameters …",
     lambda: _config("trainer=fsdp", "optimizer=adamw8bit")),
    ("ckpt_path=last: no checkpoints/last.ckpt …", _no_last),
    ("ckpt_path=… is a checkpoint of objective=grpo, and this run is objective=sft …", _other_objective),
    ("adapter … was trained on the tiny model's random weights (…), but model=tiny is the pretrained demo base: pass "
     "model=tiny model.random_init=true", lambda tmp_path: _adapter_of(
         tmp_path, "llasmol/tiny-mistral (random weights, rebuilt from model.init_seed=0)")),
    ("adapter … was trained on the pretrained demo base, but model=tiny is the tiny model's random weights …",
     lambda tmp_path: _adapter_of(tmp_path, "llasmol/demo-base (pretrained, weights sha256 0123456789ab)",
                                  "model.random_init=true")),
    ("adapter … was trained on the demo base whose weights' sha256 begins …",
     lambda tmp_path: _adapter_of(tmp_path, "llasmol/demo-base (pretrained, weights sha256 0123456789ab)")),
    ("reward.custom.… cannot be imported …", _reward_function("no_such_module.fn")),
    ("reward.custom.… returned … a reward function returns a finite number", _reward_function("builtins.max")),  # max of three strings: a string
    ("corpus=… does not exist: give the file a corpus was written to (--corpus-out)", _no_corpus),
    ("<run>/rollouts is a symbolic link …", _rollouts_link),
    ("<adapter>/adapter_config.json is not valid JSON (…): the file is cut or overwritten …", _cut_adapter_config),
    ("cannot resume at the checkpoint's data position …", _data_position),
    ("ckpt_path=… was saved by a run of 2 process(es) and this one has 1 …", _launch(1, False)),
    ("… was saved under another trainer and this run is under trainer=fsdp …", _launch(2, True)),
    ("lora=large means model=llama2_13b, but model=… was given", lambda: _config("lora=large", "model=mistral")),
    ("… input … of the predictions is not in data.split=…", _not_in_split),
    ("training loss became nan …", _nan_loss),
    ("<file> changed while this run was reading it …", _data_changed),
    ("<file> line … the file was changed since the evaluation stopped; delete it to start over …", _partial_edited),
    ("unknown task … it looks like forward_synthesis but is spelt with other characters …", _look_alike),
    ("logger.wandb.save_dir=… cannot take the logger's files …", _logger_folder),
    ("WANDB_MODE='onilne' is not a W&B mode …", _wandb_mode),
    ("model=mistrall is not a choice of model: pick one of …", _command_line("model=mistrall")),
    ("trainer.max_stepz is not a setting of llasmol.train: check the spelling …", _command_line("trainer.max_stepz=3")),
    ("reward.bonus is not a setting of reward, so it would never be applied: …",
     lambda: _config("objective=grpo", "+reward.bonus=1", "paths.output_dir=/x")),
    ("callbacks.model_checkpoint.monitor=… is no metric this run logs, so no best checkpoint would be kept …",
     lambda: __import__("llasmol.train").train.check_monitor(compose_config(
         ["paths.output_dir=/x", "objective=grpo", "callbacks.model_checkpoint.monitor=val/bogus"]))),
]


def _pattern(quote: str) -> re.Pattern:
    """The quote as a pattern: `…` and a `<placeholder>` (with the spaces beside them) stand for any text."""
    return re.compile(".*?".join(map(re.escape, re.split(r"\s*(?:…|<[a-z]+>)\s*", quote))))


@pytest.mark.filterwarnings("ignore:Found missing adapter keys")
@pytest.mark.parametrize("quote, produce", ROWS, ids=[q for q, _ in ROWS])
def test_each_listed_message_is_what_the_code_says(quote, produce, request):
    assert f"`{quote}`" in PAGE, f"docs/troubleshooting.md does not quote `{quote}`"
    wanted = {name: request.getfixturevalue(name) for name in produce.__code__.co_varnames[
        :produce.__code__.co_argcount]}
    with pytest.raises(UserError) as err:
        produce(**wanted)
    message = str(err.value)
    assert "\n" not in message
    assert _pattern(quote).search(message), f"the page quotes `{quote}`; the code says:\n{message}"


def test_a_quote_the_code_does_not_say_fails():
    assert not _pattern("ckpt=… holds no adapter").search("ckpt=x has no adapter")
    assert _pattern("cannot write <file>: no space").search("cannot write /a/b.json: no space left")
