"""The typed schema of every command's settings (`llasmol.core.schema`): it covers what the configs hold, refuses
hostile values in one line, resolves interpolations first, and runs before anything is written."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing

import pytest
from omegaconf import OmegaConf

from conftest import HANG_TIMEOUT, compose_config

from llasmol.core import schema
from llasmol.core.errors import UserError
from llasmol.core.schema import COMMANDS, check_config, resolved

# What each command composes, by its choices that add settings (a quantised base, a real base's recipe).
COMPOSITIONS = [("train", []), ("train", ["model=mistral", "quantization=4bit"]), ("train", ["lora=large"]),
                ("train", ["experiment=demo_ablation"]), ("params", []), ("evaluate", []), ("evaluate", ["model=mistral"]),
                ("generate", []), ("baseline", ["method=rdkit"]), ("audit", [])]
# Settings the schema bounds that no shipped config sets: Lightning arguments a user adds (+trainer.limit_...).
ADDED_BY_USERS = {"trainer.limit_train_batches", "trainer.limit_val_batches", "trainer.accumulate_grad_batches"}


def schema_keys(cls: type, prefix: str = "") -> set[str]:
    """Every dotted key a schema names; a mapping of groups (generation.tasks) as `<key>.*.<field>`."""
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint = f"{prefix}{f.name}", hints[f.name]
        keys.add(key)
        args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
        for arg in args:
            if dataclasses.is_dataclass(arg):
                keys |= schema_keys(arg, f"{key}.")
            elif typing.get_origin(arg) is dict and dataclasses.is_dataclass(typing.get_args(arg)[1]):
                keys |= schema_keys(typing.get_args(arg)[1], f"{key}.*.")
            elif typing.get_origin(arg) is dict:  # a mapping of numbers, each checked by the field's rule
                keys.add(f"{key}.*")
    return keys


def numeric_leaves(cfg, prefix: str = ""):
    """(key, value) of each number the config sets itself; a copy of another group (`${generation}`) is that
    group's, checked there."""
    for key in cfg.keys():
        if prefix == "" and key == "hydra":
            continue
        raw = cfg._get_node(key)._value()
        if isinstance(raw, str) and raw.startswith("${"):
            continue
        value = cfg[key]
        if OmegaConf.is_dict(value):
            yield from numeric_leaves(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def generic(key: str, known: set[str]) -> str:
    key = re.sub(r"^generation\.tasks\.[^.]+\.", "generation.tasks.*.", key)
    entry = re.sub(r"\.[^.]+$", ".*", key)  # an entry of a mapping of numbers (data.max_samples_per_task)
    return entry if key not in known and entry in known else key


@pytest.mark.parametrize("command,overrides", COMPOSITIONS, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_every_number_a_command_reads_has_a_type_and_bounds(command, overrides):
    cfg = compose_config([*overrides, "paths.output_dir=/x"] if command != "generate" else overrides, command)
    known = schema_keys(COMMANDS[command])
    unbounded = [key for key, _ in numeric_leaves(cfg) if generic(key, known) not in known]
    assert not unbounded, f"numbers of llasmol.{command} without a schema field: {unbounded}"
    check_config(cfg)


def test_every_field_of_the_schemas_is_a_setting_some_config_holds():
    """No stale or mistyped field: each names a key of some command's composition (a group's schema serves every
    command that has the group: data.split is evaluate's and baseline's; a task's beams may set any beam field)."""
    present: set[str] = set()
    known = set().union(*(schema_keys(cls) for cls in set(COMMANDS.values())))
    for command, overrides in COMPOSITIONS:
        cfg = compose_config([*overrides, "paths.output_dir=/x"] if command != "generate" else overrides, command)

        def walk(node, prefix=""):
            for key, value in node.items():
                present.add(generic(f"{prefix}{key}", known))
                if isinstance(value, dict):
                    walk(value, f"{prefix}{key}.")
        walk(resolved(cfg))  # resolved: a copy of a group (${generation}) holds that group's keys
    present |= {k.replace("generation.default.", "generation.tasks.*.") for k in present}
    for cls in set(COMMANDS.values()):
        stale = sorted(k for k in schema_keys(cls) if k not in present and k not in ADDED_BY_USERS)
        assert not stale, f"{cls.__name__} names settings no config has: {stale}"


@pytest.mark.parametrize("command,override,expected", [
    # Sizes that cannot fit: one line before any allocation.
    ("train", "lora.r=1099511627776", "lora.r=1099511627776 must be an integer >= 1 and <= 65536"),
    ("evaluate", "generation.default.num_beams=200000", "generation.default.num_beams=200000 must be an integer >= 1"),
    ("train", "data.max_length=1e9", "data.max_length=1000000000.0 must be an integer >= 16"),
    ("evaluate", "intervals.resamples=2000000000", "intervals.resamples=2000000000 must be an integer >= 0 and <= 100000"),
    # Strict types: a boolean is a boolean, a list is not read letter by letter.
    ("train", "scoring.lenient_formulas=maybe", "scoring.lenient_formulas='maybe' must be true or false"),
    ("evaluate", "merge_adapter=1", "merge_adapter=1 must be true or false"),
    ("train", "data.tasks=forward_synthesis", "data.tasks='forward_synthesis' must be a list of strings"),
    ("audit", "held_out=test", "held_out='test' must be a list of strings"),
    ("train", "lora.targets=q", "lora.targets='q' must be a list of strings"),
    ("train", "data.tasks=[forward_synthesis,nope]", "unknown task 'nope' in data.tasks"),
    ("evaluate", "+generation.tasks.nope={num_beams: 2}", "unknown task 'nope' in generation.tasks"),
    ("generate", "task=nope", "unknown task 'nope' in task="),
    # Counts that only make sense non-negative, and a run that would train nothing.
    ("evaluate", "+data.max_samples_per_task={test: -1}", "data.max_samples_per_task={'test': -1} must give each split"),
    ("train", "+trainer.limit_train_batches=0", "trainer.limit_train_batches=0 must be a count >= 1 or a fraction"),
    # The validation callback's copies of the groups are checked as the groups are.
    ("train", "callbacks.generation_evaluator.intervals={resamples: 2000000000, seed: 0, level: 0.95}",
     "callbacks.generation_evaluator.intervals.resamples=2000000000 must be an integer >= 0 and <= 100000"),
    ("train", "callbacks.generation_evaluator.seed=-5", "callbacks.generation_evaluator.seed=-5 must be an integer >= 0"),
    ("train", "generation.default.early_stopping=never", "generation.default.early_stopping='never' must be true or false"),
    ("train", "+trainer.limit_train_batches=1.5", "trainer.limit_train_batches=1.5 must be a count >= 1"),
    # Lightning's own refusals, before any model is loaded.
    ("train", "trainer.devices=0", "trainer.devices=0 must be a count of devices >= 1"),
    ("train", "+trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0 must be an integer >= 1"),
    ("train", "trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0 must be an integer >= 1"),  # Lightning: % 0
    # A setting of several types names each.
    ("train", "trainer.devices=1.5", "trainer.devices=1.5 must be an integer or a string or a list of integers ([a,b])"),
    # A setting that may be null says so, and what null means.
    ("train", "callbacks.generation_evaluator.samples_per_task=-1", "callbacks.generation_evaluator.samples_per_task=-1 "
     "must be an integer >= 0 and <= 1073741824 or null (null: every validation sample)"),
    ("train", "trainer.precision=7", "trainer.precision=7 must be one of transformer-engine"),
    ("train", "trainer.accelerator=gpux", "trainer.accelerator='gpux' must be one of auto, cpu, gpu"),
    ("evaluate", "pool_golds=both", "pool_golds='both' must be one of file, split"),
    ("train", "quantization=4bit", None),  # the quantised settings of a real option pass
    ("train", "trainer.devices=auto", None),
    ("evaluate", "generation.tasks.forward_synthesis={num_beams: 5, num_return_sequences: 5}", None),  # all beams
    # Lightning reads a string of digits as the count it spells.
    ("train", 'trainer.devices="0"', "trainer.devices='0' must be a count of devices >= 1"),
    ("train", 'trainer.devices="-5"', "trainer.devices='-5' must be a count of devices >= 1"),
    ("train", "trainer.devices=[]", "trainer.devices=[] must list at least one device id"),
    ("train", 'trainer.devices="2"', None),
    ("train", 'trainer.devices="0,1"', None),
    ("train", "trainer.devices=[0,2]", None),  # GPU ids: 0 is the first
    ("train", 'trainer.devices="gpu"', "trainer.devices='gpu' must be auto, a count or ids"),
    # The two size bounds every length and count shares: 2^20 tokens, 2^30 steps or samples (each allowed itself).
    ("train", "data.max_length=1048577", "data.max_length=1048577 must be an integer >= 16 and <= 1048576"),
    ("train", "data.max_length=1048576", None),
    ("train", "trainer.max_steps=1073741825", "trainer.max_steps=1073741825 must be an integer >= 1 and <= 1073741824"),
    ("train", "trainer.max_steps=1073741824", None),
    ("train", "trainer.devices=[0,-1]", "trainer.devices=[0, -1] must list device ids >= 0"),
    ("train", "+trainer.limit_train_batches=0.25", None),
])
def test_a_hostile_setting_is_one_line_naming_it(command, override, expected):
    extra = [] if command == "generate" else ["paths.output_dir=/x"]
    cfg = compose_config([override, *extra], command)
    if expected is None:
        check_config(cfg)
        return
    with pytest.raises(UserError) as err:
        check_config(cfg)
    message = str(err.value)
    assert message.startswith(expected) and "\n" not in message, message


@pytest.mark.parametrize("override,expected", [
    ("lora.r=${oc.env:LLASMOL_TEST_UNSET}", "lora.r=${oc.env:LLASMOL_TEST_UNSET} cannot be resolved"),
    ("+me=${me}", "me=${me} cannot be resolved (Recursive interpolation detected)"),
    ("lora.alpha=${no.such.key}", "lora.alpha=${no.such.key} cannot be resolved (Interpolation key 'no.such.key'"),
    ("lora.r=???", "lora.r is not set (???)"),
])
def test_an_interpolation_that_cannot_resolve_is_one_line_naming_its_key(override, expected):
    os.environ.pop("LLASMOL_TEST_UNSET", None)
    with pytest.raises(UserError) as err:
        check_config(compose_config([override, "paths.output_dir=/x"]))
    assert str(err.value).startswith(expected), str(err.value)


def test_bounds_apply_to_the_resolved_value(monkeypatch):
    monkeypatch.setenv("LLASMOL_TEST_RANK", "1099511627776")
    cfg = compose_config(["lora.r='${oc.decode:${oc.env:LLASMOL_TEST_RANK}}'", "paths.output_dir=/x"])
    with pytest.raises(UserError, match=r"^lora\.r=1099511627776 must be an integer >= 1 and <= 65536"):
        check_config(cfg)
    monkeypatch.setenv("LLASMOL_TEST_RANK", "8")
    assert resolved(cfg)["lora"]["r"] == 8
    check_config(cfg)


def test_before_hydra_runs_the_run_folder_is_left_unresolved_not_refused():
    values = resolved(compose_config([]))  # paths.output_dir is ${hydra:runtime.output_dir}
    assert values["paths"]["output_dir"] is schema._UNRESOLVED
    assert values["callbacks"]["model_checkpoint"]["dirpath"] is schema._UNRESOLVED  # built on it
    assert values["lora"]["r"] == 16


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train", "evaluate", "baseline", "audit"])
def test_the_command_line_is_checked_before_hydra_writes_the_run_folder(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "LLASMOL_TEST_UNSET")}
    setting = {"train": "lora.r", "evaluate": "intervals.level", "baseline": "n_jobs", "audit": "examples"}[command]
    extra = ["method=rdkit"] if command == "baseline" else []
    proc = subprocess.run([sys.executable, "-m", f"llasmol.{command}", *extra, f"{setting}=${{oc.env:LLASMOL_TEST_UNSET}}",
                           f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=HANG_TIMEOUT)
    assert proc.returncode == 2, proc.stderr[-800:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {setting}=${{oc.env:LLASMOL_TEST_UNSET}} cannot be resolved")
    assert not (tmp_path / "run").exists()
