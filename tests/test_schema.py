"""The typed schema of every command's settings (`llasmol.core.schema`): it covers what the configs hold, refuses
hostile values in one line, resolves interpolations first, and runs before anything is written."""

from __future__ import annotations

import dataclasses
import os
import re
import typing

import pytest
from omegaconf import OmegaConf

from conftest import compose_config
from refusals import refused, refused_cli

from llasmol.core import schema
from llasmol.core.errors import UserError
from llasmol.core.schema import COMMANDS, check_config, resolved
from llasmol.core.tasks import SMOLINSTRUCT

# What each command composes, by its choices that add settings (a quantised base, a real base's recipe).
COMPOSITIONS = [("train", []), ("train", ["objective=grpo"]), ("train", ["model=mistral", "quantization=4bit"]), ("train", ["lora=large"]), ("train", ["trainer=fsdp"]),
                ("train", ["experiment=demo_ablation"]), ("params", []), ("evaluate", ["ckpt=none"]), ("evaluate", ["model=mistral", "ckpt=none"]),
                ("generate", []), ("baseline", ["method=rdkit"]), ("audit", []), ("export", ["ckpt=/r", "output=/o"]),
                ("train", ["data=custom", "data.path=/x.csv", "+data.weights.custom=2", "+data.new_tasks.custom={family: number, "
                           "headline: rmse, answer_tag: PIC50, input_kind: smiles, pooled: false, query: 'pIC50 of <INPUT>?', "
                           "response: '<OUTPUT>', num_beams: 4, num_return_sequences: 1, max_new_tokens: 16, "
                           "early_stopping: false}"])]
# Settings the schema bounds that no shipped config sets: Lightning arguments a user adds (+trainer.limit_...), a
# task's own reward weight (+reward.tasks.<task>.<term>).
ADDED_BY_USERS = {"trainer.limit_train_batches", "trainer.limit_val_batches", "trainer.accumulate_grad_batches",
                  "reward.tasks.*.*", "reward.custom.*.*"}


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
                inner = typing.get_args(arg)[1]
                nested = any(typing.get_origin(a) is dict for a in (typing.get_args(inner) or (inner,)))
                # or of mappings of numbers (reward.families.<family>.<term>)
                keys.add(f"{key}.*.*" if nested else f"{key}.*")
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
    key = re.sub(r"^(generation\.tasks|data\.new_tasks|reward\.families|reward\.tasks)\.[^.]+\.", r"\1.*.", key)
    entry = re.sub(r"\.[^.]+$", ".*", key)  # an entry of a mapping of numbers (data.max_samples_per_task)
    return entry if key not in known and entry in known else key


@pytest.mark.parametrize("command,overrides", COMPOSITIONS, ids=lambda x: x if isinstance(x, str) else " ".join(x))
def test_every_number_a_command_reads_has_a_type_and_bounds(command, overrides):
    cfg = compose_config([*overrides, "paths.output_dir=/x"] if command not in ("generate", "export") else overrides,
                         command)
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
        cfg = compose_config([*overrides, "paths.output_dir=/x"] if command not in ("generate", "export") else overrides,
                             command)

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


@pytest.mark.parametrize("command,override,named", [
    # Sizes that cannot fit: one line before any allocation.
    ("train", "lora.r=1099511627776", "lora.r=1099511627776"),
    ("evaluate", "generation.default.num_beams=200000", "generation.default.num_beams=200000"),
    ("train", "data.max_length=1e9", "data.max_length=1000000000.0"),
    ("evaluate", "intervals.resamples=2000000000", "intervals.resamples=2000000000"),
    # Strict types: a boolean is a boolean, a list is not read letter by letter.
    ("train", "scoring.lenient_formulas=maybe", "scoring.lenient_formulas='maybe'"),
    ("evaluate", "merge_adapter=1", "merge_adapter=1"),
    ("generate", "merge_adapter=maybe", "merge_adapter='maybe'"),
    # Names from a short list: the device, and the cross-field rules of evaluate.
    ("evaluate", "device=gpu0", ["device='gpu0'", "cuda:<n>"]),
    ("generate", "device=cuda:x", ["device='cuda:x'", "cuda:<n>"]),
    ("generate", "device=cuda:1", None),
    ("evaluate", "ckpt=null", ["predictions=<file.jsonl>", "ckpt=none"]),
    ("evaluate", ("prompting=galactica", "prompting.shots=3"), ["prompting.shots=3", "prompting.style=galactica",
                                                            "prompting.shots=0"]),
    ("train", "data.tasks=forward_synthesis", "data.tasks='forward_synthesis'"),
    ("audit", "held_out=test", "held_out='test'"),
    ("train", "lora.targets=q", "lora.targets='q'"),
    ("train", "data.tasks=[forward_synthesis,nope]", ["'nope'", "data.tasks"]),
    ("evaluate", "+generation.tasks.nope={num_beams: 2}", ["'nope'", "generation.tasks"]),
    ("generate", "task=nope", ["'nope'", "task="]),
    # Counts that only make sense non-negative, and a run that would train nothing.
    ("evaluate", "+data.max_samples_per_task={test: -1}", "data.max_samples_per_task={'test': -1}"),
    ("train", "+trainer.limit_train_batches=0", "trainer.limit_train_batches=0"),
    # The validation callback's copies of the groups are checked as the groups are.
    ("train", "callbacks.generation_evaluator.intervals={resamples: 2000000000, seed: 0, level: 0.95}",
     "callbacks.generation_evaluator.intervals.resamples=2000000000"),
    ("train", "callbacks.generation_evaluator.seed=-5", "callbacks.generation_evaluator.seed=-5"),
    ("train", "generation.default.early_stopping=never", "generation.default.early_stopping='never'"),
    ("train", "+trainer.limit_train_batches=1.5", "trainer.limit_train_batches=1.5"),
    # Lightning's own refusals, before any model is loaded.
    ("train", "trainer.devices=0", "trainer.devices=0"),
    ("train", "+trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0"),
    ("train", "trainer.log_every_n_steps=0", "trainer.log_every_n_steps=0"),  # Lightning: % 0
    # A setting of several types names each.
    ("train", "trainer.devices=1.5", "trainer.devices=1.5"),
    # A setting that may be null says so, and what null means.
    ("train", "callbacks.generation_evaluator.samples_per_task=-1", "callbacks.generation_evaluator.samples_per_task=-1"),
    ("train", "trainer.precision=7", "trainer.precision=7"),
    ("train", "trainer.accelerator=gpux", "trainer.accelerator='gpux'"),
    ("evaluate", "pool_golds=both", "pool_golds='both'"),
    ("train", "quantization=4bit", None),  # the quantised settings of a real option pass
    ("train", "trainer.devices=auto", None),
    ("evaluate", "generation.tasks.forward_synthesis={num_beams: 5, num_return_sequences: 5}", None),  # all beams
    # Lightning reads a string of digits as the count it spells.
    ("train", 'trainer.devices="0"', "trainer.devices='0'"),
    ("train", 'trainer.devices="-5"', "trainer.devices='-5'"),
    ("train", "trainer.devices=[]", "trainer.devices=[]"),
    ("train", 'trainer.devices="2"', None),
    ("train", 'trainer.devices="0,1"', None),
    ("train", "trainer.devices=[0,2]", None),  # GPU ids: 0 is the first
    ("train", 'trainer.devices="gpu"', "trainer.devices='gpu'"),
    # The two size bounds every length and count shares: 2^20 tokens, 2^30 steps or samples (each allowed itself).
    ("train", "data.max_length=1048577", "data.max_length=1048577"),
    ("train", "data.max_length=1048576", None),
    ("train", "trainer.max_steps=1073741825", "trainer.max_steps=1073741825"),
    ("train", "trainer.max_steps=1073741824", None),
    ("train", "trainer.devices=[0,-1]", "trainer.devices=[0, -1]"),
    ("train", "+trainer.limit_train_batches=0.25", None),
    # LoRA roles: what lora.targets chooses and model.lora_targets maps are among q, k, v, o, gate, up, down.
    ("train", "lora.targets=[q,qq]", ["lora.targets", "'qq'", "gate"]),
    ("train", "optimizer.lr=1e300", ["optimizer.lr=1e+300", "<= 1000000"]),
    ("train", "optimizer.lr=1e6", None),
    ("params", "+model.lora_targets.query=x", ["model.lora_targets", "'query'"]),
    # GRPO's bounds: a clip range inside (0, 1), a KL weight from 0, no group of one.
    ("train", ("objective=grpo", "objective.epsilon=1"), ["objective.epsilon=1", "< 1"]),
    ("train", ("objective=grpo", "objective.beta=-0.1"), ["objective.beta=-0.1", ">= 0"]),
    ("train", ("objective=grpo", "objective.top_p=0"), ["objective.top_p=0", "> 0"]),
    ("train", ("objective=grpo", "objective.scale_rewards=std"), ["objective.scale_rewards='std'", "none"]),
    ("train", ("objective=grpo", "objective.num_iterations=0"), ["objective.num_iterations=0", ">= 1"]),
    ("train", ("objective=grpo", "objective.beta=0"), None),
])
def test_a_hostile_setting_is_one_line_naming_it(command, override, named):
    extra = [] if command == "generate" else ["paths.output_dir=/x"]
    overrides = [override] if isinstance(override, str) else list(override)
    if command == "evaluate" and not any(o.startswith("ckpt=") for o in overrides):
        extra.append("ckpt=none")  # something to evaluate
    cfg = compose_config([*overrides, *extra], command)
    if named is None:
        check_config(cfg)
        return
    with refused(*([named] if isinstance(named, str) else named)):
        check_config(cfg)


@pytest.mark.parametrize("override,named", [
    ("lora.r=${oc.env:LLASMOL_TEST_UNSET}", ["lora.r=${oc.env:LLASMOL_TEST_UNSET}"]),
    ("+me=${me}", ["me=${me}", "Recursive interpolation"]),
    ("lora.alpha=${no.such.key}", ["lora.alpha=${no.such.key}", "'no.such.key'"]),
    ("lora.r=???", ["lora.r", "???"]),
])
def test_an_interpolation_that_cannot_resolve_is_one_line_naming_its_key(override, named):
    os.environ.pop("LLASMOL_TEST_UNSET", None)
    with refused(*named):
        check_config(compose_config([override, "paths.output_dir=/x"]))


def test_bounds_apply_to_the_resolved_value(monkeypatch):
    monkeypatch.setenv("LLASMOL_TEST_RANK", "1099511627776")
    cfg = compose_config(["lora.r='${oc.decode:${oc.env:LLASMOL_TEST_RANK}}'", "paths.output_dir=/x"])
    with refused("lora.r=1099511627776"):
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
def test_the_command_line_is_checked_before_hydra_writes_the_run_folder(tmp_path, monkeypatch, command):
    monkeypatch.delenv("LLASMOL_TEST_UNSET", raising=False)
    setting = {"train": "lora.r", "evaluate": "intervals.level", "baseline": "n_jobs", "audit": "examples"}[command]
    extra = ["method=rdkit"] if command == "baseline" else []
    refused_cli([f"llasmol.{command}", *extra, f"{setting}=${{oc.env:LLASMOL_TEST_UNSET}}",
                 f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, f"{setting}=${{oc.env:LLASMOL_TEST_UNSET}}",
                untouched=tmp_path)


# --------------------------------------------------------------------------- each bound, both sides, checked directly
# `check_group` on plain values (no composition: microseconds each). The messages are written out as a user reads
# them; a bound written as `setting(1, 65536)` is tested at 0, 1, 65536 and 65537.


def refusal(values: dict, group: type, prefix: str = "") -> str | None:
    """The one line `check_group` says of `values`, None when it passes."""
    try:
        schema.check_group(values, group, prefix)
    except UserError as err:
        return str(err)
    return None


S = schema
SEED_MUST = "an integer >= 0 and <= 4294967295 (Lightning's seed_everything takes 0 to 2^32-1)"

BOUNDS = [
    # (group, field, allowed, refused, what a refused value "must be")
    (S.ModelSchema, "init_seed", [0, 7, 2**32 - 1], [-1, 2**32], "an integer >= 0 and <= 4294967295"),
    (S.LoraSchema, "r", [1, 16, 65536], [0, 65537], "an integer >= 1 and <= 65536 (the paper's LoRA rank is 16)"),
    (S.LoraSchema, "alpha", [1e-9, 0.5, 16, 1e6], [0, -1, 1000001], "a number > 0 and <= 1000000"),
    (S.LoraSchema, "dropout", [0, 0.05, 0.999], [-0.01, 1, 1.0], "a number >= 0 and < 1"),
    (S.QuantizationSchema, "bits", [None, 8], [0, 5, 9, 16], "one of 4, 8 or null (or null for an unquantised base)"),
    (S.QuantizationSchema, "quant_type", ["nf4", "fp4"], ["int4"],
     "one of nf4, fp4 (bitsandbytes' 4-bit data types; QLoRA's is nf4)"),
    (S.DataSchema, "max_length", [16, 512, 1048576], [15, 1048577],
     "an integer >= 16 and <= 1048576 (the paper's is 512 tokens; shorter than a prompt trains on nothing)"),
    (S.DataSchema, "micro_batch_size", [1, 65536], [0, 65537], "an integer >= 1 and <= 65536"),
    (S.DataSchema, "effective_batch_size", [1, 16777216], [0, 16777217], "an integer >= 1 and <= 16777216"),
    (S.DataSchema, "eval_batch_size", [None, 1, 65536], [0, 65537],
     "an integer >= 1 and <= 65536 or null (null: the micro-batch)"),
    (S.DataSchema, "num_workers", [0, 256], [-1, 257], "an integer >= 0 and <= 256"),
    (S.DataSchema, "seed", [0, 2**32 - 1], [-1, 2**32], SEED_MUST),
    (S.DataSchema, "representation", ["smiles", "selfies"], ["inchi"], "one of smiles, selfies"),
    (S.DataSchema, "split", ["train", "validation", "test"], ["dev"], "one of train, validation, test"),
    (S.BeamSchema, "num_beams", [1, 256], [0, 257], "an integer >= 1 and <= 256"),
    (S.BeamSchema, "num_return_sequences", [1, 256], [0, 257], "an integer >= 1 and <= 256"),
    (S.BeamSchema, "max_new_tokens", [1, 1048576], [0, 1048577], "an integer >= 1 and <= 1048576"),
    (S.GenerationSchema, "max_prompt_tokens", [1, 1048576], [0, 1048577], "an integer >= 1 and <= 1048576"),
    (S.GenerationSchema, "max_new_tokens_limit", [None, 1, 1048576], [0, 1048577],
     "an integer >= 1 and <= 1048576 or null"),
    (S.GenerationSchema, "batch_size", [1, 65536], [0, 65537], "an integer >= 1 and <= 65536"),
    (S.IntervalsSchema, "resamples", [0, 100000], [-1, 100001],
     "an integer >= 0 and <= 100000 (0 turns intervals off; 1000 is the default)"),
    (S.IntervalsSchema, "seed", [0, 2**32 - 1], [-1, 2**32], SEED_MUST),
    (S.IntervalsSchema, "level", [1e-6, 0.95, 0.999999], [0, 1, 0.0, 1.0, float("nan")],
     "a number > 0 and < 1 (0.95 for 95% intervals)"),
    (S.PromptingSchema, "shots", [0, 64], [-1, 65], "an integer >= 0 and <= 64"),
    (S.PromptingSchema, "seed", [0, 2**32 - 1], [-1, 2**32], SEED_MUST),
    (S.OptimizerSchema, "lr", [1e-9, 1e-4, 3, 1e6], [0, -1e-4, 1.000001e6, float("inf"), float("nan")],
     "a number > 0 and <= 1000000 (the paper's is 1e-4)"),
    (S.OptimizerSchema, "weight_decay", [0, 0.01], [-0.01], "a number >= 0"),
    (S.SchedulerSchema, "num_warmup_steps", [0, 1073741824], [-1, 1073741825], "an integer >= 0 and <= 1073741824"),
    (S.TrainerSchema, "accelerator", ["auto", "cpu", "gpu", "cuda", "mps", "tpu"], ["gpux"],
     "one of auto, cpu, gpu, cuda, mps, tpu"),
    (S.TrainerSchema, "num_nodes", [1, 65536], [0, 65537], "an integer >= 1 and <= 65536"),
    # Lightning's names, ints and strings (16 and "16" said once).
    (S.TrainerSchema, "precision", [64, 32, 16, "64", "16", "bf16", "bf16-mixed", "32-true"], [8, 65, "fp8"],
     "one of transformer-engine, transformer-engine-float16, 16-true, 16-mixed, bf16-true, bf16-mixed, 32-true, "
     "64-true, 64, 32, 16, bf16"),
    (S.TrainerSchema, "max_steps", [-1, 1, 1073741824], [0, -2, 1073741825],
     "an integer >= 1 and <= 1073741824 or -1 (-1 trains for trainer.max_epochs)"),
    (S.TrainerSchema, "max_epochs", [None, -1, 1, 1073741824], [0, -2, 1073741825],
     "an integer >= 1 and <= 1073741824 or -1 or null"),
    (S.TrainerSchema, "gradient_clip_val", [None, 1e-9, 0.5], [0, -1], "a number > 0 or null"),
    (S.TrainerSchema, "accumulate_grad_batches", [1, 65536], [0, 65537], "an integer >= 1 and <= 65536"),
    (S.TrainerSchema, "log_every_n_steps", [1, 50], [0], "an integer >= 1"),
    (S.TrainerSchema, "deterministic", [True, False, "warn"], ["yes", 1], "one of True, False, warn"),
    (S.GenerationEvaluatorSchema, "samples_per_task", [None, 0, 1073741824], [-1, 1073741825],
     "an integer >= 0 and <= 1073741824 or null (null: every validation sample)"),
    (S.GenerationEvaluatorSchema, "seed", [0, 2**32 - 1], [-1, 2**32], SEED_MUST),
    (S.BestCheckpointSchema, "save_top_k", [-1, 0, 1073741824], [-2, 1073741825],
     "an integer >= -1 and <= 1073741824 (-1 keeps every validated adapter)"),
    (S.ResumeCheckpointSchema, "save_top_k", [-1, 0], [-2], "an integer >= -1 and <= 1073741824"),
    (S.ResumeCheckpointSchema, "every_n_train_steps", [1, 1073741824], [0, 1073741825],
     "an integer >= 1 and <= 1073741824"),
    (S.MorganSchema, "radius", [0, 2, 16], [-1, 17], "an integer >= 0 and <= 16 (ECFP4 is radius 2)"),
    # 8 bits to a byte: 8 is the smallest, 2^20 the largest, 2^20 + 8 past it.
    (S.MorganSchema, "n_bits", [8, 2048, 1048576], [0, 12, 2047, 1048584],
     "an integer >= 8 and <= 1048576, a multiple of 8 (the default is 2048)"),
    (S.FingerprintSchema, "n_estimators", [1, 100000], [0, 100001], "an integer >= 1 and <= 100000"),
    (S.FingerprintSchema, "min_samples_leaf", [1], [0], "an integer >= 1"),
    (S.NearestNeighborSchema, "max_train_inputs", [None, 1], [0],
     "an integer >= 1 or null (null indexes every training input)"),
    (S.NearestNeighborSchema, "table_rows", [1, 16777216], [0, 16777217], "an integer >= 1 and <= 16777216"),
    (S.CpuSchema, "threads", [None, 1, 1024], [0, 1025],
     "an integer >= 1 and <= 1024 or null (null: one per core this process may use)"),
    (S.CpuSchema, "wait_policy", ["auto", "passive", "active", "inherit"], ["spin"],
     "one of auto, passive, active, inherit (auto: spin briefly, on the cores other work leaves free; passive: a "
     "waiting thread sleeps; inherit: OMP_WAIT_POLICY as it is)"),
    (S.CommandSchema, "seed", [0, 2**32 - 1], [-1, 2**32], SEED_MUST),
    (S.CommandSchema, "first_job", [0, 1073741824], [-1, 1073741825], "an integer >= 0 and <= 1073741824"),
    (S.TrainSchema, "val_every_n_steps", [1, 1073741824], [0, 1073741825], "an integer >= 1 and <= 1073741824"),
    (S.TrainSchema, "checkpoint_every_n_steps", [1, 1073741824], [0, 1073741825],
     "an integer >= 1 and <= 1073741824"),
    (S.EvaluateSchema, "progress_every_s", [0, 0.5, 30], [-1, -0.5],
     "a number >= 0 (seconds between progress lines in the log; 0: after every batch)"),
    (S.EvaluateSchema, "pool_golds", ["file", "split"], ["both"], "one of file, split (file: the samples of the "
     "predictions file; split: every sample of data.split, as the official scorer reads them)"),
    (S.BaselineSchema, "n_jobs", [1, 1024], [0, 1025], "an integer >= 1 and <= 1024"),
    (S.AuditSchema, "examples", [0, 1073741824], [-1, 1073741825], "an integer >= 0 and <= 1073741824"),
    (S.AuditSchema, "workers", [None, 1, 1024], [0, 1025], "an integer >= 1 and <= 1024 or null (null: one per CPU, "
     "at most 8)"),
]


@pytest.mark.parametrize("group,name,allowed,refused,must", BOUNDS, ids=[f"{b[0].__name__}.{b[1]}" for b in BOUNDS])
def test_each_bound_allows_its_edge_and_refuses_one_past_it(group, name, allowed, refused, must):
    for value in allowed:
        assert refusal({name: value}, group) is None, (name, value)
    for value in refused:
        assert refusal({name: value}, group, "g.") == f"g.{name}={value!r} must be {must}", (name, value)


def test_a_value_of_the_wrong_type_names_the_type_it_must_be():
    # Strict: a boolean is no integer nor number, an integer is a number, a string no list, a mapping's values typed.
    assert refusal({"micro_batch_size": True}, S.DataSchema) == "micro_batch_size=True must be an integer >= 1 and <= 65536"
    assert refusal({"micro_batch_size": 2.5}, S.DataSchema) == "micro_batch_size=2.5 must be an integer >= 1 and <= 65536"
    assert refusal({"lr": True}, S.OptimizerSchema) == "lr=True must be a number > 0 and <= 1000000 (the paper's is 1e-4)"
    assert refusal({"lr": "1e-4"}, S.OptimizerSchema) == ("lr='1e-4' must be a number > 0 and <= 1000000 (the paper's "
                                                          "is 1e-4)")
    assert refusal({"lr": 1}, S.OptimizerSchema) is None
    for value in ("maybe", 1, None):
        assert refusal({"lenient_formulas": value}, S.ScoringSchema) == f"lenient_formulas={value!r} must be true or false"
    assert refusal({"lenient_formulas": False}, S.ScoringSchema) is None
    assert refusal({"name": 3}, S.ModelSchema) == "name=3 must be a string"
    assert refusal({"hf_id": 3}, S.ModelSchema) == "hf_id=3 must be a string or null"
    assert refusal({"hf_id": None, "name": "tiny", "arch": "llama"}, S.ModelSchema) is None
    assert refusal({"targets": "q"}, S.LoraSchema) == "targets='q' must be a list of strings ([a,b])"
    assert refusal({"targets": ["q", 1]}, S.LoraSchema) == "targets=['q', 1] must be a list of strings ([a,b])"
    assert refusal({"targets": ["q", "v"]}, S.LoraSchema) is None and refusal({"targets": []}, S.LoraSchema) is None
    assert refusal({"splits": "train"}, S.DataSchema) == "splits='train' must be a mapping"
    assert refusal({"splits": {"train": 1}}, S.DataSchema) == "splits.train=1 must be a string"  # the entry named
    assert refusal({"splits": {1: "train"}}, S.DataSchema) == "splits={1: 'train'} must be a mapping"
    assert refusal({"splits": {"train": "train", "validation": "dev"}}, S.DataSchema) is None
    assert refusal({"lora": "large"}, S.TrainSchema) == "lora='large' must be a group of settings"
    # A setting of several types names each, and says null only where null is allowed.
    assert refusal({"devices": 1.5}, S.TrainerSchema) == (
        "devices=1.5 must be an integer or a string or a list of integers ([a,b])")
    assert refusal({"max_features": True}, S.FingerprintSchema) == (
        "max_features=True must be a string or an integer or a number or null")
    # A long list is shown cut at 80 characters, in one line.
    long = list(range(40))
    said = refusal({"held_out": long}, S.AuditSchema)
    assert said == f"held_out={str(long)[:80]} must be a list of strings ([a,b])" and len(str(long)) > 80


def test_a_value_left_for_hydras_run_or_a_setting_left_out_is_not_checked():
    assert refusal({"r": schema._UNRESOLVED}, S.LoraSchema) is None
    assert refusal({"r": schema._UNRESOLVED, "alpha": 0}, S.LoraSchema) == "alpha=0 must be a number > 0 and <= 1000000"
    assert refusal({}, S.TrainSchema) is None  # a key its schema has and the config lacks is not checked
    # a key only the config has would never be applied: refused (issue 69), with the group's settings named
    assert refusal({"not_a_field": -5}, S.LoraSchema).startswith("not_a_field is not a setting")


def test_groups_inside_groups_are_checked_with_their_full_key():
    assert refusal({"lora": {"r": 0}}, S.TrainSchema) == (
        "lora.r=0 must be an integer >= 1 and <= 65536 (the paper's LoRA rank is 16)")
    assert refusal({"lora": {"r": 8}, "data": {"max_samples_per_task": {"test": 5}}}, S.TrainSchema) is None
    tasks = {"retrosynthesis": {"num_beams": 0}}
    assert refusal({"generation": {"tasks": tasks}}, S.EvaluateSchema) == (
        "generation.tasks.retrosynthesis.num_beams=0 must be an integer >= 1 and <= 256")
    assert refusal({"generation": {"tasks": {"forward_synthesis": {"num_beams": 5, "num_return_sequences": 5}}}},
                   S.EvaluateSchema) is None
    assert refusal({"callbacks": {"generation_evaluator": {"intervals": {"level": 1.0}}}}, S.TrainSchema) == (
        "callbacks.generation_evaluator.intervals.level=1.0 must be a number > 0 and < 1 (0.95 for 95% intervals)")


@pytest.mark.parametrize("value,said", [
    (1, None), (2, None), (-1, None), ("2", None), ("-1", None), (" 3 ", None), ("auto", None), ("0,1", None),
    ("0,1,", None), ([0], None), ([0, 2], None),
    (0, "devices=0 must be a count of devices >= 1 (or -1: every GPU)"),
    (-2, "devices=-2 must be a count of devices >= 1 (or -1: every GPU)"),
    ("0", "devices='0' must be a count of devices >= 1 (or -1: every GPU)"),
    ("gpu", "devices='gpu' must be auto, a count or ids"),
    ("auto,0", "devices='auto,0' must be auto, a count or ids"),
    ([], "devices=[] must list at least one device id"),
    ([0, -1], "devices=[0, -1] must list device ids >= 0"),
])
def test_trainer_devices_takes_what_lightning_takes(value, said):
    assert refusal({"devices": value}, S.TrainerSchema) == said


def test_limit_batches_take_a_count_or_a_fraction_and_training_needs_at_least_one_batch():
    train = "must be a count >= 1 or a fraction of the epoch in (0, 1]: 0 trains nothing and would save an untrained adapter"
    for value in (1, 7, 0.25, 1.0):
        assert refusal({"limit_train_batches": value}, S.TrainerSchema) is None, value
    for value in (0, -1, 0.0, 1.5):
        assert refusal({"limit_train_batches": value}, S.TrainerSchema) == f"limit_train_batches={value!r} {train}"
    for value in (0, 3, 0.0, 0.5, 1.0):  # validation may be off
        assert refusal({"limit_val_batches": value}, S.TrainerSchema) is None, value
    for value in (-1, -0.5, 1.5):
        assert refusal({"limit_val_batches": value}, S.TrainerSchema) == (
            f"limit_val_batches={value!r} must be a count >= 0 or a fraction in [0, 1]")


def test_max_features_takes_sklearns_names_a_count_or_a_fraction():
    for value in (None, "sqrt", "log2", 1, 5, 0.5, 1.0):
        assert refusal({"max_features": value}, S.FingerprintSchema) is None, value
    for value in (0, 0.0, 1.5, "auto"):
        assert refusal({"max_features": value}, S.FingerprintSchema) == (
            f"max_features={value!r} must be sqrt, log2, null (every bit), a count >= 1 or a fraction in (0, 1]")


def test_text_ngrams_is_a_pair_low_to_high():
    for pair in ([3, 5], [1, 1], [2, 2]):
        assert refusal({"text_ngrams": pair}, S.NearestNeighborSchema) is None, pair
    for pair in ([0, 2], [3, 2], [1, 2, 3], [4]):
        assert refusal({"text_ngrams": pair}, S.NearestNeighborSchema) == (
            f"text_ngrams={pair} must be two integers [low, high] with 1 <= low <= high, e.g. [3,5]")


def test_samples_per_task_caps_are_whole_numbers_from_one():
    for caps in (None, {"test": 1}, {"validation": 8, "test": 50}):
        assert refusal({"max_samples_per_task": caps}, S.DataSchema) is None, caps
    for caps, bad in (({"test": 0}, "test=0"), ({"train": 5, "test": -1}, "test=-1")):
        assert refusal({"max_samples_per_task": caps}, S.DataSchema, "data.") == (
            f"data.max_samples_per_task={caps} must give each split's samples per task as a whole number >= 1, not {bad}")
    assert refusal({"max_samples_per_task": {"test": True}}, S.DataSchema) == (
        "max_samples_per_task.test=True must be an integer")


def test_task_names_are_checked_where_they_are_given():
    assert refusal({"tasks": None}, S.DataSchema) is None
    assert refusal({"tasks": ["forward_synthesis", "retrosynthesis"]}, S.DataSchema) is None
    assert refusal({"tasks": ["nope"]}, S.DataSchema).startswith("unknown task 'nope' in data.tasks")
    assert refusal({"tasks": {"nope": {"num_beams": 2}}}, S.GenerationSchema).startswith(
        "unknown task 'nope' in generation.tasks")
    assert refusal({"task": "nope"}, S.GenerateSchema).startswith("unknown task 'nope' in task= (or leave task out")
    for values in ({"task": None}, {"task": "forward_synthesis"}, {}):
        assert refusal(values, S.GenerateSchema) is None, values


def test_beam_search_returns_at_most_one_sequence_per_beam():
    why = "beam search returns at most one sequence per beam"
    for default in ({"num_beams": 4}, {"num_beams": 5, "num_return_sequences": 5}, {"num_beams": 5, "num_return_sequences": 1}):
        assert refusal({"default": default}, S.GenerationSchema) is None, default
    assert refusal({"default": {"num_beams": 4, "num_return_sequences": 5}}, S.GenerationSchema) == (
        f"generation.default.num_return_sequences=5 exceeds its num_beams=4: {why}")
    tasks = {"forward_synthesis": {"num_beams": 8, "num_return_sequences": 5},
             "retrosynthesis": {"num_beams": 2, "num_return_sequences": 3}}
    assert refusal({"default": {"num_beams": 4, "num_return_sequences": 1}, "tasks": tasks}, S.GenerationSchema) == (
        f"generation.tasks.retrosynthesis.num_return_sequences=3 exceeds its num_beams=2: {why}")


def test_model_hf_without_its_folder_is_named():
    assert refusal({"arch": None}, S.ModelSchema) == (
        "model.path is not set: model=hf reads the base from a local folder, model.path=<folder with its config.json, "
        "tokenizer files and *.safetensors> (a listed model names model.arch, a bundled architecture)")
    assert refusal({"arch": "llama"}, S.ModelSchema) is None and refusal({"name": "tiny"}, S.ModelSchema) is None


def test_a_lora_variant_that_names_its_base_refuses_another():
    large = {"name": "large", "base": "llama2_13b"}
    assert refusal({"lora": large, "model": {"name": "mistral"}}, S.TrainSchema) == (
        "lora=large means model=llama2_13b, but model=mistral was given: drop model=mistral (lora=large chooses "
        "llama2_13b itself), or use lora=full with model=mistral")
    for values in ({"lora": large, "model": {"name": "llama2_13b"}}, {"lora": {"name": "full", "base": None},
                   "model": {"name": "mistral"}}, {"lora": large}, {"model": {"name": "mistral"}}):
        assert refusal(values, S.TrainSchema) is None, values


def test_bounds_describe_themselves_and_allow_exactly_what_they_say():
    B = schema.Bounds
    assert B(choices=(16, "16", 32)).describe() == "one of 16, 32"
    assert B(low=1, high=10).describe() == ">= 1 and <= 10"
    assert B(low=0, low_open=True, high=1, high_open=True).describe() == "> 0 and < 1"
    assert B(low=0.5).describe() == ">= 0.5" and B(high=1e6).describe() == "<= 1000000"
    assert B(low=1e-4).describe() == ">= 0.0001"
    assert B(low=8, multiple_of=8).describe() == ">= 8, a multiple of 8"
    assert B(low=1, also=(-1,)).describe() == ">= 1 or -1" and B().describe() == ""
    # Inclusive unless said open; `also` outside the range; non-finite numbers never.
    assert B(low=1).allows(1) and not B(low=1).allows(0) and B(low=1).allows(2)
    assert B(high=1).allows(1) and not B(high=1).allows(2) and B(high=1).allows(0)
    assert not B(low=0, low_open=True).allows(0) and B(low=0, low_open=True).allows(0.5)
    assert not B(high=1, high_open=True).allows(1) and B(high=1, high_open=True).allows(0.5)
    assert B(low=1, also=(-1,)).allows(-1) and not B(low=1, also=(-1,)).allows(-2)
    assert B(choices=(4, 8)).allows(8) and not B(choices=(4, 8)).allows(5)
    assert B().allows(3) and B().allows(1.5) and not B().allows(float("nan")) and not B().allows(float("-inf"))
    assert B(multiple_of=8).allows(16) and not B(multiple_of=8).allows(12) and B().allows(12)
    with pytest.raises(dataclasses.FrozenInstanceError):  # one Bounds serves every use of its field
        B().low = 3


def test_fits_is_strict_and_any_takes_anything():
    assert schema._fits(object(), typing.Any) and schema._fits(None, typing.Optional[int])
    assert not schema._fits("x", typing.Optional[int]) and schema._fits(3, typing.Optional[int])


def test_check_config_resolves_drops_hydras_node_and_returns_the_values():
    cfg = OmegaConf.create({"task_name": "audit", "examples": "${workers}", "workers": 3, "held_out": ["test"],
                            "hydra": {"run": {"dir": "/x"}}})
    values, tasks = check_config(cfg)
    assert values == {"task_name": "audit", "examples": 3, "workers": 3, "held_out": ["test"]} and tasks is SMOLINSTRUCT
    with refused("examples=-1"):
        check_config(OmegaConf.create({"task_name": "audit", "examples": -1}))
    with refused("task_name='nope'", "train, params, evaluate, generate, baseline, audit"):
        check_config(OmegaConf.create({"task_name": "nope"}))


def test_resolved_names_the_setting_that_cannot_resolve():
    assert resolved(OmegaConf.create({"a": [1, "${b}", {"c": "${b}"}], "b": 2})) == {"a": [1, 2, {"c": 2}], "b": 2}
    with refused("g.a", "???", "g.a=<value>"):
        resolved(OmegaConf.create({"g": {"a": "???"}}))
    # A setting that refers to a `???`: the `???` one is named, not the one referring to it.
    with refused("m.name", "???", "m.name=<value>") as seen:
        resolved(OmegaConf.create({"x": "${m.name}", "m": {"name": "???"}}))
    assert "x=" not in seen.message and "${m.name}" not in seen.message
    # OmegaConf's reason is its first line, cut at 160 characters.
    name = "LLASMOL_TEST_UNSET_" + "X" * 200
    os.environ.pop(name, None)
    raw = "${oc.env:" + name + "}"
    whole = f"KeyError raised while resolving interpolation: \"Environment variable '{name}' not found\""
    with refused(f"a={raw}", whole[:160]) as seen:
        resolved(OmegaConf.create({"a": raw}))
    assert whole not in seen.message  # cut


def test_once_hydra_runs_the_run_folder_is_resolved_and_checked():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from llasmol.core.config import CONFIG_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra.run.dir=/runs/a"], return_hydra_config=True)
    cfg.hydra.runtime.output_dir = "/runs/a"  # what Hydra sets as its run starts
    try:
        HydraConfig.instance().set_config(cfg)
        values = check_config(cfg).values
    finally:
        HydraConfig.instance().cfg = None
    assert values["paths"]["output_dir"] == "/runs/a" and "hydra" not in values
    assert values["callbacks"]["model_checkpoint"]["dirpath"] == "/runs/a/checkpoints"


def test_a_new_setting_of_several_types_is_bounded_only_as_a_number():
    """For a schema a later setting may need (a name or a count, a name or a mapping): bounds compare numbers only,
    only a mapping of groups is checked group by group, and an optional one as well."""

    @dataclasses.dataclass
    class Later:
        size: typing.Union[int, str] = schema.setting(1, 10)
        table: typing.Union[str, typing.Dict[str, int]] = schema.setting()
        beams: typing.Optional[typing.Dict[str, schema.BeamSchema]] = schema.setting()

    assert refusal({"size": "auto", "table": {"a": 1}}, Later) is None
    assert refusal({"size": 5, "table": "plain"}, Later) is None
    assert refusal({"size": 11}, Later) == "size=11 must be an integer or a string >= 1 and <= 10"
    assert refusal({"beams": None}, Later) is None
    assert refusal({"beams": {"x": {"num_beams": 0}}}, Later) == "beams.x.num_beams=0 must be an integer >= 1 and <= 256"


def test_a_4bit_base_needs_every_4bit_setting_and_the_library_restates_none():
    four = {"bits": 4, "quant_type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    assert refusal(four, S.QuantizationSchema) is None and refusal({"bits": 8}, S.QuantizationSchema) is None
    for key in ("quant_type", "double_quant", "compute_dtype"):
        assert refusal({k: v for k, v in four.items() if k != key}, S.QuantizationSchema) == (
            f"quantization.bits=4 needs quantization.{key}: use quantization=4bit (nf4, double quantisation, "
            "bfloat16 compute, as QLoRA) and override from there")



@pytest.mark.parametrize("override, named", [
    ("+reward.bonus=1", ("reward.bonus is not a setting of reward", "custom, families, tasks")),
    ("+reward.family.smiles.exact=2", ("reward.family", "did you mean reward.families?")),
    ("+reward.task.forward_synthesis.exact=2", ("reward.task", "did you mean reward.tasks?")),
    ("+objective.epsilon_hi=0.3", ("objective.epsilon_hi", "did you mean objective.epsilon_high?")),
    ("+model.dtpye=float16", ("model.dtpye", "model.dtype")),
    ("+lora.rank=8", ("lora.rank",)),
    ("+data.max_len=64", ("data.max_len", "data.max_length")),
    ("+generation.tasks.forward_synthesis.beams=3", ("generation.tasks.forward_synthesis.beams",)),
    ("+callbacks.generation_evaluator.samples=3", ("callbacks.generation_evaluator.samples",)),
    ("+cpu.thread=1", ("cpu.thread", "cpu.threads")),
    ("+intervals.resample=10", ("intervals.resample", "intervals.resamples")),
    ("+scoring.strict=true", ("scoring.strict",)),
    ("+quantization.bit=4", ("quantization.bit", "quantization.bits")),
    ("+compile.enable=true", ("compile.enable", "compile.enabled")),
    ("+val_every=3", ("val_every is not a setting", "val_every_n_steps")),
])
def test_a_key_the_product_never_reads_is_one_line_in_every_group_it_owns(override, named):
    from refusals import refused

    with refused(*named, "never be applied"):
        check_config(compose_config(["paths.output_dir=/x", "objective=grpo", override]))


@pytest.mark.parametrize("override", ["+trainer.profiler=simple", "+optimizer.eps=1e-6", "+scheduler.num_cycles=0.5",
                                      "+callbacks.model_checkpoint.verbose=true"])
def test_a_group_handed_to_a_library_keeps_what_the_library_takes(override):
    check_config(compose_config(["paths.output_dir=/x", override]))


@pytest.mark.parametrize("overrides, named", [
    (["objective=grpo", "callbacks.model_checkpoint.monitor=val/bogus"], ("monitor=val/bogus", "no metric this run logs",
                                                                          "val/reward")),
    (["callbacks.model_checkpoint.monitor=val/reward"], ("monitor=val/reward", "give val/loss or")),  # SFT logs none
    (["data.tasks=[forward_synthesis]", "callbacks.model_checkpoint.monitor=val/retrosynthesis/exact_match"],
     ("val/retrosynthesis/exact_match", "val/forward_synthesis/exact_match")),  # a task this run does not train
    (["callbacks.model_checkpoint.monitor=val/forward_synthesis/rmse"], ("val/forward_synthesis/rmse",)),
    (["callbacks.model_checkpoint.monitor=val/forward_synthesis/exact_match",
      "callbacks.generation_evaluator.samples_per_task=0"], ("samples_per_task=0", "only val/loss")),
])
def test_a_best_checkpoint_monitor_that_no_metric_matches_is_one_line(overrides, named):
    from refusals import refused

    from llasmol.train import check_monitor

    with refused(*named):
        check_monitor(compose_config(["paths.output_dir=/x", *overrides]))


@pytest.mark.parametrize("overrides", [[], ["objective=grpo"], ["callbacks.model_checkpoint.monitor=null"],
                                       ["callbacks.model_checkpoint.monitor=val/forward_synthesis/exact_match_lo"],
                                       ["callbacks.model_checkpoint.monitor=val/property_prediction-esol/rmse"],
                                       ["objective=grpo", "callbacks.model_checkpoint.monitor=val/reward/retrosynthesis"],
                                       ["callbacks.model_checkpoint.monitor=train/loss"]])
def test_a_metric_the_run_logs_is_a_monitor(overrides):
    from llasmol.train import check_monitor

    check_monitor(compose_config(["paths.output_dir=/x", *overrides]))
