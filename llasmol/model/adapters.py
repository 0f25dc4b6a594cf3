"""The adapter folder beside each Lightning checkpoint: its name, its atomic save and its fallback read.

Next to `X.ckpt` the adapter is written in PEFT's own format to `X.adapter/` (`adapter_config.json` and
`adapter_model.safetensors`), loadable with `PeftModel.from_pretrained(base, "X.adapter")`. Training writes
it (`llasmol.training.checkpointing`), evaluation and generation read it (`llasmol.inference.loading`);
neither needs the other, and nothing here needs Lightning.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


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
