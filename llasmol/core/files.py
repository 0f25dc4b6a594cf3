"""Files written so that an interruption leaves either the old file or the complete new one.

A write goes to a temporary name in the target's folder, `.<name>.<pid>.<random>.tmp`, and is renamed
into place. A process killed mid-write leaves that temporary behind; the pid in its name lets the next
start (`remove_stale_temporaries`) tell it from the temporary of a writer still running.
"""

from __future__ import annotations

import contextvars
import errno
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterable

from llasmol.core.errors import UserError


def shareable_mode(directory: bool = False) -> int:
    """The mode a plain `open` (or `mkdir`) would give under the current umask: `mkstemp` and `mkdtemp`
    create 0600/0700, which a teammate on a shared cluster could not read."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


_FULL = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
         errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "permission denied"}


# How the command that is writing lets its user write elsewhere: a run folder's commands take hydra.run.dir,
# `report` takes --out (it sets this while it writes).
def nearest_existing(path: Path) -> Path:
    """`path` itself or, while it does not exist yet, the nearest folder above it that does (what decides
    whether it can be made)."""
    existing = Path(os.path.abspath(path))
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    return existing


WRITE_ELSEWHERE = contextvars.ContextVar("write_elsewhere", default="write the run elsewhere with hydra.run.dir=...")


def raise_if_unwritable(err: BaseException, path: Path) -> None:
    """A `UserError` naming `path` when `err` says its folder cannot take the file (a full disk or quota,
    a read-only or foreign folder): a fact about the machine the user can fix, not a bug to trace."""
    if not isinstance(err, OSError) or err.errno not in _FULL:
        return
    reason = _FULL[err.errno]
    fix = "make that folder writable or"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = shutil.disk_usage(Path(path).parent).free / 1e9
            reason += f" ({free:.2f} GB free there)"
        except OSError:
            pass
        fix = "free space there (old runs' checkpoints/) or"
    raise UserError(f"cannot write {path}: {reason}; {fix} {WRITE_ELSEWHERE.get()}") from err


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_a_regular_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists and is not a regular file (a symlink is followed): "a folder", "a named
    pipe (FIFO)", ...; None for a regular file or a new path."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # a new path (or a dangling link, which the rename replaces)
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"{kind} (through a symbolic link)" if os.path.islink(path) else kind


def json_problem(err: BaseException) -> str:
    """Why `json.loads` refused a line, said after where it is ("line 3 is not valid JSON (Expecting value)"):
    one wording for every JSON-lines reader. Python reads no integer past 4,300 digits and no nesting past its
    stack; neither is bad JSON."""
    if isinstance(err, RecursionError):
        return "is nested too deeply to read as JSON (thousands of brackets)"
    if isinstance(err, UnicodeDecodeError):
        return "is not UTF-8 text, which JSON is"
    if isinstance(err, json.JSONDecodeError):
        return f"is not valid JSON ({err.msg})"
    if "digits" in str(err):
        return f"holds an integer of more than {sys.get_int_max_str_digits():,} digits, more than Python reads"
    return getattr(err, "why", None) or f"cannot be read ({type(err).__name__})"  # a reader's hook says its own why


def read_json(path: str | os.PathLike, fix: str, kind: type | None = dict, what: str = "",
              limit: int | None = None):
    """The JSON value in `path`, read as data: the one reader of the package's JSON files. A path that is no
    readable regular file (`unreadable`), is larger than `limit` bytes, is not UTF-8 JSON (with json's line), or
    holds no JSON `kind` (`what`: the value expected, "the object PEFT writes") is one `UserError` in one wording,
    "<path> <what is wrong>: <fix>"."""
    problem = unreadable(path)
    if problem:
        raise UserError(f"{path} {problem}: {fix}")
    try:
        if limit is not None and os.stat(path).st_size > limit:
            raise UserError(f"{path} is larger than {what or 'such a file'} can be ({limit:,} bytes at most): {fix}")
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}): {fix}") from None
    except (ValueError, RecursionError) as err:  # not UTF-8, an integer past Python's digits, nesting past its stack
        raise UserError(f"{path} {json_problem(err)}: {fix}") from None
    except OSError as err:
        raise UserError(f"{path} cannot be read ({err.strerror}): {fix}") from None
    if kind is not None and not isinstance(value, kind):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, not {what or 'a JSON ' + kind.__name__}: {fix}")
    return value


def json_lines(path: str | os.PathLike, fix: str, on_bad=None, **options):
    """(line number, value) of every non-blank line of a JSON-lines file, one line in memory at a time: the one
    JSON-lines reader of the package's inputs. A line that is not UTF-8 JSON is one `UserError` in `read_json`'s
    wording, "<path> line <n> is not valid JSON (<json's reason>): <fix>", or with `on_bad` is handed to it (line
    number, why) and left out. `options` go to `json.loads` (an `object_pairs_hook`); what one raises that is no
    `ValueError` reaches the caller."""
    problem = unreadable(path)
    if problem:
        raise UserError(f"{path} {problem}: {fix}")
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line, **options)
            except (ValueError, RecursionError) as err:  # not UTF-8, 5,000-digit integers, nesting past the stack
                if on_bad is None:
                    raise UserError(f"{path} line {number} {json_problem(err)}: {fix}") from None
                on_bad(number, json_problem(err))
                continue
            yield number, value


def unreadable(path: str | os.PathLike) -> str | None:
    """What keeps `path` from being read as a regular file, said after its name ("does not exist", "is a
    symbolic link loop", "is a named pipe (FIFO), not a regular file"); None for a regular file. A FIFO or a
    device would block or never end where a file is expected, so it is named, not opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop (each link points back into the chain)"
        if err.errno in (errno.ENOENT, errno.ENOTDIR) and os.path.islink(path):
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        return f"cannot be read ({os.strerror(err.errno) if err.errno else err})"
    if stat.S_ISREG(mode):
        return None
    return f"is {not_a_regular_file(path)}, not a regular file"


# Hydra writes a run's config and log (tens of KB) before any of our code runs, and its own error on a full disk
# is a traceback: below this much free space a folder is refused up front.
MIN_FREE_BYTES = 256 << 10
NO_SPACE = "has no space left on device"  # how `folder_problem` begins a full disk's reason (its fix differs)


def folder_problem(folder: str | os.PathLike) -> str | None:
    """Why no file can be made in the existing folder `folder`, said after its name ("is on a read-only file
    system"), or None. Asked before the work, so an hour of scoring does not end in a write that fails."""
    try:
        stats = os.statvfs(folder)
    except OSError as err:
        return f"cannot be examined ({os.strerror(err.errno) if err.errno else err})"
    if getattr(stats, "f_blocks", 1) == 0:  # no size: /proc or /sys (no files at all), or a tmpfs without a limit
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".llasmol-probe.")
        except OSError:
            return "is on a virtual file system (such as /proc or /sys), where no file can be made"
        os.close(fd)
        os.unlink(probe)
        return None
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is on a read-only file system" if stats.f_flag & os.ST_RDONLY else "is not writable by this user"
    # f_bavail: what an unprivileged writer may use; a quota shows as the same shortage when it is enforced here.
    free = min(shutil.disk_usage(folder).free, stats.f_bavail * stats.f_frsize)
    if free < MIN_FREE_BYTES:
        return f"{NO_SPACE} ({free / 1e9:.2f} GB free there)"
    return None


def check_writable_file(path: str | os.PathLike, setting: str | None = None) -> None:
    """A `UserError` now when `path` could not be written when the work is done: not a regular file (a FIFO,
    a device), under a file, or in a folder that is read-only, foreign, virtual or full. `setting` names the
    option that chose the path."""
    check_target(path, setting)
    check_room(f"{setting}={path}" if setting else str(path), Path(path).parent)


def check_target(path: str | os.PathLike, setting: str | None = None) -> None:
    """A `UserError` when `path` exists and is not a regular file: an atomic write replaces the node itself, so
    `output=/dev/null` would swap the system's device for a JSON file. `setting` names the option that chose
    the path."""
    kind = not_a_regular_file(path)
    if kind is None:
        return
    what = f"{setting}={path}" if setting else str(path)
    raise UserError(f"{what} is {kind}, not a regular file: llasmol writes only regular files (replaced whole) "
                    "or new paths; name a new file")


def check_new_folder(path: Path, setting: str, purpose: str) -> None:
    """A folder a command fills from nothing (`setting` chose it, `purpose` says what for): new, or empty, in a
    folder that can take it; nothing is replaced. Asked before the work."""
    if path.is_symlink():
        raise UserError(f"{setting}={path} is a symbolic link ({os.readlink(path)}), which would be replaced: name a "
                        f"new folder {purpose}")
    if path.exists() and not path.is_dir():
        raise UserError(f"{setting}={path} is {not_a_regular_file(path) or 'a file'}, not a folder: name a new "
                        f"folder {purpose}")
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"{setting}={path} holds files already: name a new (or empty) folder; nothing is replaced")
    check_room(f"{setting}={path}", path)


def check_room(what: str, path: Path) -> None:
    """A `UserError` when `path` could not be made: the nearest folder above it that exists is a file, or is
    read-only, foreign, virtual or full."""
    folder = nearest_existing(path)
    if not folder.is_dir():
        raise UserError(f"{what} cannot be written: {folder} is {not_a_regular_file(folder) or 'a file'}, not a "
                        "folder; name a path in a folder")
    problem = folder_problem(folder)
    if problem:
        fix = "free space there or name" if problem.startswith(NO_SPACE) else "name"
        raise UserError(f"{what} cannot be written: {folder} {problem}; {fix} a path elsewhere")


def _atomic_write(path: Path, write, binary: bool = False) -> None:
    # The temporary file sits in the target's folder: os.replace is atomic only within one filesystem.
    check_target(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
        os.fchmod(fd, shareable_mode())
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise_if_unwritable(err, path)
        raise


# `.<name>.<pid>.<8 random>` (+ `.tmp` for files); `.<name>.old` is an adapter stepped aside mid-save.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}(\.tmp)?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process (or a number no process has): leave its files alone
    return pid != 0


def remove_stale_temporaries(folder: str | os.PathLike) -> tuple[list[Path], int]:
    """Remove, under `folder`, the temporary files and folders of writers that no longer run on this machine
    (a kill mid-write leaves them: at 7B each is adapter- or checkpoint-sized). Returns them and their
    size in bytes. Temporaries of live processes, and every other file, are left alone."""
    removed, size = [], 0
    for root, dirs, files in os.walk(folder):
        for name in [*files, *dirs]:
            match = _TEMPORARY.match(name)
            if not match or _alive(int(match["pid"])):
                continue
            path = Path(root) / name
            if path.is_dir():
                size += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                shutil.rmtree(path, ignore_errors=True)
                dirs.remove(name)
            else:
                size += path.stat().st_size
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed, size


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

    def save(fh) -> None:
        try:
            torch.save(obj, fh)
        except RuntimeError as err:
            # torch's zip writer reports a write the disk cut short as "unexpected pos", not as the OSError
            if "unexpected pos" in str(err) and shutil.disk_usage(Path(path).parent).free < 1 << 20:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
            raise

    _atomic_write(Path(path), save, binary=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    _atomic_write(Path(path), lambda fh: fh.write(text))


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    _atomic_write(Path(path), lambda fh: fh.write(data), binary=True)


def complete_lines(path: str | os.PathLike) -> list[bytes]:
    """The complete, non-blank lines of an append-only file, which a kill mid-write can leave ending in a torn
    line: that tail is cut off the file, so the next append starts on a line of its own."""
    path = Path(path)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with path.open("r+b") as fh:
            fh.truncate(end)
    return [line for line in data[:end].split(b"\n") if line.strip()]


def complete_jsonl(path: str | os.PathLike) -> list[dict]:
    """The records of the complete lines of an append-only JSONL file (`complete_lines`)."""
    return [json.loads(line) for line in complete_lines(path)]


def append_jsonl(fh, records: Iterable[dict]) -> None:
    """Append `records` to the binary file `fh`, one whole line each, and push them to the disk before
    returning: what was appended survives a kill or a power cut that comes next."""
    fh.write(b"".join(json.dumps(_strict(r), ensure_ascii=False).encode("utf-8") + b"\n" for r in records))
    fh.flush()
    os.fsync(fh.fileno())
