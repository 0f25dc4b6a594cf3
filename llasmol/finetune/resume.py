"""Resuming a run, wired from one place: which checkpoint `ckpt_path=` means and its step, continuing the
run's W&B run and CSV rows when it resumes in its own directory, the random draws that make a resumed run
train as the uninterrupted one would (`StepSeeding`), and stopping on Ctrl-C or SIGTERM where a checkpoint
resumes exactly (`StopAtStepBoundary`).

The data position travels as the DataModule's state (`SMolInstructDataModule.state_dict`, restored by
Lightning before the train loader is built); beside `Resume.trainer`, the one seam where a plan meets the
trainer, the fit is only handed `Resume.checkpoint`.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import open_dict

from llasmol.core import run_dir as layout
from llasmol.core.errors import UserError
from llasmol.core.files import unreadable, write_text
from llasmol.core.run_lock import check_objective, checkpoint_objective
from llasmol.finetune.distributed import SHARDED_KEY, uses_fsdp2
from llasmol.finetune.lightning_private import log_step_row_now, validate_first_on_resume, validation_due_now
from llasmol.finetune.tracking import KeepingCSVLogger, wandb_loggers

if TYPE_CHECKING:
    from lightning import Trainer

log = logging.getLogger(__name__)


def newest_resume_checkpoint(run_dir: Path, strict: bool = True) -> Optional[Path]:
    """The resume checkpoint of a run directory saved at the latest optimizer step (interrupted.ckpt where it
    ties with last.ckpt: it also knows whether a validation was due), or None. Steps, not file dates, decide:
    a copy, an rsync or a clock change redates files, never their steps. A broken one (an empty or truncated
    file) is passed over; `strict`: when every one found is broken, a `UserError` naming the first (else None,
    for other runs' folders)."""
    found = [p for name in layout.RESUME_CKPTS if (p := run_dir / layout.CHECKPOINTS / name).is_file()]
    broken, steps = None, {}
    for path in found:
        try:
            steps[path] = check_training_checkpoint(path)
        except UserError as err:
            broken = broken or err
    if steps:
        return max(steps, key=lambda p: (steps[p], p.name == layout.INTERRUPTED_CKPT))
    if broken is not None and strict:
        raise broken
    return None


def _same_variant(run_dir: Path, model: str, lora: str) -> bool:
    try:
        params = json.loads((run_dir / layout.PARAMS).read_text())
    except (OSError, ValueError):
        return False
    return params.get("model") == model and params.get("lora") == lora


def resolve_resume(ckpt_path: Optional[str], output_dir: Path, model: str, lora: str,
                   objective: str = "sft") -> Optional[str]:
    """The `.ckpt` file to resume from, or None to start fresh; one of another `objective` is a `UserError`.

    `last` looks in this run's own directory first (a run restarted in place with `hydra.run.dir=`), then
    in the sibling run directories (other runs of the same task), taking the newest checkpoint of a run of
    the same model, LoRA variant and objective, so an ablation's variants, or an SFT run and the GRPO stage that
    continues it, never resume from each other.
    `auto` resumes this run directory's own checkpoint when there is one and starts fresh otherwise: the
    setting for jobs that a cluster may stop and requeue into the same directory.
    """
    found = _resume_checkpoint(ckpt_path, output_dir, model, lora, objective)
    if found is not None:
        check_objective(found, objective)
    return found


def _resume_checkpoint(ckpt_path: Optional[str], output_dir: Path, model: str, lora: str,
                       objective: str) -> Optional[str]:
    if ckpt_path is None:
        return None
    if str(ckpt_path) == "auto":
        own = newest_resume_checkpoint(output_dir)
        return str(own) if own is not None else None
    if str(ckpt_path) == "last":
        own = newest_resume_checkpoint(output_dir)
        if own is not None:
            return str(own)
        siblings = [newest_resume_checkpoint(d, strict=False) for d in output_dir.parent.iterdir()
                    if d.is_dir() and d != output_dir and _same_variant(d, model, lora)]
        siblings = [c for c in siblings if c is not None and checkpoint_objective(c) == objective]
        if not siblings:
            raise UserError(
                f"ckpt_path=last: no checkpoints/last.ckpt in {output_dir} nor in another {model}+{lora} run of "
                f"objective={objective} under {output_dir.parent}: give ckpt_path=<run directory or .ckpt file>, or "
                "leave it unset"
            )
        return str(max(siblings, key=lambda p: p.stat().st_mtime_ns))
    path = Path(ckpt_path)
    if path.is_dir():
        found = newest_resume_checkpoint(path)
        if found is None:
            raise UserError(f"ckpt_path={ckpt_path} is a folder without checkpoints/last.ckpt: give a run "
                            "directory that has one, or a .ckpt file")
        return str(found)
    problem = unreadable(path)
    if problem:
        raise UserError(f"ckpt_path={ckpt_path} {problem}: give last, auto, a run directory or a .ckpt file")
    check_training_checkpoint(path)
    return str(path)


# What every Lightning checkpoint of a fit holds, beside the weights.
TRAINING_STATE_KEYS = ("pytorch-lightning_version", "global_step", "state_dict", "optimizer_states", "loops")


def check_training_checkpoint(path: Path) -> int:
    """The optimizer step of `path`, a checkpoint `llasmol.train` can resume (else a `UserError`): read
    weights-only with its tensors memory-mapped (cheap at any size), so nothing in a crafted file runs."""
    import pickle

    why = ""
    try:
        state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError:
        why = "it holds objects other than tensors and plain containers; nothing in it was run"
    except Exception:
        why = "it is not a file torch.save wrote"
    else:
        missing = [k for k in TRAINING_STATE_KEYS if not isinstance(state, dict) or k not in state]
        if missing:
            why = f"it holds no training state (no {', '.join(missing[:2])})"
        elif not isinstance(state["global_step"], int) or isinstance(state["global_step"], bool):
            why = f"its global_step is {str(state['global_step'])[:40]}, not a step"
    if why:
        raise UserError(f"ckpt_path={path} is not a checkpoint of llasmol.train: {why}. Give a run directory or "
                        "its checkpoints/last.ckpt; an adapter folder is evaluated with llasmol.evaluate ckpt=")
    return state["global_step"]


def checkpoint_step(path: str) -> int:
    """The optimizer step a Lightning checkpoint was saved at (tensors memory-mapped, not read)."""
    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=True)["global_step"])


def checkpoint_launch(path: str) -> tuple[Optional[int], bool]:
    """How many processes trained the run a checkpoint was saved from (its data position says; None when it
    holds none: saved before the first batch), and whether under trainer=fsdp."""
    state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    world = next((value["train_position"].get("world_size") for value in state.values()  # the DataModule's state
                  if isinstance(value, dict) and isinstance(value.get("train_position"), dict)), None)
    return world, bool(state.get(SHARDED_KEY, False))


def check_same_launch(path: str, world_size: int, sharded: bool) -> None:
    """Every process trains a stride of the epoch's order and keeps its own place in it, so a run resumes
    exactly only on the number of processes it was saved from; and trainer=fsdp lays its optimizer state out
    otherwise than the other presets, so it resumes only its own checkpoints."""
    saved, saved_sharded = checkpoint_launch(path)
    if saved is not None and saved != world_size:
        raise UserError(f"ckpt_path={path} was saved by a run of {saved} process(es) and this one has {world_size} "
                        f"(trainer.devices × trainer.num_nodes): resume with {saved} processes, as each continues "
                        "its own share of the epoch, or start a new run")
    if saved_sharded != sharded:
        was, now = ("trainer=fsdp", "another trainer") if saved_sharded else ("another trainer", "trainer=fsdp")
        raise UserError(f"ckpt_path={path} was saved under {was} and this run is under {now}: their optimizer states "
                        f"are laid out differently; resume with the {was.removeprefix('another ')} it was saved "
                        "with, or start a new run")


class Resume(Callback):
    """What `ckpt_path=` means for this run, and the one seam where that reaches the trainer: `trainer` builds
    the trainer with loggers that continue an in-place resume's W&B run and CSV rows, and the plan, one of the
    trainer's callbacks, clears a stale interrupted.ckpt once the fit has trained to its end.

    Not a dataclass: Hydra would turn a dataclass among the trainer's arguments into a config node."""

    def __init__(self, checkpoint: Optional[str], output_dir: Path) -> None:
        self.checkpoint = checkpoint  # the .ckpt to resume from; None starts fresh
        self.output_dir = output_dir

    @classmethod
    def plan(cls, ckpt_path: Optional[str], output_dir: Path, model: str, lora: str, objective: str = "sft") -> "Resume":
        return cls(resolve_resume(ckpt_path, output_dir, model, lora, objective), output_dir)

    @property
    def in_place(self) -> bool:
        """Resuming in this run's own directory (a restart, a requeued job): its logs continue."""
        return bool(self.checkpoint) and Path(self.checkpoint).resolve().is_relative_to(self.output_dir.resolve())

    def trainer(self, make: Callable[[list[Callback]], "Trainer"], logger_cfg) -> "Trainer":
        """The trainer `make(callbacks)` builds with this plan among `callbacks`, and its loggers set up for this
        plan before anything is logged: `logger_cfg` continues an in-place resume's W&B run before `make`
        instantiates the loggers; right after, they keep its CSV rows and remember the W&B id."""
        self._continue_wandb_run(logger_cfg)
        trainer = make([self])
        if self.checkpoint:  # before any logger starts
            check_same_launch(self.checkpoint, trainer.world_size, uses_fsdp2(trainer))
        self._keep_logs(trainer)
        return trainer

    def _continue_wandb_run(self, logger_cfg) -> None:
        """Before the loggers exist: an in-place resume continues its W&B run (same id, ``resume="allow"``)
        rather than start a second one; resumed from elsewhere, a run gets a new id as a fresh one does."""
        id_file = self.output_dir / layout.WANDB_ID
        if not self.in_place or not id_file.is_file():
            return
        for node in (logger_cfg or {}).values():
            if node and str(node.get("_target_", "")).endswith("WandbLogger"):
                with open_dict(node):
                    node.id = id_file.read_text().strip()
                    node.resume = "allow"

    def _keep_logs(self, trainer: "Trainer") -> None:
        """Once the trainer exists, before anything is logged: an in-place resume keeps its CSV rows up to
        the checkpoint's step; every run remembers its W&B id for a later in-place resume."""
        if self.in_place:
            step = checkpoint_step(self.checkpoint)
            for logger in trainer.loggers:
                if isinstance(logger, KeepingCSVLogger):
                    logger.keep_until_step = step
        if trainer.is_global_zero:
            for logger in wandb_loggers(trainer):
                write_text(self.output_dir / layout.WANDB_ID, logger.experiment.id + "\n")

    def on_fit_start(self, trainer: "Trainer", pl_module) -> None:
        """A run continued in its own folder from another checkpoint than its interrupted.ckpt (a file given by
        hand) abandons what that one holds: removed now, or a later `ckpt_path=last` would prefer its step."""
        stale = self.output_dir / layout.CHECKPOINTS / layout.INTERRUPTED_CKPT
        if not (trainer.is_global_zero and self.in_place and stale.is_file()):
            return
        if Path(self.checkpoint).resolve() != stale.resolve():
            _remove_with_adapter(stale)
            log.warning("removed %s: this run continues from %s instead", stale, self.checkpoint)

    def on_fit_end(self, trainer: "Trainer", pl_module) -> None:
        """After a fit that trained to its end (a stop raises past this hook), once its checkpoints wrote
        last.ckpt: an interrupted.ckpt of the run is stale (last.ckpt is newer and what a resume takes), so
        it goes with its adapter."""
        if not trainer.is_global_zero:
            return
        stale = self.output_dir / layout.CHECKPOINTS / layout.INTERRUPTED_CKPT
        if stale.is_file():
            _remove_with_adapter(stale)


def _remove_with_adapter(checkpoint: Path) -> None:
    """A checkpoint and the adapter folder saved beside it (`X.ckpt`, `X.adapter`)."""
    checkpoint.unlink()
    shutil.rmtree(checkpoint.with_suffix(".adapter"), ignore_errors=True)


class StepSeeding(Callback):
    """Random draws (LoRA dropout) as a function of (seed, epoch, batch, rank), not of the run's history, so
    a run resumed from a checkpoint draws what the uninterrupted run would have."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        entropy = [self.seed, trainer.current_epoch, batch_idx, trainer.global_rank]
        torch.manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))


class StopAtStepBoundary(Callback):
    """Ctrl-C or SIGTERM stops training at the end of the optimizer step in progress, where the state is
    exactly what last.ckpt holds at that point: `interrupted.ckpt`, written then, resumes as if the run had
    never stopped. (Stopping between the micro-batches of one step would lose the half-accumulated
    gradient while the data position and loop counters had moved past it.) A second signal stops at once;
    resuming then takes last.ckpt. Under DDP the ranks agree at each step whether any of them was asked
    to stop, so they stop together.

    A signal during a validation of the fit (which generates for minutes: a preemption's grace period can be
    shorter) stops it at once: the step it validates has ended, so `interrupted.ckpt` is that step's, and the
    resumed run validates it first. Under DDP a rank stopping alone would leave the others waiting in the
    validation's gathers, so there the stop waits for the next step's end as before.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._requested = 0  # the signal number asked for, 0 for none
        self._previous: dict = {}
        self._step_at_start = -1
        # The stop comes at the step's end, before the validation due there: saved in interrupted.ckpt (this
        # callback's state), so that the resumed run validates that step first.
        self._validation_due = False
        self._validate_first = False
        self._validating_step = -1  # the step whose validation runs now and stops at a signal, -1 for none

    def state_dict(self) -> dict:
        return {"validation_due": self._validation_due}

    def load_state_dict(self, state: dict) -> None:
        self._validate_first = bool(state.get("validation_due"))

    def _handle(self, signum, frame) -> None:
        if self._validating_step >= 0:
            self._requested = signum
            self._stop_validation()
        if self._requested:
            self._restore()
            raise KeyboardInterrupt if signum == signal.SIGINT else SIGTERMException()
        self._requested = signum
        log.warning("%s: stopping at the end of this optimizer step and saving checkpoints/interrupted.ckpt "
                    "(press Ctrl-C again to stop at once, without it)", signal.Signals(signum).name)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def on_train_start(self, trainer, pl_module) -> None:
        if self._validate_first:
            self._validate_first = False
            validate_first_on_resume(trainer)
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._previous = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
            for sig in self.SIGNALS:
                signal.signal(sig, self._handle)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self._step_at_start:
            return  # mid-accumulation: the optimizer has not stepped
        requested = self._requested
        if trainer.world_size > 1:  # the largest signal number asked on any rank (SIGTERM 15 over SIGINT 2)
            flag = torch.tensor(float(requested), device=pl_module.device)
            requested = int(trainer.strategy.reduce(flag, reduce_op="max"))
        if requested:
            self._restore()
            log_step_row_now(trainer, pl_module, outputs, batch, batch_idx)  # a resumed run logs from the next step
            stop = KeyboardInterrupt() if requested == signal.SIGINT else SIGTERMException()
            stop.at_step_boundary = True  # the checkpoint callback saves interrupted.ckpt for these only
            self._validation_due = validation_due_now(trainer)
            raise stop

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and trainer.world_size == 1:
            self._validating_step = trainer.global_step
            if self._requested:  # asked during the step's last micro-batch's hooks, after the boundary check
                self._stop_validation()

    def on_validation_end(self, trainer, pl_module) -> None:
        self._validating_step = -1

    def _stop_validation(self) -> None:
        step, self._validating_step = self._validating_step, -1
        self._restore()
        log.warning("%s: stopping the validation of step %d and saving checkpoints/interrupted.ckpt (the resumed "
                    "run validates step %d first)", signal.Signals(self._requested).name, step, step)
        stop = KeyboardInterrupt() if self._requested == signal.SIGINT else SIGTERMException()
        stop.at_step_boundary = True  # the step validated has ended: its state is exactly what is saved
        self._validation_due = True
        raise stop

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore()


def resume_command(output_dir: Path) -> str:
    """The command that continues this run in its own directory, with the overrides it was started with."""
    import shlex

    overrides: list[str] = []
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            overrides = [o for o in HydraConfig.get().overrides.task
                         if not o.startswith(("ckpt_path=", "hydra.run.dir=", "paths.output_dir="))]
    except ValueError:
        pass
    return " ".join(["python -m llasmol.train", *map(shlex.quote, overrides),
                     shlex.quote(f"hydra.run.dir={output_dir}"), "ckpt_path=last"])
