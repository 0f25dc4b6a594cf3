"""Every setting the commands read, with its type and the values it may take: one dataclass per config group,
one per command, written once and checked once, on the composed config with its interpolations resolved, before
anything is built or written (the command line is checked before Hydra writes the run folder's config).

The values themselves live in the YAML of `conf/`: a schema says what a setting may be, never what it is, so
nothing here restates a default. The schemas are not merged into the composition as Hydra's structured
configs are: that would add every field of a group to each of its options (the composed config would change key
by key), coerce `"true"` into a boolean, and turn a bad value into Hydra's multi-line error. A key the config has
and its schema lacks passes (Lightning's and the loggers' own arguments pass through the `trainer` and `logger`
groups); a key its schema has and the config lacks is not checked.

To add a bound: give the field a `setting(...)` in its group's dataclass below, and a case in
`tests/test_schema.py::test_a_hostile_setting_is_one_line_naming_it`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, MissingMandatoryValue, OmegaConfBaseException

from llasmol.core.errors import UserError
from llasmol.core.tasks import SMOLINSTRUCT, SMOLINSTRUCT_WEIGHT, Scoring, TaskTable, declaration_problem
from llasmol.core.threads import MAX_THREADS


@dataclass(frozen=True)
class Bounds:
    """What a number (or a choice) may be, beyond its type."""

    low: Optional[float] = None  # smallest allowed value
    low_open: bool = False  # low itself not allowed (lr > 0)
    high: Optional[float] = None  # largest allowed value
    high_open: bool = False  # high itself not allowed (dropout < 1)
    also: tuple = ()  # allowed values outside the range (max_steps=-1: by epochs)
    multiple_of: Optional[int] = None  # a multiple of this (bits packed 8 to a byte)
    choices: tuple = ()  # the only values allowed, when given
    hint: str = ""

    def describe(self) -> str:
        if self.choices:  # 16 and "16" are two of Lightning's precisions, said once
            return "one of " + ", ".join(dict.fromkeys(map(str, self.choices)))
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {_number(self.high)}")
        text = " and ".join(parts)
        if self.multiple_of:
            text += f", a multiple of {self.multiple_of}"
        return text + "".join(f" or {v}" for v in self.also)

    def allows(self, value) -> bool:
        if value in self.also:
            return True
        if self.choices:
            return value in self.choices
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return not (self.multiple_of and value % self.multiple_of)


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def setting(low: Optional[float] = None, high: Optional[float] = None, *, above: Optional[float] = None,
            below: Optional[float] = None, also: tuple = (), multiple_of: Optional[int] = None, choices: tuple = (),
            hint: str = "", rule: Optional[Callable[[Any], Optional[str]]] = None,
            task_rule: Optional[Callable[[Any, TaskTable], Optional[str]]] = None) -> Any:
    """A schema field: `low`/`high` inclusive, `above`/`below` exclusive bounds; `rule(value)` returns what is wrong
    with a value its type allows (None when nothing is); `task_rule(value, tasks)` likewise, for a setting that
    names tasks, with the task table the config declares."""
    bounds = Bounds(low if above is None else above, above is not None, high if below is None else below,
                    below is not None, tuple(also), multiple_of, tuple(choices), hint)
    return field(metadata={"bounds": bounds, "rule": rule, "task_rule": task_rule})


# Sizes past these cannot fit any machine this runs on; they stop the command before an allocation error or
# an hours-long loop (a rank of 2^40, 200,000 beams, two billion bootstrap resamples).
TOKENS = 1 << 20  # a million tokens: more than any base's context
COUNT = 1 << 30  # steps, epochs, samples: past a billion is a typo
SEED_MAX = (1 << 32) - 1  # numpy's and Lightning's seed_everything's largest seed


# --------------------------------------------------------------------------- the groups


def _arch_given(model: dict) -> Optional[str]:
    if "arch" in model and model["arch"] is None:  # model=hf takes model.path as its arch
        return ("model.path is not set: model=hf reads the base from a local folder, model.path=<folder with its "
                "config.json, tokenizer files and *.safetensors> (a listed model names model.arch, a bundled "
                "architecture)")
    return None


# The LoRA roles: what `lora.targets` chooses and `model.lora_targets` maps to a base's module names.
ROLES = ("q", "k", "v", "o", "gate", "up", "down")


def _roles_mapped(model: dict) -> Optional[str]:
    unknown = [role for role in model.get("lora_targets") or {} if role not in ROLES]
    if unknown:
        return f"model.lora_targets names {unknown[0]!r}, which is no LoRA role: the roles are {', '.join(ROLES)}"
    return None


def _roles_chosen(lora: dict) -> Optional[str]:
    unknown = [role for role in lora.get("targets") or () if role not in ROLES]
    if unknown:
        return f"lora.targets names {unknown[0]!r}, which is no LoRA role: use some of {', '.join(ROLES)}"
    return None


@dataclass
class ModelSchema:
    name: str
    hf_id: Optional[str]
    arch: Optional[str]  # null only as model=hf's unset model.path (`_arch_given`)
    tokenizer: Optional[str]
    tokenizer_legacy: Optional[bool]
    random_init: bool
    init_seed: int = setting(0, SEED_MAX)
    path: Optional[str] = setting()
    dtype: str = setting()
    trust_remote_code: bool = setting()
    prompt_template: str = setting()
    head: str = setting()
    lora_targets: Optional[Dict[str, Optional[str]]] = setting()  # null: read from the base's module names

    RULES = (_arch_given, _roles_mapped)


@dataclass
class LoraSchema:
    name: str
    targets: List[str]
    r: int = setting(1, 65536, hint="the paper's LoRA rank is 16")
    alpha: float = setting(above=0, high=1e6)
    dropout: float = setting(0, below=1)
    train_head: bool = setting()
    base: Optional[str] = setting()  # the one base a variant means (lora=large: Llama-2-13B)

    RULES = (_roles_chosen,)


def _four_bit_settings(cfg: dict) -> Optional[str]:
    """A 4-bit base is built from all of conf/quantization/4bit.yaml's settings (the library restates none)."""
    missing = [k for k in ("quant_type", "double_quant", "compute_dtype") if cfg.get(k) is None]
    if cfg.get("bits") == 4 and missing:
        return (f"quantization.bits=4 needs quantization.{missing[0]}: use quantization=4bit (nf4, double "
                "quantisation, bfloat16 compute, as QLoRA) and override from there")
    return None


@dataclass
class QuantizationSchema:
    bits: Optional[int] = setting(choices=(4, 8), hint="or null for an unquantised base")
    quant_type: str = setting(choices=("nf4", "fp4"), hint="bitsandbytes' 4-bit data types; QLoRA's is nf4")
    double_quant: bool = setting()
    compute_dtype: str = setting()

    RULES = (_four_bit_settings,)


def _split_caps(caps) -> Optional[str]:
    bad = [k for k, v in caps.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    return f"must give each split's samples per task as a whole number >= 1, not {bad[0]}={caps[bad[0]]!r}" if bad else None




def _declarations(new_tasks: dict) -> Optional[str]:
    for name, decl in new_tasks.items():
        why = declaration_problem(name, decl, new_tasks) or (_beams(decl, f"data.new_tasks.{name}") if isinstance(decl, dict)
                                                  else None)
        if why:
            return why
    return None


@dataclass
class DeclaredTasksSchema:
    """The tasks a data config declares: checked and made into the run's task table before the rest of the config
    is checked, which may name them (`check_config`)."""

    new_tasks: Optional[Dict[str, NewTaskSchema]] = setting(rule=_declarations)


def _weights(weights: dict, tasks: TaskTable) -> Optional[str]:
    for name, weight in weights.items():
        if name != SMOLINSTRUCT_WEIGHT and name not in tasks:
            return (f"data.weights names {name!r}, which is no task: name a task of data.tasks or "
                    f"{SMOLINSTRUCT_WEIGHT} (every SMolInstruct task not named)")
        if not 0 < weight <= 1000 or not math.isfinite(weight):  # a number: the type is checked first
            return (f"data.weights.{name}={weight!r} must be a number > 0 and <= 1000: how many times each of its "
                    "training samples is drawn per epoch (0.5: half of them, drawn anew each epoch)")
    return None


TABLE_COLUMNS = ("input", "output", "split", "task")  # what a CSV/JSONL source's columns are read as


def _columns(columns: dict, where: str = "data.columns") -> Optional[str]:
    for key, name in columns.items():
        if key not in TABLE_COLUMNS:
            return f"{where}.{key} is no column role: map some of {', '.join(TABLE_COLUMNS)} to your column names"
        if not name or not isinstance(name, str):  # data.columns: a string, its type checked first
            return f"{where}.{key}={name!r} must be the name of a column of your file"
    roles: dict[str, str] = {}
    for role, name in {**{r: r for r in TABLE_COLUMNS}, **columns}.items():  # a role not mapped: its own name
        if name in roles:  # one column read as two roles: its outputs would train as inputs
            return (f"{where} reads column {name!r} as both {roles[name]} and {role}: give each role a column of its "
                    f"own ({where}.{role}=<another column>)")
        roles[name] = role
    return None


def _fractions(fractions: dict, where: str = "data.split_fractions") -> Optional[str]:
    bad = [k for k, v in fractions.items() if k not in ("validation", "test") or isinstance(v, bool)
           or not isinstance(v, (int, float)) or not 0 <= v < 1]
    if bad:
        return (f"{where}.{bad[0]}={fractions[bad[0]]!r}: give validation and test each a fraction "
                ">= 0 and < 1 of the inputs (the rest trains)")
    if sum(fractions.values()) >= 1:
        return f"{where}={fractions} leaves nothing to train on: keep their sum under 1"
    return None


ALSO_PLACE = ("path", "columns", "split_fractions")  # what a place of data.also may say of itself


def _also_places(places: list) -> Optional[str]:
    """A place of data.also is a path, or a mapping of its path and its own columns and split fractions (a table
    whose column names differ from data.path's)."""
    for i, place in enumerate(places):
        if not isinstance(place, dict):
            continue
        where = f"data.also[{i}]"
        unknown = [k for k in place if k not in ALSO_PLACE]
        if unknown or not isinstance(place.get("path"), str) or not place.get("path"):
            named = f"names {unknown[0]!r}" if unknown else "has no path"
            return (f"{where} {named}: a place of data.also is a path, or {{path: <file or folder>, columns: "
                    "{input: <column>, output: <column>}, split_fractions: {validation: 0.1, test: 0.1}}")
        for key, rule in (("columns", _columns), ("split_fractions", _fractions)):
            value = place.get(key)
            if value is not None and not isinstance(value, dict):
                return f"{where}.{key}={value!r} must be a mapping, as data.{key} is"
            why = rule(value, f"{where}.{key}") if value else None
            if why:
                return why
    return None


@dataclass
class DataSchema(DeclaredTasksSchema):
    path: Optional[str] = setting()
    hub_id: Optional[str] = setting()
    revision: str = setting()
    tasks: Optional[List[str]] = setting(task_rule=lambda names, tasks: _said(tasks.check, names, "data.tasks"))
    also: Optional[List[Union[str, Dict[str, Any]]]] = setting(
        rule=_also_places, hint="more data to train beside data.path: folders or CSV/JSONL files, each a path or "
        "{path, columns, split_fractions} of its own")
    weights: Optional[Dict[str, float]] = setting(task_rule=_weights)
    columns: Optional[Dict[str, str]] = setting(rule=_columns)
    split_fractions: Optional[Dict[str, float]] = setting(rule=_fractions)
    splits: Dict[str, str] = setting()
    sample_group: str = setting()
    insert_core_tags: bool = setting()
    representation: str = setting(choices=("smiles", "selfies"))
    prompt_template: Optional[str] = setting()
    max_length: int = setting(16, TOKENS, hint="the paper's is 512 tokens; shorter than a prompt trains on nothing")
    group_by_length: bool = setting()
    packing: bool = setting()
    train_on_inputs: bool = setting()
    micro_batch_size: int = setting(1, 1 << 16)
    effective_batch_size: int = setting(1, 1 << 24)
    eval_batch_size: Optional[int] = setting(1, 1 << 16, hint="null: the micro-batch")
    # split name -> samples per task at most (data.max_samples_per_task.test=50)
    max_samples_per_task: Optional[Dict[str, int]] = setting(rule=_split_caps)
    num_workers: int = setting(0, 256)
    skip_bad_lines: bool = setting()
    seed: int = setting(0, SEED_MAX, hint="Lightning's seed_everything takes 0 to 2^32-1")
    split: str = setting(choices=("train", "validation", "test"))


@dataclass
class BeamSchema:
    num_beams: int = setting(1, 256)
    num_return_sequences: int = setting(1, 256)
    max_new_tokens: int = setting(1, TOKENS)
    early_stopping: bool = setting()  # beam_search reads it as a boolean


@dataclass
class NewTaskSchema(BeamSchema):
    """A task of the user's own (`data.new_tasks.<name>`, `llasmol.core.tasks.TaskTable`: which keys it may
    have, the family and input kind it may name, and what its tags and templates must hold, are checked there)."""

    family: str = setting()
    headline: Optional[str] = setting()
    answer_tag: Optional[str] = setting()
    input_kind: str = setting()
    pooled: bool = setting()
    query: Optional[Union[str, List[str]]] = setting()
    response: Optional[Union[str, List[str]]] = setting()


def _said(check: Callable, *args) -> Optional[str]:
    """What `check(*args)` says is wrong (its `UserError`'s message), None when nothing is: a rule built on a
    check that raises."""
    try:
        check(*args)
    except UserError as err:
        return str(err)
    return None


@dataclass
class GenerationSchema:
    default: BeamSchema
    question: BeamSchema
    tasks: Dict[str, BeamSchema] = setting(
        task_rule=lambda names, tasks: _said(tasks.check, list(names), "generation.tasks"))
    max_prompt_tokens: int = setting(1, TOKENS)
    max_new_tokens_limit: Optional[int] = setting(1, TOKENS)
    batch_size: int = setting(1, 1 << 16)


@dataclass
class IntervalsSchema:
    # Each resample redraws every sample of a task: past 100,000 the intervals stop changing and the time grows.
    resamples: int = setting(0, 100_000, hint="0 turns intervals off; 1000 is the default")
    seed: int = setting(0, SEED_MAX, hint="Lightning's seed_everything takes 0 to 2^32-1")
    level: float = setting(above=0, below=1, hint="0.95 for 95% intervals")


@dataclass
class ScoringSchema:
    lenient_formulas: bool
    lenient_booleans: bool = setting()
    strict_smiles: bool = setting()


# How `evaluate` may ask a model (conf/prompting/): SMolInstruct's own queries, or one of the query styles the
# paper wrote for bases never tuned on it (llasmol/data/untuned_queries.py holds their text).
DATASET_STYLE = "dataset"
UNTUNED_STYLES = ("icl", "galactica", "molinst")


def _shots_styled(prompting: dict) -> Optional[str]:
    shots, style = prompting.get("shots"), prompting.get("style")
    if isinstance(shots, int) and shots and style is not None and style != "icl":
        return (f"prompting.shots={shots} with prompting.style={style}: only the icl style has in-context examples "
                "(the paper asked Galactica and Molinst zero-shot); set prompting.shots=0")
    return None


@dataclass
class PromptingSchema:
    style: str = setting(choices=(DATASET_STYLE, *UNTUNED_STYLES))
    shots: int = setting(0, 64)
    rules: str = setting()
    bare_only: bool = setting()
    seed: int = setting(0, SEED_MAX, hint="Lightning's seed_everything takes 0 to 2^32-1")

    RULES = (_shots_styled,)


@dataclass
class OptimizerSchema:
    OPEN = True  # its keys go to a library's constructor, which takes more than the schema names
    # AdamW moves each weight by about lr a step, so any lr past 1 wrecks a base in a step or two and the
    # non-finite loss check says so; past float32's range (3.4e38) the update itself overflows first, a
    # traceback. A million is far past any use and far below that.
    lr: float = setting(above=0, high=1e6, hint="the paper's is 1e-4")
    weight_decay: float = setting(0)


@dataclass
class SchedulerSchema:
    OPEN = True  # its keys go to a library's constructor, which takes more than the schema names
    num_warmup_steps: int = setting(0, COUNT)


# The GRPO objective's choices (llasmol/finetune/grpo.py says what each computes).
OBJECTIVES = ("sft", "grpo")
LOSS_TYPES = ("grpo", "dr_grpo", "bnpo", "dapo")
SCALE_REWARDS = ("group", "batch", "none")
IMPORTANCE_LEVELS = ("token", "sequence")
DYNAMIC_SAMPLING = ("none", "skip", "refill")


def _reward_weights(where: str) -> Callable[[dict], Optional[str]]:
    """A rule for `reward.<where>` (family or task -> term -> weight): every weight a number from 0 up."""

    def rule(value: dict) -> Optional[str]:
        for name, terms in value.items():
            for term, weight in (terms or {}).items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
                    return f"reward.{where}.{name}.{term}={weight!r}: a weight is a number from 0 up"
        return None

    return rule


@dataclass
class RewardSchema:
    """conf/reward/: which names a family, task and term may be is the task table's and the families' to say
    (`llasmol.metrics.rewards.Rewards`, with the run's tasks); the weights are numbers from 0 up."""

    families: Dict[str, Optional[Dict[str, Any]]] = setting(rule=_reward_weights("families"))
    tasks: Dict[str, Optional[Dict[str, Any]]] = setting(rule=_reward_weights("tasks"))
    custom: Dict[str, Optional[Dict[str, Any]]] = setting()  # name -> {_target_, weight}: `Rewards` checks them


@dataclass
class ObjectiveSchema:
    name: str = setting(choices=OBJECTIVES)
    num_generations: int = setting(2, 1 << 12, hint="a group of 1 completion has nothing to be compared with")
    temperature: float = setting(above=0, high=100)
    top_p: float = setting(above=0, high=1)
    max_new_tokens: int = setting(1, TOKENS)
    loss_type: str = setting(choices=LOSS_TYPES)
    scale_rewards: str = setting(choices=SCALE_REWARDS)
    epsilon: float = setting(above=0, below=1, hint="PPO's and TRL's 0.2")
    epsilon_high: Optional[float] = setting(above=0, high=100, hint="null: epsilon; DAPO's 0.28")
    beta: float = setting(0, 1e6, hint="0: no KL term and no reference pass")
    num_iterations: int = setting(1, 1 << 10)
    importance_sampling_level: str = setting(choices=IMPORTANCE_LEVELS)
    use_bias_correction_kl: bool = setting()
    mask_truncated_completions: bool = setting()
    soft_punish_cache: int = setting(0, TOKENS, hint="0: no soft overlong punishment")
    dynamic_sampling: str = setting(choices=DYNAMIC_SAMPLING)
    max_resamples: int = setting(0, 1 << 10, hint="rounds of further prompts a micro-batch may sample")


def _devices(value) -> Optional[str]:
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)  # Lightning reads "2" as the count 2, "-1" as all of them
    if isinstance(value, int):
        return None if value >= 1 or value == -1 else "must be a count of devices >= 1 (or -1: every GPU)"
    if isinstance(value, str):
        return None if value == "auto" or re.fullmatch(r"\d+(,\d+)*,?", value) else "must be auto, a count or ids"
    if not value:
        return "must list at least one device id"
    return None if all(i >= 0 for i in value) else "must list device ids >= 0"


def _count_or_fraction(value, least: int = 1) -> bool:
    """A count of things (>= `least`), or a fraction of them as a float in (0, 1] ([0, 1] when `least` is 0):
    what Lightning's limit_*_batches and scikit-learn's max_features take."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= least
    return isinstance(value, float) and (0 <= value if least == 0 else 0 < value) and value <= 1


def _batches(value, least: int) -> Optional[str]:
    if _count_or_fraction(value, least):
        return None
    return ("must be a count >= 1 or a fraction of the epoch in (0, 1]: 0 trains nothing and would save an untrained "
            "adapter") if least else "must be a count >= 0 or a fraction in [0, 1]"


# The strategies llasmol runs and tests, as Lightning names them (trainer=ddp); trainer=fsdp is a mapping with
# its `_target_` (conf/trainer/fsdp.yaml).
STRATEGY_NAMES = ("auto", "ddp")
FSDP2_TARGET = "llasmol.finetune.distributed.FSDP2Strategy"


def is_fsdp2(strategy) -> bool:
    """Whether a trainer's `strategy` setting (plain or a config node) is trainer=fsdp's."""
    return (isinstance(strategy, dict) or OmegaConf.is_dict(strategy)) and strategy.get("_target_") == FSDP2_TARGET


def _strategy(value) -> Optional[str]:
    named = value if isinstance(value, str) else value.get("_target_")  # a preset's strategy class, or a name
    if named == FSDP2_TARGET:
        reshard = value.get("reshard_after_forward", True)
        if not isinstance(reshard, bool):  # fully_shard would take it only at the first step, a minute in
            return (f"trainer.strategy.reshard_after_forward={reshard!r} must be true (free each block's weights after "
                    "its forward) or false (keep them gathered until its backward)")
        return None
    if named not in STRATEGY_NAMES:
        return (f"must be {' or '.join(STRATEGY_NAMES)} or trainer=fsdp's {FSDP2_TARGET}: llasmol runs trainer=ddp "
                "(data parallel) and trainer=fsdp (sharded, FSDP2); DeepSpeed and Lightning's FSDP1 are not supported")
    return None


# Lightning 2.x's precision names (lightning.fabric.connector._PRECISION_INPUT), ints and strings as it takes them.
PRECISIONS = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
              "32-true", "64-true", 64, 32, 16, "64", "32", "16", "bf16")


def _cpu_devices(trainer: dict) -> Optional[str]:
    if trainer.get("accelerator") == "cpu" and str(trainer.get("devices")).strip() == "-1":
        return ("trainer.devices=-1 means every GPU, and trainer.accelerator=cpu has none: give the number of CPU "
                "processes, e.g. trainer.devices=2")
    return None


@dataclass
class TrainerSchema:
    OPEN = True  # its keys go to a library's constructor, which takes more than the schema names
    accelerator: str = setting(choices=("auto", "cpu", "gpu", "cuda", "mps", "tpu"))
    strategy: Union[str, Dict[str, Any]] = setting(rule=_strategy)
    devices: Union[int, str, List[int]] = setting(rule=_devices)
    num_nodes: int = setting(1, 1 << 16)
    precision: Union[int, str] = setting(choices=PRECISIONS)
    max_steps: int = setting(1, COUNT, also=(-1,), hint="-1 trains for trainer.max_epochs")
    max_epochs: Optional[int] = setting(1, COUNT, also=(-1,))
    gradient_clip_val: Optional[float] = setting(above=0)
    accumulate_grad_batches: int = setting(1, 1 << 16)
    log_every_n_steps: int = setting(1)
    # A run that trains no batch would save an untrained "best" adapter.
    limit_train_batches: Union[int, float] = setting(rule=lambda v: _batches(v, 1))
    limit_val_batches: Union[int, float] = setting(rule=lambda v: _batches(v, 0))
    enable_progress_bar: bool = setting()
    enable_model_summary: bool = setting()
    deterministic: Union[bool, str] = setting(choices=(True, False, "warn"))

    RULES = (_cpu_devices,)


@dataclass
class GenerationEvaluatorSchema:
    samples_per_task: Optional[int] = setting(0, COUNT, hint="null: every validation sample")
    progress_every_s: float = setting(0)  # a copy of ${progress_every_s}
    # Copies of the top-level groups (${generation}, ${intervals}, ${seed}); an override can replace them.
    generation: GenerationSchema = setting()
    intervals: IntervalsSchema = setting()
    seed: int = setting(0, SEED_MAX, hint="Lightning's seed_everything takes 0 to 2^32-1")
    output_dir: Optional[str] = setting()  # a copy of ${paths.output_dir}


@dataclass
class BestCheckpointSchema:
    OPEN = True  # its keys go to a library's constructor, which takes more than the schema names
    save_top_k: int = setting(-1, COUNT, hint="-1 keeps every validated adapter")


@dataclass
class ResumeCheckpointSchema:
    OPEN = True  # its keys go to a library's constructor, which takes more than the schema names
    save_top_k: int = setting(-1, COUNT)
    every_n_train_steps: int = setting(1, COUNT)


@dataclass
class ProgressLinesSchema:
    every_s: float = setting(0)  # a copy of ${progress_every_s}


@dataclass
class CallbacksSchema:
    OPEN = True  # its keys go to a library's constructor, which takes more than the schema names
    model_checkpoint: BestCheckpointSchema
    resume_checkpoint: ResumeCheckpointSchema
    generation_evaluator: GenerationEvaluatorSchema
    progress_lines: ProgressLinesSchema


@dataclass
class CompileSchema:
    enabled: bool
    backend: str
    mode: Optional[str]


@dataclass
class MorganSchema:
    radius: int = setting(0, 16, hint="ECFP4 is radius 2")
    n_bits: int = setting(8, 1 << 20, multiple_of=8, hint="the default is 2048")


@dataclass
class FingerprintSchema:
    n_estimators: int = setting(1, 100_000)
    min_samples_leaf: int = setting(1)
    max_features: Union[str, int, float, None] = setting(rule=lambda v: None if v in ("sqrt", "log2") or (
        _count_or_fraction(v)) else "must be sqrt, log2, null (every bit), a count >= 1 or a fraction in (0, 1]")


def _ngrams(pair) -> Optional[str]:
    if len(pair) == 2 and 1 <= pair[0] <= pair[1]:
        return None
    return "must be two integers [low, high] with 1 <= low <= high, e.g. [3,5]"


@dataclass
class NearestNeighborSchema:
    text_ngrams: List[int] = setting(rule=_ngrams)
    max_train_inputs: Optional[int] = setting(1, hint="null indexes every training input")
    table_rows: int = setting(1, 1 << 24)


# --------------------------------------------------------------------------- the commands


def _lora_base(cfg: dict) -> Optional[str]:
    """`lora=large` is Llama-2-13B: a LoRA variant that names its base refuses another."""
    base, model = (cfg.get("lora") or {}).get("base"), (cfg.get("model") or {}).get("name")
    if base is not None and model is not None and model != base:
        name = cfg["lora"].get("name")
        return (f"lora={name} means model={base}, but model={model} was given: drop model={model} "
                f"(lora={name} chooses {base} itself), or use lora=full with model={model}")
    return None


def _sharded_quantization(cfg: dict) -> Optional[str]:
    """bitsandbytes' packed 4-bit and 8-bit weights carry their quantisation state beside the tensor, which FSDP2's
    dim-0 shards do not keep: a quantised base does not shard (tried on torch 2.13 and bitsandbytes 0.50)."""
    strategy = (cfg.get("trainer") or {}).get("strategy")
    bits = (cfg.get("quantization") or {}).get("bits")
    if bits and is_fsdp2(strategy):
        return (f"quantization={bits}bit does not shard under trainer=fsdp (bitsandbytes' quantised weights keep their "
                f"scales outside the tensor FSDP2 splits): use trainer=ddp with quantization={bits}bit (every GPU holds "
                "the whole quantised base, 3.8 GiB for Mistral-7B in 4 bits), or trainer=fsdp with quantization=none")
    return None


def _optimizer_runs_here(cfg: dict) -> Optional[str]:
    """The optimizer against the trainer (conf/optimizer/ says what each is): bitsandbytes' update takes plain
    tensors, so FSDP2's DTensor shards would stop the first step with "does not have a sharding strategy
    registered" (torch 2.13, bitsandbytes 0.50); a paged one pages through CUDA memory, and on a CPU bitsandbytes
    would quietly run the unpaged one instead."""
    trainer = cfg.get("trainer") or {}
    target = str((cfg.get("optimizer") or {}).get("_target_", ""))
    if target.startswith("bitsandbytes.") and is_fsdp2(trainer.get("strategy")):
        return (f"optimizer._target_={target} cannot update trainer=fsdp's sharded parameters (bitsandbytes has no "
                "rule for FSDP2's DTensors): add optimizer=adamw (torch's AdamW), or use trainer=ddp")
    name = target.rsplit(".", 1)[-1]
    if target.startswith("bitsandbytes.") and name.startswith("Paged") and trainer.get("accelerator") == "cpu":
        return (f"optimizer._target_={target} pages its state through CUDA memory and trainer.accelerator=cpu has "
                f"none: use optimizer=adamw8bit (bitsandbytes.optim.{name.removeprefix('Paged')}, the same update, "
                "unpaged)")
    return None


@dataclass
class CpuSchema:
    threads: Optional[int] = setting(1, MAX_THREADS, hint="null: one per core this process may use")
    wait_policy: str = setting(choices=("auto", "passive", "active", "inherit"),
                               hint="auto: spin briefly, on the cores other work leaves free; passive: a waiting "
                                    "thread sleeps; inherit: OMP_WAIT_POLICY as it is")


@dataclass
class CommandSchema:
    """What every command has (conf/shared.yaml): the one seed, and a multirun's first job number."""

    EXTRA = ("logger", "paths", "task_name")  # read by Hydra and the frame, not settings of the command

    seed: int = setting(0, SEED_MAX, hint="Lightning's seed_everything takes 0 to 2^32-1")
    first_job: int = setting(0, COUNT)


@dataclass
class ModelCommandSchema(CommandSchema):
    """The groups of a command that loads a base and generates with it."""

    model: ModelSchema = setting()
    quantization: QuantizationSchema = setting()
    generation: GenerationSchema = setting()
    cpu: CpuSchema = setting()


def _objective_data(cfg: dict) -> Optional[str]:
    """GRPO's training batches are prompts alone: packing prompts and answers into one row has nothing to pack."""
    if (cfg.get("objective") or {}).get("name") == "grpo" and (cfg.get("data") or {}).get("packing"):
        return ("data.packing=true packs prompts with their answers, which objective=grpo does not train on (it samples "
                "its own completions): drop data.packing=true, or use objective=sft")
    return None


def _best_by_reward(cfg: dict) -> Optional[str]:
    """A best checkpoint chosen by val/reward (objective=grpo's) needs answers generated at validation."""
    callbacks = cfg.get("callbacks") or {}
    monitor = (callbacks.get("model_checkpoint") or {}).get("monitor")
    if monitor == "val/reward" and (callbacks.get("generation_evaluator") or {}).get("samples_per_task") == 0:
        return ("callbacks.generation_evaluator.samples_per_task=0 generates no answer at validation, so there is no "
                "val/reward to keep the best checkpoint by (callbacks.model_checkpoint.monitor=val/reward): give it "
                "samples, or choose by loss with callbacks.model_checkpoint.monitor=val/loss "
                "callbacks.model_checkpoint.mode=min")
    return None


@dataclass
class TrainSchema(ModelCommandSchema):
    val_every_n_steps: int = setting(1, COUNT)
    checkpoint_every_n_steps: int = setting(1, COUNT)
    progress_every_s: float = setting(0, hint="seconds between progress lines in train.log off a terminal; 0: at "
                                      "every step")
    gradient_checkpointing: bool = setting()
    compile: CompileSchema = setting()
    ckpt_path: Optional[str] = setting()
    overwrite: bool = setting()
    lora: LoraSchema = setting()
    data: DataSchema = setting()
    intervals: IntervalsSchema = setting()
    scoring: ScoringSchema = setting()
    optimizer: OptimizerSchema = setting()
    scheduler: SchedulerSchema = setting()
    trainer: TrainerSchema = setting()
    callbacks: CallbacksSchema = setting()
    objective: ObjectiveSchema = setting()
    reward: RewardSchema = setting()
    init_from: Optional[str] = setting(hint="a run directory or an adapter folder")

    RULES = (_lora_base, _sharded_quantization, _optimizer_runs_here, _objective_data, _best_by_reward)


def _device(name: str) -> Optional[str]:
    if re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        return None
    return "must be auto (the GPU when there is one), cpu, mps, cuda or cuda:<n>"


def _something_to_evaluate(cfg: dict) -> Optional[str]:
    if "predictions" in cfg and "ckpt" in cfg and not cfg["predictions"] and not cfg["ckpt"]:
        return ("nothing to evaluate: pass predictions=<file.jsonl>, ckpt=<run dir | adapter dir> or ckpt=none "
                "(the bare base model)")
    return None


@dataclass
class EvaluateSchema(ModelCommandSchema):
    predictions: Optional[str] = setting()
    output: Optional[str] = setting()
    name: Optional[str] = setting()
    pool_golds: str = setting(choices=("file", "split"), hint="file: the samples of the predictions file; split: "
                              "every sample of data.split, as the official scorer reads them")
    ckpt: Optional[str] = setting()
    device: str = setting(rule=_device)
    merge_adapter: bool = setting()
    progress_every_s: float = setting(0, hint="seconds between progress lines in the log; 0: after every batch")
    all_metrics: bool = setting()
    prompting: PromptingSchema = setting()
    data: DataSchema = setting()
    intervals: IntervalsSchema = setting()
    scoring: ScoringSchema = setting()

    RULES = (_something_to_evaluate,)


def _generate_task(cfg: dict, tasks: TaskTable) -> Optional[str]:
    """task= names a task of the config's table; with ckpt=<a folder> (a run's own tasks may be asked for by
    name) `llasmol.generate` checks it against the run's table, which it reads."""
    task, ckpt = cfg.get("task"), cfg.get("ckpt")
    if task is None or (isinstance(ckpt, str) and Path(ckpt).is_dir()):
        return None
    return _said(tasks.task, task, "task= (or leave task out for one greedy answer)")


@dataclass
class GenerateSchema(ModelCommandSchema):
    query: Optional[str] = setting()
    ckpt: Optional[str] = setting()
    task: Optional[str] = setting()
    device: str = setting(rule=_device)
    merge_adapter: bool = setting()
    data: Optional[DeclaredTasksSchema] = setting()  # +data.new_tasks: a task of the user's own to ask (task=)

    TASK_RULES = (_generate_task,)


def _export_base(cfg: dict) -> Optional[str]:
    bits = (cfg.get("quantization") or {}).get("bits")
    if bits:
        return (f"quantization.bits={bits}: merging an adapter into a {bits}-bit base re-rounds its weights; export "
                "merges into the base in its own dtype: leave quantization=none (a QLoRA run's adapter merges so too)")
    if str(cfg.get("ckpt")).lower() == "none":
        return "ckpt=none: there is no adapter to merge; give a run directory or an adapter folder"
    return None


def _shard_size(size: str) -> Optional[str]:
    """What transformers' `save_pretrained` reads as a shard size (`convert_file_size_to_int`): a whole number and
    a unit; anything else would stop the export after the merge."""
    if re.fullmatch(r"[1-9]\d*[GMK]i?B", str(size), flags=re.I):  # 5GB, 2GiB; a lower-case b counts bits
        return None
    return f"max_shard_size={size!r} is no size: give a whole number and a unit, e.g. 5GB, 500MB or 2GiB"


@dataclass
class ExportSchema(ModelCommandSchema):
    ckpt: str = setting()
    output: str = setting()
    push_to_hub: Optional[str] = setting()
    max_shard_size: str = setting(rule=_shard_size)

    RULES = (_export_base,)


@dataclass
class BaselineSchema(CommandSchema):
    method: Optional[str] = setting()
    n_jobs: int = setting(1, 1024)
    output: Optional[str] = setting()
    all_metrics: bool = setting()
    data: DataSchema = setting()
    generation: GenerationSchema = setting()
    intervals: IntervalsSchema = setting()
    scoring: ScoringSchema = setting()
    morgan: MorganSchema = setting()
    fingerprint: FingerprintSchema = setting()
    nearest_neighbor: NearestNeighborSchema = setting()

    RULES = ()


@dataclass
class AuditSchema(CommandSchema):
    held_out: List[str] = setting()
    fail_on_duplicates: bool = setting()
    examples: int = setting(0, COUNT)
    workers: Optional[int] = setting(1, 1024, hint="null: one per CPU, at most 8")
    corpus: Optional[str] = setting()
    data: DataSchema = setting()

    RULES = ()


# `task_name` of each command's config -> its schema (params reads the training config).
COMMANDS: dict[str, type] = {"train": TrainSchema, "params": TrainSchema, "evaluate": EvaluateSchema,
                             "generate": GenerateSchema, "baseline": BaselineSchema, "audit": AuditSchema,
                             "export": ExportSchema}


# --------------------------------------------------------------------------- checking

_UNRESOLVED = object()  # an interpolation only Hydra's own run can resolve (${hydra:...}), before it starts


def _missing(key: str, cfg: DictConfig) -> str:
    """The line for a `???` never given; model=hf's two settings in one line when both are missing."""
    model = cfg.get("model") if OmegaConf.is_dict(cfg) else None
    if key == "model.name" and model is not None and "path" in model and model.get("path") is None:
        return ("model.name and model.path are not set: model=hf reads a base that is not listed from a local "
                "folder, model.name=<its Hub id> model.path=<folder with its config.json, tokenizer files and "
                "*.safetensors>")
    return f"{key} is not set (???): give it a value, {key}=<value>"


def resolved(cfg: DictConfig) -> dict:
    """`cfg` as plain dicts and lists with every interpolation resolved (the `hydra` node left out); a
    `UserError` naming the first key that cannot be resolved (`${oc.env:UNSET}`, a key that refers to itself,
    a `???` never given). Before Hydra runs, what depends on Hydra's run (`${hydra:...}`, the run folder) stays
    unresolved and is not checked."""
    hydra_ready = HydraConfig.initialized()

    def value_of(node, key, where: str):
        raw = node._get_node(key)._value()
        if isinstance(raw, str) and "${hydra:" in raw and not hydra_ready:
            return _UNRESOLVED
        try:
            value = node[key]
        except MissingMandatoryValue:
            raise UserError(_missing(where, cfg)) from None
        except InterpolationToMissingValueError as err:  # a setting that refers to a `???` (model=hf's name)
            missing = re.search(r"Missing mandatory value: ([\w.]+)", str(err))
            raise UserError(_missing(missing.group(1) if missing else where, cfg)) from None
        except (OmegaConfBaseException, RecursionError, ValueError) as err:
            cause = err
            while cause is not None and not isinstance(cause, UserError):
                cause = cause.__cause__ or cause.__context__
            if cause is not None:  # a resolver's own line (`${llasmol_required:...}`)
                raise UserError(str(cause)) from None
            if not hydra_ready and "HydraConfig was not set" in str(err):
                return _UNRESOLVED  # it names Hydra's run folder, which exists once Hydra runs
            reason = " ".join(str(err).split("\n")[0].split())[:160]
            raise UserError(f"{where}={raw} cannot be resolved ({reason}): give {where} a value, or fix the "
                            "interpolation") from None
        return walk(value, where) if OmegaConf.is_config(value) else value

    def walk(node, where: str):
        if OmegaConf.is_dict(node):
            return {key: value_of(node, key, f"{where}.{key}" if where else str(key))
                    for key in node.keys() if where or key != "hydra"}
        return [value_of(node, i, f"{where}[{i}]") for i in range(len(node))]

    return walk(cfg, "")


def _kind(hint) -> str:
    """How a type reads in a message."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Union:
        named = [_kind(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin in (list, List):
        return f"a list of {_kind(args[0]).removeprefix('a ').removeprefix('an ')}s ([a,b])"
    if origin in (dict, Dict):
        return "a mapping"
    if dataclasses.is_dataclass(hint):
        return "a group of settings"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))


def _fits(value, hint) -> bool:
    """Whether `value` is of type `hint`, strictly: a boolean is no integer, `"maybe"` no boolean, a string no list."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is Union:
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin in (list, List):
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin in (dict, Dict):
        return isinstance(value, dict) and all(isinstance(k, str) and _fits(v, args[1]) for k, v in value.items())
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def _bad_entry(value, kinds: list) -> Optional[tuple[str, Any]]:
    """(key, the type it must have) of the first entry of mapping `value` that no mapping type of `kinds` takes;
    None when `value` is no mapping or every entry fits."""
    mappings = [k for k in kinds if typing.get_origin(k) in (dict, Dict)]
    if not isinstance(value, dict) or not mappings or any(_fits(value, k) for k in mappings):
        return None
    inner = typing.get_args(mappings[0])[1]
    if dataclasses.is_dataclass(inner):
        return None  # a group of settings: its own check names the setting
    if not all(isinstance(k, str) for k in value):
        return None  # a key that is no name: the mapping itself is wrong
    bad = next((k for k, v in value.items() if not _fits(v, inner)), None)
    return None if bad is None else (bad, inner)


def _show(value) -> str:
    return repr(value) if not isinstance(value, (dict, list)) else str(value)[:80]


def check_group(values: dict, schema: type, prefix: str = "", tasks: TaskTable = SMOLINSTRUCT) -> None:
    """A `UserError` naming the first setting of `values` (plain, resolved) that its `schema` does not allow
    (`tasks`: the task table the settings may name)."""
    hints = typing.get_type_hints(schema)
    _check_known(values, schema, prefix)
    for f in dataclasses.fields(schema):
        if f.name not in values or values[f.name] is _UNRESOLVED:
            continue
        key, value, hint = f"{prefix}{f.name}", values[f.name], hints[f.name]
        bounds, rule, task_rule = f.metadata.get("bounds") or Bounds(), f.metadata.get("rule"), f.metadata.get("task_rule")
        kinds = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is Union else [hint]
        nullable = typing.get_origin(hint) is Union and type(None) in typing.get_args(hint)
        core = _kind(Union[tuple(kinds)] if len(kinds) > 1 else kinds[0])
        if bounds.choices:
            must = bounds.describe()
        else:
            must = core + (f" {bounds.describe()}" if bounds.describe() else "")
        must += " or null" if nullable else ""
        must += f" ({bounds.hint})" if bounds.hint else ""
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        entry = _bad_entry(value, kinds)
        if entry is not None:  # a mapping whose one entry is of the wrong kind: name the entry
            name, inner = entry
            raise UserError(f"{key}.{name}={_show(value[name])} must be {_kind(inner)}")
        if not _fits(value, hint) or (value is not None and not bounds.allows(value)
                                      if bounds.choices or numeric else False):
            raise UserError(f"{key}={_show(value)} must be {must}")
        if value is not None and (rule or task_rule):
            why = rule(value) if rule else task_rule(value, tasks)
            if why:  # "must ..." is said of the value; anything else is a whole sentence (an unknown task)
                raise UserError(f"{key}={_show(value)} {why}" if why.startswith("must") else why)
        _nested(value, hint, key, tasks)
    for check in getattr(schema, "RULES", ()):
        why = check(values)
        if why:
            raise UserError(why)
    for check in getattr(schema, "TASK_RULES", ()):
        why = check(values, tasks)
        if why:
            raise UserError(why)


def _check_known(values: dict, schema: type, prefix: str) -> None:
    """A key that a group the product reads does not have was never applied (`+reward.bonus=1` trained to the end
    with no effect): one line naming it and the nearest setting. Groups handed to a library's constructor (the
    trainer, the optimizer, a callback's; `OPEN`) keep whatever that library takes."""
    if getattr(schema, "OPEN", False) or not isinstance(values, dict):
        return
    known = [f.name for f in dataclasses.fields(schema)] + list(getattr(schema, "EXTRA", ()))
    for key in values:
        if key not in known and not str(key).startswith("_"):  # _target_, _partial_: Hydra's
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {prefix}{near[0]}?" if near else f"its settings are {', '.join(sorted(known))}"
            group = prefix.rstrip(".") or "the command line"
            raise UserError(f"{prefix}{key} is not a setting of {group}, so it would never be applied: {hint} "
                            "(remove it)")


def _nested(value, hint, key: str, tasks: TaskTable) -> None:
    """Check the groups inside a group: a dataclass field, or a mapping of them (generation.tasks.<task>)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is Union else [hint]
    for arg in args:
        if dataclasses.is_dataclass(arg) and isinstance(value, dict):
            check_group(value, arg, f"{key}.", tasks)
        elif typing.get_origin(arg) in (dict, Dict) and isinstance(value, dict):
            inner = typing.get_args(arg)[1]
            if dataclasses.is_dataclass(inner):
                for name, values in value.items():
                    check_group(values, inner, f"{key}.{name}.", tasks)


def _beams(values: dict, where: str) -> Optional[str]:
    beams, returned = values.get("num_beams"), values.get("num_return_sequences")
    if isinstance(beams, int) and isinstance(returned, int) and returned > beams:
        return (f"{where}.num_return_sequences={returned} exceeds its num_beams={beams}: beam search returns at most "
                "one sequence per beam")
    return None


def _generation_rule(values: dict, tasks: TaskTable) -> Optional[str]:
    default, given = values.get("default") or {}, values.get("tasks") or {}
    for where, beams in [("generation.default", default), ("generation.question", values.get("question") or {}),
                         *((f"generation.tasks.{t}", v or {}) for t, v in given.items())]:
        why = _beams(beams, where)
        if why:
            return why
    for task in tasks.declared:  # a task's own beams, over the default and under generation.tasks.<task>
        merged = {**default, **dict(tasks[task].generation), **(given.get(task) or {})}
        why = _beams(merged, f"data.new_tasks.{task}")  # num_beams maybe generation.default's
        if why:
            return why
    return None


GenerationSchema.TASK_RULES = (_generation_rule,)


class Checked(typing.NamedTuple):
    """What `check_config` returns: the resolved settings and the task table they declare, its answers read as
    their `scoring` group says."""

    values: dict
    tasks: TaskTable


def checked_tasks(new_tasks: Optional[dict], beside: TaskTable = SMOLINSTRUCT, where: Optional[str] = None) -> TaskTable:
    """`beside` and the tasks `new_tasks` declares (name -> declaration), checked as a command's own
    `data.new_tasks` is; `where`: the file they were read from (a run's `tasks.json`)."""
    if OmegaConf.is_config(new_tasks):  # a command's `cfg.data.new_tasks` as it is
        new_tasks = OmegaConf.to_container(new_tasks, resolve=True)
    if not new_tasks:
        return beside
    key = (json.dumps(new_tasks, sort_keys=True, default=str), where, id(beside))
    if key in _TABLES and _TABLES[key][0] is beside:
        return _TABLES[key][1]
    try:
        check_group({"new_tasks": new_tasks}, DeclaredTasksSchema, "data.")
    except UserError as err:
        raise UserError(f"{where}: {err}" if where else str(err)) from None
    if len(_TABLES) > 16:
        _TABLES.clear()
    _TABLES[key] = beside, beside.with_declared(new_tasks)
    return _TABLES[key][1]


# One command checks its config more than once (its command line before Hydra, `start` inside, the data source): the
# table a set of declarations makes is built at the first check and handed out again, one object for every reader.
_TABLES: dict[tuple, tuple[TaskTable, TaskTable]] = {}


def check_config(cfg: DictConfig) -> Checked:
    """Resolve `cfg`'s interpolations and check every setting of its command's schema (`task_name`) against the
    task table its data declares; returns both. One `UserError` for the first problem."""
    values = resolved(cfg)
    schema = COMMANDS.get(values.get("task_name"))
    if schema is None:
        raise UserError(f"task_name={values.get('task_name')!r} names no llasmol command: one of {', '.join(COMMANDS)}")
    data = values.get("data")
    # The tasks it declares first: data.tasks, weights and generation may name them.
    tasks = checked_tasks(data.get("new_tasks")) if isinstance(data, dict) else SMOLINSTRUCT
    check_group(values, schema, tasks=tasks)
    return Checked(values, tasks.with_scoring(Scoring.of(values.get("scoring"))))
