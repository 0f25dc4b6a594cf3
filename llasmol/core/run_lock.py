"""One `llasmol.train` or `llasmol.evaluate` per run directory (two evaluations into one folder would leave one's
predictions beside the other's metrics), and a fresh start never in a folder that holds a run
(`check_fresh_start`). The lock: an advisory (`flock`) on `<run dir>/.lock`, held for the life of the process
that writes the folder. The kernel drops it when that process ends, however it ends (a kill, a pre-empted job, a
crash), so a killed run never leaves it stuck and `ckpt_path=last` in place works right after. On
network filesystems Linux maps `flock` onto NFS byte-range locks (a shared cluster's run directories too)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Optional

from llasmol.core import run_dir as layout
from llasmol.core.errors import UserError

LOCK = ".lock"
# Where a launcher says which process this is, in the order Lightning reads them (its `rank_zero_only.rank`;
# tests/test_threads.py compares): read here without loading Lightning, whose torch would load OpenMP
# before the command sets its wait policy (llasmol.core.threads).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
_held: dict[str, int] = {}  # run directory -> the open descriptor holding its lock (this process)


def process_rank() -> int:
    """This process's rank among a launch's processes: 0 alone, or for the first of them."""
    return next((int(os.environ[key]) for key in RANK_VARIABLES if os.environ.get(key) is not None), 0)


def _owner(path: Path) -> tuple[str, str]:
    """The command holding the lock in `path` (`llasmol.train`) and which process it is."""
    try:
        info = json.loads(path.read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["started"]))
        return f"llasmol.{info.get('command', 'train')}", f"pid {info['pid']} on {info['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "llasmol command", "another process"


OWN_FOLDER = "give this command its own hydra.run.dir"


def _busy(run_dir: Path, fix: str = OWN_FOLDER) -> UserError:
    command, process = _owner(run_dir / LOCK)
    return UserError(f"{run_dir} is in use by another {command} ({process}): wait for it to end, or {fix}")


def hold_run_lock(run_dir: Path, command: str = "train", fix: str = OWN_FOLDER) -> None:
    """Take `run_dir`'s lock for the rest of this process, or until `release_run_lock` (`command`: which one, as a
    second one is told), or a `UserError` naming the command that holds it and `fix`."""
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _busy(run_dir, fix) from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                             "started": time.time()}).encode())
    _held[key] = fd


def release_run_lock(run_dir: Path) -> None:
    """Drop this process's lock of `run_dir` (a folder renamed or removed once written: an export's staging)."""
    fd = _held.pop(str(Path(run_dir).resolve()), None)
    if fd is not None:
        os.close(fd)


def check_run_lock(run_dir: Optional[Path]) -> None:
    """A `UserError` when another process holds `run_dir`'s lock; takes nothing (a command-line check made
    before Hydra writes its config files into the folder)."""
    if run_dir is None or not (Path(run_dir) / LOCK).is_file():
        return
    fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(Path(run_dir)) from None
    finally:
        os.close(fd)  # closing drops the shared lock, if it was taken


def _job_number(name: str) -> int:
    """The number a multirun job's folder starts with (`2_tiny_full`: 2); a folder named otherwise counts as
    the first."""
    number = name.split("_", 1)[0]
    return int(number) if number.isdigit() else 0


def _holds_run(folder: Path) -> bool:
    return ((folder / layout.RESULT).is_file() or (folder / layout.PARAMS).is_file()
            or any((folder / layout.CHECKPOINTS).glob("*.ckpt")))


def check_fresh_start(folder: Optional[Path], ckpt_path, overwrite, first_job=0) -> None:
    """A `UserError` when a run starting fresh (no `ckpt_path`) would write into `folder` while it holds a run
    (its result, parameters or checkpoints; or, for a sweep's folder, any of its jobs' folders numbered from
    `first_job` on does: a continued sweep writes only those), unless `overwrite` is true. A command-line check,
    made before Hydra writes its config into the folder."""
    if folder is None or ckpt_path is not None or overwrite is True or not Path(folder).is_dir():
        return
    folder = Path(folder)
    first = first_job if isinstance(first_job, int) else 0  # a sweep of first_job values: every job folder counts
    runs = [folder] if _holds_run(folder) else [f for f in sorted(folder.iterdir()) if f.is_dir() and _holds_run(f)
                                                and _job_number(f.name) >= first]
    if not runs:
        return
    held = runs[0]
    resumable = any((held / layout.CHECKPOINTS / name).is_file() for name in layout.RESUME_CKPTS)
    resume = "continue it with ckpt_path=last, " if resumable else ""
    raise UserError(f"{held} already holds a run, and starting fresh there would replace its checkpoints, result "
                    f"and config: {resume}give this run a new folder (another hydra.run.dir=...), or start over "
                    "in it with overwrite=true")


OBJECTIVE_KEY = "objective"  # in a checkpoint: the objective it was trained by (sft, grpo); absent before it was kept


def checkpoint_objective(path) -> str:
    """The objective a resume checkpoint was trained by (sft or grpo); one saved before checkpoints said so is a
    GRPO stage's when it holds that stage's start, else SFT's."""
    import torch  # only where a checkpoint is read: the checks before Hydra load no torch otherwise

    state = torch.load(str(path), map_location="cpu", mmap=True, weights_only=True)
    return state.get(OBJECTIVE_KEY) or ("grpo" if "grpo_start" in state else "sft")


def check_objective(path, objective: str) -> None:
    """A run resumes only by the objective it was trained by: the optimizer, the schedule and (for GRPO) the kept
    rollouts belong to it, and its best checkpoint is chosen by that objective's metric."""
    saved = checkpoint_objective(path)
    if saved != objective:
        raise UserError(f"ckpt_path={path} is a checkpoint of objective={saved}, and this run is objective={objective}: "
                        f"resume it with objective={saved}, as it was trained, or train its adapter by "
                        f"objective={objective} in a new run with init_from=<its run directory>")


def check_resume_objective(folder: Optional[Path], ckpt_path, objective) -> None:
    """Before Hydra writes its config into a run's folder: continuing that run's own checkpoint (`ckpt_path=last`
    or `auto` where it has one) by another objective is a `UserError` (the folder's config would say the new
    objective, and its checkpoints mix two)."""
    if folder is None or ckpt_path not in ("last", "auto") or not isinstance(objective, str):
        return
    for name in layout.RESUME_CKPTS:
        path = Path(folder) / layout.CHECKPOINTS / name
        if path.is_file():
            try:
                check_objective(path, objective)
            except UserError:
                raise
            except Exception:  # a damaged checkpoint is said where it is read to resume
                return
