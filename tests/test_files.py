"""The atomic writers of llasmol.core.files: where the temporary file lives, what a failure leaves, what
the JSON holds."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from llasmol.core import files

WRITERS = {
    "write_json": ({"a": 1}, lambda p: json.loads(p.read_text()) == {"a": 1}),
    "write_jsonl": ([{"a": 1}, {"b": 2}], lambda p: p.read_text() == '{"a": 1}\n{"b": 2}\n'),
    "write_text": ("héllo\n", lambda p: p.read_text(encoding="utf-8") == "héllo\n"),
    "write_bytes": (b"\x00\xff", lambda p: p.read_bytes() == b"\x00\xff"),
    "write_torch": ({"w": torch.arange(3)}, lambda p: torch.equal(torch.load(p, weights_only=True)["w"],
                                                                  torch.arange(3))),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_the_temporary_file_is_hidden_in_the_targets_own_folder(tmp_path, monkeypatch, writer):
    """os.replace is atomic only within one filesystem: a temporary file staged elsewhere (/tmp, the working
    directory) fails with 'Invalid cross-device link' when the run directory is on another mount."""
    renames = []
    real_replace = os.replace

    def spy(src, dst):
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    target = tmp_path / "new" / "folder" / "out.dat"  # missing folders are made
    data, check = WRITERS[writer]
    getattr(files, writer)(target, data)
    assert check(target)
    assert len(renames) == 1
    src, dst = renames[0]
    assert dst == target and src.parent == target.parent
    assert src.name.startswith(".out.dat.") and src.name.endswith(".tmp")
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.dat"]


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "val.jsonl"
    files.write_jsonl(target, [{"old": True}])

    def records():
        yield {"new": 1}
        raise RuntimeError("generation stopped")

    with pytest.raises(RuntimeError, match="generation stopped"):
        files.write_jsonl(target, records())
    assert target.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["val.jsonl"]


def test_json_is_strict_and_non_finite_numbers_become_null(tmp_path):
    target = tmp_path / "m.json"
    files.write_json(target, {"rmse": math.nan, "x": [1.5, math.inf, {"y": -math.inf}], "ok": 2.0, "t": (1, 2)})
    text = target.read_text()
    assert "NaN" not in text and "Infinity" not in text and text.endswith("\n")
    assert json.loads(text) == {"rmse": None, "x": [1.5, None, {"y": None}], "ok": 2.0, "t": [1, 2]}


def test_files_get_the_mode_a_plain_open_would_give(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_text(tmp_path / "a.txt", "x")
        assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640
        assert files.shareable_mode(directory=True) == 0o750
    finally:
        os.umask(old)


def test_records_are_written_as_readable_utf8_and_a_full_disk_names_the_free_space(tmp_path, monkeypatch):
    import errno
    import os
    import shutil
    from collections import namedtuple

    import pytest

    from llasmol.core.errors import UserError
    from llasmol.core.files import write_jsonl

    write_jsonl(tmp_path / "p.jsonl", [{"caption": "café, 5 µM"}])
    assert (tmp_path / "p.jsonl").read_bytes() == '{"caption": "café, 5 µM"}\n'.encode()  # not \\u escapes

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10e9, 8.5e9, 1.5e9))
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(UserError, match=r"no space left on device \(1\.50 GB free there\)"):
        write_jsonl(tmp_path / "q.jsonl", [{"a": 1}])


def _special_nodes(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a folder, symbolic links to both, and (where this user may make one) a character device with
    /dev/null's numbers: what an atomic write would replace with a regular file, node and all."""
    import stat

    nodes = {"a named pipe (FIFO)": tmp_path / "fifo", "a folder": tmp_path / "folder"}
    os.mkfifo(nodes["a named pipe (FIFO)"])
    nodes["a folder"].mkdir()
    try:
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        nodes["a character device"] = tmp_path / "null"
    except (PermissionError, OSError):
        pass  # not root: the FIFO and the links stand for the class
    for kind, path in list(nodes.items()):
        link = tmp_path / f"link-to-{path.name}"
        link.symlink_to(path)
        nodes[f"{kind} (through a symbolic link)"] = link
    return nodes


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_atomic_writes_never_replace_a_node_that_is_not_a_regular_file(tmp_path, writer):
    import stat

    from llasmol.core.errors import UserError

    nodes = _special_nodes(tmp_path)
    before = {path: os.lstat(path) for path in nodes.values()}
    data, _ = WRITERS[writer]
    for kind, path in nodes.items():
        with pytest.raises(UserError) as err:
            getattr(files, writer)(path, data)
        assert str(err.value) == (f"{path} is {kind}, not a regular file: llasmol writes only regular files "
                                  "(replaced whole) or new paths; name a new file")
    for path, st in before.items():
        now = os.lstat(path)
        assert (now.st_ino, stat.S_IFMT(now.st_mode)) == (st.st_ino, stat.S_IFMT(st.st_mode)), path
    assert not list(tmp_path.glob(".*.tmp")) and not list((tmp_path / "folder").iterdir())
    # A regular file (also through a link) or a new path is written as before.
    (tmp_path / "old.dat").write_text("old")
    (tmp_path / "link-to-old").symlink_to(tmp_path / "old.dat")
    for target in (tmp_path / "old.dat", tmp_path / "link-to-old", tmp_path / "new.dat"):
        getattr(files, writer)(target, data)
        assert WRITERS[writer][1](target)


def test_appended_records_are_whole_strict_lines_pushed_to_the_disk(tmp_path, monkeypatch):
    """What `append_jsonl` returns from is on the disk (a kill or power cut next keeps it): flushed, then
    fsynced, in that order; each record a line of strict JSON, NaN written as null."""
    import llasmol.core.files as files

    synced = []
    path = tmp_path / "a.jsonl"
    with path.open("ab") as fh:
        monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append((fd, path.read_bytes())))
        files.append_jsonl(fh, [{"a": 1.5, "b": float("nan")}, {"c": "é"}])
        # fsynced once, with both lines already written through (flushed) when it was asked
        assert synced == [(fh.fileno(), '{"a": 1.5, "b": null}\n{"c": "é"}\n'.encode("utf-8"))]
    assert files.complete_jsonl(path) == [{"a": 1.5, "b": None}, {"c": "é"}]
