"""Checkpoints that a PEFT user can load as they are.

Next to each Lightning checkpoint `X.ckpt` (optimizer, scheduler, loop state: what resuming needs) the
adapter is written in PEFT's own format to `X.adapter/` (`adapter_config.json` and
`adapter_model.safetensors`), loadable with `PeftModel.from_pretrained(base, "X.adapter")`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint


def adapter_dir(ckpt_path: str | Path) -> Path:
    """The PEFT adapter folder that belongs to the Lightning checkpoint `ckpt_path`."""
    path = Path(ckpt_path)
    return path.with_name(path.stem + ".adapter")


class AdapterModelCheckpoint(ModelCheckpoint):
    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            trainer.lightning_module.model.save_pretrained(str(adapter_dir(filepath)))

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        super()._remove_checkpoint(trainer, filepath)
        if trainer.is_global_zero:
            shutil.rmtree(adapter_dir(filepath), ignore_errors=True)
