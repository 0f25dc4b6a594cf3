"""Checkpoints that a PEFT user can load as they are, and that are never half-written.

Next to each Lightning checkpoint `X.ckpt` (optimizer, scheduler, loop state: what resuming needs) the
adapter is written in PEFT's own format to `X.adapter/` (`adapter_config.json` and
`adapter_model.safetensors`), loadable with `PeftModel.from_pretrained(base, "X.adapter")`. The adapter
goes first, into a temporary folder renamed into place, and Lightning writes `X.ckpt` through a
temporary file too: a `.ckpt` that exists is complete and so is its adapter.

Ctrl-C during training leaves `interrupted.ckpt` (+ adapter) to resume from with `ckpt_path=`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger(__name__)


def adapter_dir(ckpt_path: str | Path) -> Path:
    """The PEFT adapter folder that belongs to the Lightning checkpoint `ckpt_path`."""
    path = Path(ckpt_path)
    return path.with_name(path.stem + ".adapter")


def save_adapter_atomically(model, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        model.save_pretrained(str(tmp))
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        tmp.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class AdapterModelCheckpoint(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath: str) -> None:
        if trainer.is_global_zero:
            save_adapter_atomically(trainer.lightning_module.model, adapter_dir(filepath))
        super()._save_checkpoint(trainer, filepath)

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        super()._remove_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            shutil.rmtree(adapter_dir(filepath), ignore_errors=True)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if isinstance(exception, KeyboardInterrupt) and self.dirpath:
            path = str(Path(self.dirpath) / "interrupted.ckpt")
            self._save_checkpoint(trainer, path)
            if trainer.is_global_zero:
                log.warning("interrupted at step %d: resume with ckpt_path=%s", trainer.global_step, path)
