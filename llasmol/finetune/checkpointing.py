"""Checkpoints that a PEFT user can load as they are, and that are never half-written.

Next to each Lightning checkpoint `X.ckpt` (optimizer, scheduler, loop state: what resuming needs) the
adapter is written in PEFT's own format to `X.adapter/` (`llasmol.model.adapters`). The adapter is saved
first into a temporary folder, then `X.ckpt` is written to a temporary file in the same folder and renamed
(`AtomicCheckpointIO`), and only then is the adapter renamed into place: a kill at any point of the long
writes leaves the previous pair, both of one step (each adapter records its step in
`trainer_state.json`). Only a kill between the final renames, microseconds apart, can part them; the next
start in the run directory names such a pair (`tidy_run_dir`), and removes the temporaries killed writes
left behind.

Two instances run by default (conf/callbacks/default.yaml): one keeps the best adapter by validation loss,
the other (`resume=True`) rewrites `last.ckpt` every few optimizer steps and at the end of training, and
on Ctrl-C or SIGTERM writes `interrupted.ckpt`. `python -m llasmol.train ckpt_path=last` continues from these.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from llasmol.core.run_dir import INTERRUPTED_CKPT
from llasmol.core.files import remove_stale_temporaries, write_torch
from llasmol.core.run_dir import CHECKPOINTS
from llasmol.model.adapters import ADAPTER_CONFIG, adapter_dir, adapter_step, commit_adapter, stage_adapter
from llasmol.model.cards import adapter_card
from llasmol.finetune.lightning_private import CheckpointWithHooks
from llasmol.finetune.resume import checkpoint_step, resume_command

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints through a temporary file in the checkpoint's own folder and a rename.

    Lightning's own writer stages the file in the system temp folder and moves it, which is a copy, not
    an atomic rename, when the run directory is on another filesystem (the usual case on clusters).
    """

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        write_torch(path, checkpoint)


class AdapterModelCheckpoint(CheckpointWithHooks):
    """`ModelCheckpoint` that writes the PEFT adapter beside each checkpoint.

    `resume=True` makes it the resume checkpoint: Ctrl-C or SIGTERM saves `interrupted.ckpt`, and the end of
    training saves the last state even when the step count is not a multiple of `every_n_train_steps`.
    """

    def __init__(self, *args, resume: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resume = resume
        self.card_facts: dict | None = None  # set by `train`: what the adapter's README.md says about it
        self._staged: dict[str, Path] = {}  # checkpoint path -> its adapter, saved, waiting for the .ckpt

    def check_monitor_top_k(self, trainer, current=None) -> bool:
        """Lightning's rule, except that a tie with the kept checkpoint replaces it: of two adapters that score the
        same (a GRPO run's val/reward on a few dozen samples ties often) the later one, trained longer, is kept."""
        if current is None or self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return super().check_monitor_top_k(trainer, current)
        at_least = {"min": torch.le, "max": torch.ge}[self.mode]
        kept = self.best_k_models[self.kth_best_model_path]
        return trainer.strategy.reduce_boolean_decision(bool(at_least(current, kept)))

    def before_save(self, trainer, filepath: str) -> None:
        module = trainer.lightning_module
        # Every process takes part: under trainer=fsdp the adapters are sharded and gathering them is collective.
        state = trainer.strategy.lightning_module_state_dict()
        if trainer.is_global_zero:
            card = None
            if self.card_facts is not None:
                # A validation's numbers belong to the checkpoint of its step only: a save at a step's end
                # (every_n_train_steps, the last step) comes before that step's validation.
                validated = getattr(module, "last_validated_step", None) == trainer.global_step
                metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                           if k.startswith("val/") and validated}
                card = adapter_card(self.card_facts, metrics, trainer.global_step)
            self._staged[filepath] = stage_adapter(module.model, adapter_dir(filepath),
                                                   module.adapter_state_dict(state), card, trainer.global_step)

    def after_save(self, trainer, filepath: str, saved: bool) -> None:
        staged = self._staged.pop(filepath, None)
        if staged is None:
            return
        if saved:
            commit_adapter(staged, adapter_dir(filepath))
        else:  # the .ckpt was not written: its previous adapter stays with the previous .ckpt
            shutil.rmtree(staged, ignore_errors=True)

    def after_remove(self, trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            shutil.rmtree(adapter_dir(filepath), ignore_errors=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        # The step that reaches trainer.max_steps is saved here, at its end, as every periodic save is. Saved
        # at on_train_end, the checkpoint would hold Lightning's loop state after it has counted the
        # unfinished epoch as done, and a resume to a higher max_steps would skip the rest of its data.
        if self.resume and 0 < trainer.max_steps <= trainer.global_step:
            self.save_last_unless_saved(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if self.resume:  # a run that ended with its last epoch, off the save interval
            self.save_last_unless_saved(trainer)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Ctrl-C, or SIGTERM (a cluster preempting or cancelling the job), raised at the end of an optimizer
        # step by `StopAtStepBoundary`: the state then resumes exactly. Stopped anywhere else, last.ckpt does.
        if not (self.resume and getattr(exception, "at_step_boundary", False) and self.dirpath):
            return
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            path = str(Path(self.dirpath) / INTERRUPTED_CKPT)
            self.save_now(trainer, path)
            if trainer.is_global_zero:
                log.warning("interrupted at step %d, saved %s; continue with:\n  %s", trainer.global_step, path,
                            resume_command(Path(trainer.default_root_dir)))


def tidy_run_dir(run_dir: Path) -> list[str]:
    """Put a run directory in order before training writes to it again (the caller holds its run lock):
    remove the temporaries of writes a kill stopped, bring back an adapter stepped aside by a save stopped
    between its renames, and name any checkpoint whose adapter is of another step. Returns what it did and
    found, one line each, for the log."""
    notes = []
    removed, size = remove_stale_temporaries(run_dir)
    if removed:
        notes.append(f"removed {len(removed)} temporary file(s) left by writes a stop interrupted "
                     f"({size / 1e6:.1f} MB): {', '.join(p.name for p in removed[:3])}{', ...' if len(removed) > 3 else ''}")
    checkpoints = Path(run_dir) / CHECKPOINTS
    if not checkpoints.is_dir():
        return notes
    for old in sorted(checkpoints.glob(".*.adapter.old")):
        target = old.with_name(old.name[1:-len(".old")])
        if not target.exists() and (old / ADAPTER_CONFIG).is_file():
            old.rename(target)
            notes.append(f"restored {target.name} (its replacement was stopped between two renames)")
        else:
            shutil.rmtree(old, ignore_errors=True)
    for ckpt in sorted(checkpoints.glob("*.ckpt")):
        adapter = adapter_dir(ckpt)
        stored = adapter_step(adapter)
        if stored is None or not ckpt.is_file():
            continue  # adapters of earlier versions record no step; a .ckpt folder is no checkpoint of ours
        try:
            step = checkpoint_step(str(ckpt))
        except Exception:  # noqa: BLE001 - a damaged checkpoint is named where it is used
            continue
        if step != stored:
            notes.append(f"{adapter.name} holds step {stored} but {ckpt.name} step {step} (a stop between their "
                         f"final renames); the next save under this name writes both again")
    return notes
