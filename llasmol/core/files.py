"""Files written so that an interruption leaves either the old file or the complete new one."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Iterable


def shareable_mode(directory: bool = False) -> int:
    """The mode a plain `open` (or `mkdir`) would give under the current umask: `mkstemp` and `mkdtemp`
    create 0600/0700, which a teammate on a shared cluster could not read."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def _atomic_write(path: Path, write, binary: bool = False) -> None:
    # The temporary file sits in the target's folder: os.replace is atomic only within one filesystem.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, shareable_mode())
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _strict(value):
    # Strict JSON has no NaN/Infinity (an RMSE with no valid prediction is NaN): write null instead.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_json(path: str | os.PathLike, data) -> None:
    text = json.dumps(_strict(data), indent=2, ensure_ascii=False, allow_nan=False)
    _atomic_write(Path(path), lambda fh: fh.write(text + "\n"))


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> None:
    def write(fh):
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")

    _atomic_write(Path(path), write)


def write_torch(path: str | os.PathLike, obj) -> None:
    """`torch.save` with the same guarantee."""
    import torch

    _atomic_write(Path(path), lambda fh: torch.save(obj, fh), binary=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    _atomic_write(Path(path), lambda fh: fh.write(text))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    _atomic_write(Path(path), lambda fh: fh.write(data), binary=True)
