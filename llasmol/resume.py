"""Which checkpoint `ckpt_path=` means: `last`, `auto`, a run directory, or a `.ckpt` file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from llasmol.errors import UserError

# Written by the resume checkpoint callback: every few steps and at the end, or on Ctrl-C.
RESUME_NAMES = ("last.ckpt", "interrupted.ckpt")


def newest_resume_checkpoint(run_dir: Path) -> Optional[Path]:
    """The most recently written resume checkpoint of a run directory, or None."""
    found = [p for name in RESUME_NAMES if (p := run_dir / "checkpoints" / name).is_file()]
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def _same_variant(run_dir: Path, model: str, lora: str) -> bool:
    try:
        params = json.loads((run_dir / "params.json").read_text())
    except (OSError, ValueError):
        return False
    return params.get("model") == model and params.get("lora") == lora


def resolve_resume(ckpt_path: Optional[str], output_dir: Path, model: str, lora: str) -> Optional[str]:
    """The `.ckpt` file to resume from, or None to start fresh.

    `last` looks in this run's own directory first (a run restarted in place with `hydra.run.dir=`), then
    in the sibling run directories (other runs of the same task), taking the newest checkpoint of a run of
    the same model and LoRA variant, so an ablation's variants never resume from each other.
    `auto` resumes this run directory's own checkpoint when there is one and starts fresh otherwise: the
    setting for jobs that a cluster may stop and requeue into the same directory.
    """
    if ckpt_path is None:
        return None
    if str(ckpt_path) == "auto":
        own = newest_resume_checkpoint(output_dir)
        return str(own) if own is not None else None
    if str(ckpt_path) == "last":
        own = newest_resume_checkpoint(output_dir)
        if own is not None:
            return str(own)
        siblings = [newest_resume_checkpoint(d) for d in output_dir.parent.iterdir()
                    if d.is_dir() and d != output_dir and _same_variant(d, model, lora)]
        siblings = [c for c in siblings if c is not None]
        if not siblings:
            raise UserError(
                f"ckpt_path=last: no checkpoints/last.ckpt in {output_dir} nor in another {model}+{lora} run "
                f"under {output_dir.parent}: give ckpt_path=<run directory or .ckpt file>, or leave it unset"
            )
        return str(max(siblings, key=lambda p: p.stat().st_mtime_ns))
    path = Path(ckpt_path)
    if path.is_dir():
        found = newest_resume_checkpoint(path)
        if found is None:
            raise UserError(f"ckpt_path={ckpt_path} is a folder without checkpoints/last.ckpt: give a run "
                            "directory that has one, or a .ckpt file")
        return str(found)
    if not path.is_file():
        raise UserError(f"ckpt_path={ckpt_path} does not exist: give last, auto, a run directory or a .ckpt file")
    return str(path)
