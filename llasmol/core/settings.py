"""The numeric settings the commands read, each with the values it may take, in one table: checked on the
composed config before anything is built, so `data.max_length=0` or `optimizer.lr=nan` stops a command with
one line instead of a traceback minutes later (or a run that silently trains nothing)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from llasmol.core.errors import UserError


@dataclass(frozen=True)
class Rule:
    key: str
    integer: bool  # an int (not a bool, not 2.5), else any finite number
    low: float  # smallest allowed value
    low_open: bool = False  # low itself not allowed (lr > 0)
    high: Optional[float] = None  # largest value, exclusive (dropout < 1)
    nullable: bool = False  # null means "not set" (eval_batch_size: the micro-batch)
    also: tuple = ()  # extra allowed values outside the range (max_steps=-1: by epochs)
    hint: str = ""
    multiple_of: Optional[int] = None  # integers only: a multiple of this (bits packed 8 to a byte)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        bound = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        upper = f" and < {self.high:g}" if self.high is not None else ""
        extra = "".join(f" or {v}" for v in self.also)
        multiple = f", a multiple of {self.multiple_of}" if self.multiple_of else ""
        return f"{kind} {bound}{upper}{multiple}{extra}{' or null' if self.nullable else ''}"

    def allows(self, value) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if value in self.also:
            return True
        if self.integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if value < self.low or (self.low_open and value == self.low):
            return False
        if self.multiple_of and value % self.multiple_of:
            return False
        return self.high is None or value < self.high


RULES: tuple[Rule, ...] = (
    Rule("seed", True, 0),
    Rule("val_every_n_steps", True, 1),
    Rule("checkpoint_every_n_steps", True, 1),
    Rule("lora.r", True, 1, hint="the paper's LoRA rank is 16"),
    Rule("lora.alpha", False, 0, low_open=True),
    Rule("lora.dropout", False, 0, high=1),
    Rule("data.max_length", True, 16, hint="the paper's is 512 tokens; shorter than a prompt trains on nothing"),
    Rule("data.micro_batch_size", True, 1),
    Rule("data.effective_batch_size", True, 1),
    Rule("data.eval_batch_size", True, 1, nullable=True),
    Rule("data.num_workers", True, 0),
    Rule("optimizer.lr", False, 0, low_open=True, hint="the paper's is 1e-4"),
    Rule("optimizer.weight_decay", False, 0),
    Rule("scheduler.num_warmup_steps", True, 0),
    Rule("trainer.max_steps", True, 1, also=(-1,), hint="-1 trains for trainer.max_epochs"),
    Rule("trainer.max_epochs", True, 1, nullable=True, also=(-1,)),
    Rule("trainer.gradient_clip_val", False, 0, low_open=True, nullable=True),
    Rule("trainer.accumulate_grad_batches", True, 1),
    Rule("generation.max_prompt_tokens", True, 1),
    Rule("generation.max_new_tokens_limit", True, 1, nullable=True),
    Rule("generation.batch_size", True, 1),
    Rule("progress_every_s", False, 0, hint="seconds between progress lines in the log; 0: after every batch"),
    Rule("callbacks.generation_evaluator.samples_per_task", True, 0, nullable=True),
    Rule("intervals.resamples", True, 0, hint="0 turns intervals off; 1000 is the default"),
    Rule("intervals.seed", True, 0),
    Rule("intervals.level", False, 0, low_open=True, high=1, hint="0.95 for 95% intervals"),
    # python -m llasmol.audit's own settings (top-level keys of conf/audit.yaml only).
    Rule("workers", True, 1, nullable=True, hint="null: one per CPU, at most 8"),
    Rule("examples", True, 0),
    # python -m llasmol.baseline
    Rule("n_jobs", True, 1),
    Rule("morgan.radius", True, 0, hint="ECFP4 is radius 2"),
    Rule("morgan.n_bits", True, 8, multiple_of=8, hint="the default is 2048"),
    Rule("fingerprint.n_estimators", True, 1),
    Rule("fingerprint.min_samples_leaf", True, 1),
    Rule("nearest_neighbor.max_train_inputs", True, 1, nullable=True, hint="null indexes every training input"),
    Rule("nearest_neighbor.table_rows", True, 1),
)
# Every beam setting, the default's and each task's.
BEAM_RULES: tuple[Rule, ...] = (
    Rule("num_beams", True, 1),
    Rule("num_return_sequences", True, 1),
    Rule("max_new_tokens", True, 1),
)

_MISSING = object()


def _check(rule: Rule, key: str, value) -> None:
    if not rule.allows(value):
        hint = f" ({rule.hint})" if rule.hint else ""
        raise UserError(f"{key}={value!r} must be {rule.describe()}{hint}")


def check_lora_base(cfg: DictConfig) -> None:
    """A `UserError` when the LoRA variant names the one base it means (`lora.base`: `lora=large` is
    Llama-2-13B) and the config's model is another."""
    base, model = OmegaConf.select(cfg, "lora.base"), OmegaConf.select(cfg, "model.name")
    if base is not None and model is not None and model != base:
        name = OmegaConf.select(cfg, "lora.name")
        raise UserError(f"lora={name} means model={base}, but model={model} was given: drop model={model} "
                        f"(lora={name} chooses {base} itself), or use lora=full with model={model}")


def check_settings(cfg: DictConfig) -> None:
    """A `UserError` naming the first setting of `cfg` outside its allowed values, or a LoRA variant on a base
    it does not mean (`check_lora_base`); absent keys are skipped."""
    check_lora_base(cfg)
    for rule in RULES:
        value = OmegaConf.select(cfg, rule.key, default=_MISSING)
        if value is not _MISSING:
            _check(rule, rule.key, value)
    generation = cfg.get("generation")
    if generation is None:
        return
    settings = {"generation.default": generation.get("default") or {}}
    for task, values in (generation.get("tasks") or {}).items():
        settings[f"generation.tasks.{task}"] = values or {}
    for where, values in settings.items():
        for rule in BEAM_RULES:
            if rule.key in values:
                _check(rule, f"{where}.{rule.key}", values[rule.key])
        beams, returned = values.get("num_beams"), values.get("num_return_sequences")
        if isinstance(beams, int) and isinstance(returned, int) and returned > beams:
            raise UserError(f"{where}.num_return_sequences={returned} exceeds its num_beams={beams}: "
                            "beam search returns at most one sequence per beam")
