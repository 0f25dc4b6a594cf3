"""Checkpoints that a PEFT user can load as they are, and that are never half-written.

Next to each Lightning checkpoint `X.ckpt` (optimizer, scheduler, loop state: what resuming needs) the
adapter is written in PEFT's own format to `X.adapter/` (`llasmol.model.adapters`). The adapter goes first,
into a temporary folder renamed into place, and `X.ckpt` is written to a temporary file in the same folder
and renamed (`AtomicCheckpointIO`): a `.ckpt` that exists is complete and so is its adapter.

Two instances run by default (conf/callbacks/default.yaml): one keeps the best adapter by validation loss,
the other (`resume=True`) rewrites `last.ckpt` every few optimizer steps and at the end of training, and
on Ctrl-C or SIGTERM writes `interrupted.ckpt`. `python -m llasmol.train ckpt_path=last` continues from these.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from llasmol.core.run_dir import INTERRUPTED_CKPT
from llasmol.model.adapters import adapter_card, adapter_dir, save_adapter_atomically
from llasmol.training.distributed import module_state_dict
from llasmol.training.lightning_private import CheckpointWithHooks

log = logging.getLogger(__name__)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints through a temporary file in the checkpoint's own folder and a rename.

    Lightning's own writer stages the file in the system temp folder and moves it, which is a copy, not
    an atomic rename, when the run directory is on another filesystem (the usual case on clusters).
    """

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        from llasmol.core.files import write_torch

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

    def before_save(self, trainer, filepath: str) -> None:
        module = trainer.lightning_module
        # Every process takes part: under FSDP the adapters are sharded and gathering them is collective.
        state = module_state_dict(trainer)
        if trainer.is_global_zero:
            card = None
            if self.card_facts is not None:
                metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
                card = adapter_card(self.card_facts, metrics, trainer.global_step)
            save_adapter_atomically(module.model, adapter_dir(filepath), module.adapter_state_dict(state), card)

    def after_remove(self, trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            shutil.rmtree(adapter_dir(filepath), ignore_errors=True)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if self.resume:
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
                from llasmol.training.resume import resume_command

                log.warning("interrupted at step %d, saved %s; continue with:\n  %s", trainer.global_step, path,
                            resume_command(Path(trainer.default_root_dir)))
