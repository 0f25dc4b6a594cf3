"""A command's log lines also in a folder chosen while it runs: `evaluate ckpt=<run dir>` writes its answers
into the run, so its log (the adapter chosen, progress, the "continue with" line, an error) goes there as well
as into the command's own dated folder, which Hydra chose before the checkpoint was read."""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

# Hydra's file format (its default job logging), for a process that has no file handler to copy.
FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def log_also_to(path: Path, command: str) -> None:
    """Append every later log line of this process to `path` (made if missing) until the process ends; the first
    line is the command (`python -m <command> <its arguments>`), so one file holds each session in turn. Nothing
    is added where a handler writes already (the command's own folder is that run)."""
    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    if any(Path(h.baseFilename).resolve() == path.resolve() for h in files):
        return
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(files[0].formatter if files and files[0].formatter else logging.Formatter(FORMAT))
    # The command heads its session in this file only: the console and the command's own log have it already.
    handler.handle(logging.LogRecord("llasmol", logging.INFO, __file__, 0, "%s", (shlex.join(
        ["python", "-m", command, *sys.argv[1:]]),), None))
    root.addHandler(handler)
