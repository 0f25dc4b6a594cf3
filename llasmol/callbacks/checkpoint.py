"""Checkpoints that a PEFT user can load as they are, and that are never half-written.

Next to each Lightning checkpoint `X.ckpt` (optimizer, scheduler, loop state: what resuming needs) the
adapter is written in PEFT's own format to `X.adapter/` (`adapter_config.json` and
`adapter_model.safetensors`), loadable with `PeftModel.from_pretrained(base, "X.adapter")`. The adapter
goes first, into a temporary folder renamed into place, and `X.ckpt` is written to a temporary file in
the same folder and renamed (`AtomicCheckpointIO`): a `.ckpt` that exists is complete and so is its
adapter.

Two instances run by default (conf/callbacks/default.yaml): one keeps the best adapter by validation loss,
the other (`resume=True`) rewrites `last.ckpt` every few optimizer steps and at the end of training, and
on Ctrl-C or SIGTERM writes `interrupted.ckpt`. `python -m llasmol.train ckpt_path=last` continues from these.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from llasmol.distributed import module_state_dict

log = logging.getLogger(__name__)


def adapter_dir(ckpt_path: str | Path) -> Path:
    """The PEFT adapter folder that belongs to the Lightning checkpoint `ckpt_path`."""
    path = Path(ckpt_path)
    return path.with_name(path.stem + ".adapter")


def _previous(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def readable_adapter(target: Path) -> Path:
    """`target`, or the adapter it replaces when a save stopped between its two renames (the `.ckpt`,
    written after the adapter, is then still the previous one too, so the two match)."""
    if not target.exists() and (_previous(target) / "adapter_config.json").is_file():
        return _previous(target)
    return target


def save_adapter_atomically(model, target: Path, state_dict: dict | None = None) -> None:
    """A folder cannot be replaced in one rename: the old adapter steps aside, the new one is renamed in,
    then the old one goes; `readable_adapter` covers the moment between the two renames."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    old = _previous(target)
    try:
        model.save_pretrained(str(tmp), state_dict=state_dict)
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoints through a temporary file in the checkpoint's own folder and a rename.

    Lightning's own writer stages the file in the system temp folder and moves it, which is a copy, not
    an atomic rename, when the run directory is on another filesystem (the usual case on clusters).
    """

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        from llasmol.io import write_torch

        write_torch(path, checkpoint)


class AdapterModelCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` that writes the PEFT adapter beside each checkpoint.

    `resume=True` makes it the resume checkpoint: Ctrl-C or SIGTERM saves `interrupted.ckpt`, and the end of
    training saves the last state even when the step count is not a multiple of `every_n_train_steps`.
    """

    def __init__(self, *args, resume: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resume = resume

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        module = trainer.lightning_module
        # Every process takes part: under FSDP the adapters are sharded and gathering them is collective.
        state = module_state_dict(trainer)
        if trainer.is_global_zero:
            save_adapter_atomically(module.model, adapter_dir(filepath), module.adapter_state_dict(state))
        super()._save_checkpoint(trainer, filepath)

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        super()._remove_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            shutil.rmtree(adapter_dir(filepath), ignore_errors=True)

    def on_train_end(self, trainer, pl_module) -> None:
        super().on_train_end(trainer, pl_module)
        if self.resume and self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        # Ctrl-C, or SIGTERM (a cluster preempting or cancelling the job; Lightning raises it after a batch).
        if self.resume and isinstance(exception, (KeyboardInterrupt, SIGTERMException)) and self.dirpath:
            path = str(Path(self.dirpath) / "interrupted.ckpt")
            self._save_checkpoint(trainer, path)
            if trainer.is_global_zero:
                log.warning("interrupted at step %d: resume with ckpt_path=%s", trainer.global_step, path)
