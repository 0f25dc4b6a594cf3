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
