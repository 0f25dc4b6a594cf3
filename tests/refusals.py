"""What every refusal promises, asserted in one place.

A mistake the user can fix ends in one ``error:`` line that names the setting (or file) and the bad value,
exit status 2, no traceback and nothing written. Tests say *which* names and values a refusal must hold;
the exact wording of each message is checked once, against docs/troubleshooting.md (tests/test_docs.py).

    with refused("data.micro_batch_size", "3"):           # in process: a UserError
        build(cfg)
    line = refused_cli(["llasmol.train", "x=1"], tmp_path, "x=1", untouched=tmp_path)   # a command
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from conftest import HANG_TIMEOUT

from llasmol.core.errors import UserError, _cause_line



def _snapshot(folder: Path | None) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time, to tell that nothing was written. A run
    folder's `.lock` is left out: `train` takes it (an empty file) before it reads the data, and it is no output."""
    if folder is None or not Path(folder).exists():
        return {}
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(Path(folder).rglob("*")) if p.name != ".lock"}


def _check_line(message: str, named: tuple[str, ...]) -> None:
    line = _cause_line(message)
    assert "\n" not in line, f"a refusal is one line:\n{message}"
    assert "Traceback" not in line, message
    missing = [n for n in named if str(n) not in line]
    assert not missing, f"the refusal does not name {missing}: {line!r}"


class Refusal:
    """The refusal a `refused` block saw: its message, for the few tests that read more than names."""

    message: str = ""


@contextlib.contextmanager
def refused(*named: object, untouched: Path | None = None) -> Iterator[Refusal]:
    """The block raises a `UserError` whose line names each of `named`; `untouched` is left as it was."""
    before = _snapshot(untouched)
    seen = Refusal()
    try:
        yield seen
    except UserError as err:
        seen.message = str(err)
    else:
        raise AssertionError(f"not refused; expected a UserError naming {named}")
    _check_line(seen.message, tuple(map(str, named)))
    assert _snapshot(untouched) == before, f"a refusal wrote under {untouched}"


def run_cli(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    """`python -m <args>` offline, without `HYDRA_FULL_ERROR` (which would keep the traceback)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **kw.pop("env", {})}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=HANG_TIMEOUT, **kw)


def error_line(proc: subprocess.CompletedProcess, *named: object) -> str:
    """The one ``error:`` line of a refused command (exit 2, no traceback), naming each of `named`."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    _check_line(errors[0], tuple(map(str, named)))
    return errors[0]


def refused_cli(args: list[str], cwd: Path, *named: object, untouched: Path | None = None, **kw) -> str:
    """Run a command that must be refused: its one error line, naming `named`; `untouched` left as it was."""
    before = _snapshot(untouched)
    line = error_line(run_cli(args, cwd, **kw), *named)
    assert _snapshot(untouched) == before, f"a refused command wrote under {untouched}"
    return line
