"""User-facing errors: a mistake the user can fix, reported as one line without a traceback."""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Callable


class UserError(Exception):
    """Bad input or an unavailable resource; the message names the bad value and the fix."""


class Stopped(Exception):
    """Ctrl-C or SIGTERM during a long job: what was kept, how to continue, and the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def report_user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a `UserError` raised by `fn` into one line on stderr and exit status 2.

    `HYDRA_FULL_ERROR=1` keeps the traceback, as it does for Hydra's own errors.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            user_error = _find_user_error(err)
            if user_error is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
                raise
            message = _cause_line(str(user_error))
            print(f"error: {message}", file=sys.stderr, flush=True)
            log_to_files(f"error: {message}")
            _remove_empty_run_folder()
            sys.exit(2)

    return wrapper


def _cause_line(message: str) -> str:
    """The error itself: a DataLoader worker re-raises with its traceback folded into the message,
    ending in ``...UserError: <the message>``."""
    if "Traceback" not in message:
        return message
    last = message.rstrip().splitlines()[-1]
    return last.split("UserError: ", 1)[1] if "UserError: " in last else last


def log_to_files(line: str, level: int = logging.ERROR, name: str = "llasmol") -> None:
    """`line` in the run's log file (Hydra's `<task>.log`) alone: why the run ended (the console has it already),
    or a progress line while a progress bar holds the console."""
    record = logging.LogRecord(name, level, __file__, 0, line, None, None)
    raise_exceptions, logging.raiseExceptions = logging.raiseExceptions, False  # a full disk: no traceback
    try:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler):
                handler.handle(record)
    finally:
        logging.raiseExceptions = raise_exceptions


def _remove_empty_run_folder() -> None:
    """A command stopped by a mistake leaves no timestamped run folder behind when it wrote nothing there but
    Hydra's own files (its config and the log with the error): the error is on the console already. A
    folder the user named (hydra.run.dir=...) or one holding anything else stays."""
    import shutil
    from pathlib import Path

    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return
        folder = Path(HydraConfig.get().runtime.output_dir)
        task_log = f"{HydraConfig.get().job.name}.log"
        named = any(o.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for o in HydraConfig.get().overrides.hydra)
    except Exception:  # not under Hydra, or no run folder: nothing to tidy
        return
    if named:
        return  # a folder the user chose keeps its log, error included
    if folder.resolve() == Path.cwd().resolve() or not folder.is_dir():
        return  # e.g. generate and params run in place
    # Hydra's own files, the lock, the log, and files the command opened but wrote nothing into (an evaluation's
    # predictions file, stopped before its first answer)
    kept = [p for p in folder.rglob("*") if p.is_file() and p.parts[len(folder.parts)] not in (".hydra", ".lock", task_log)
            and (p.is_symlink() or p.stat().st_size > 0)]
    if not kept:
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == folder:
                handler.close()
        shutil.rmtree(folder, ignore_errors=True)
        # Its first line named the folder: say that it is gone, and why, so nobody looks for it
        print(f"({folder} held only this command's config and log, and was removed: nothing was run)",
              file=sys.stderr, flush=True)
        remove_empty_parents(folder)


def remove_empty_parents(folder) -> None:
    """The folders above a removed `folder` up to the working directory, each only while it is empty
    (outputs/evaluate/ and outputs/, when nothing else is there: another command's runs beside it stay)."""
    from pathlib import Path

    cwd, parent = Path.cwd().resolve(), Path(folder).resolve().parent
    while parent != cwd and cwd in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def _find_user_error(err: BaseException) -> UserError | None:
    """The `UserError` in `err`'s chain; Hydra's `instantiate` wraps what constructors raise."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, UserError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None
