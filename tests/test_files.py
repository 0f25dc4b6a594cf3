"""The atomic writers of llasmol.core.files: where the temporary file lives, what a failure leaves, what
the JSON holds."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from refusals import error_line, refused, refused_cli, run_cli

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

    from llasmol.core.files import write_jsonl

    write_jsonl(tmp_path / "p.jsonl", [{"caption": "café, 5 µM"}])
    assert (tmp_path / "p.jsonl").read_bytes() == '{"caption": "café, 5 µM"}\n'.encode()  # not \\u escapes

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10e9, 8.5e9, 1.5e9))
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with refused(tmp_path / "q.jsonl", "no space left on device", "1.50 GB free"):
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


def _readers(root: Path) -> dict:
    """Each place a file is read where a regular one is expected: (the path it reads, how to read it)."""
    from llasmol.data.smolinstruct import SMolInstructSplit
    from llasmol.finetune.resume import resolve_resume
    from llasmol.inference.predictions import read_predictions

    tasks = ["name_conversion-s2f"]
    return {
        "raw data file": (root / "raw" / "train" / "name_conversion-s2f.jsonl",
                          lambda: SMolInstructSplit(root, "train", tasks)),
        "template": (root / "template" / "instruction_tuning" / "name_conversion-s2f.json",
                     lambda: SMolInstructSplit(root, "train", tasks)),
        "sample list": (root / "sample" / "instruction_tuning" / "train" / "name_conversion-s2f.json",
                        lambda: SMolInstructSplit(root, "train", tasks)),
        "predictions file": (root / "p.jsonl", lambda: read_predictions(root / "p.jsonl")),
        "ckpt_path": (root / "x.ckpt", lambda: resolve_resume(str(root / "x.ckpt"), root / "run", "tiny", "attn")),
    }


@pytest.mark.parametrize("reader", ["raw data file", "template", "sample list", "predictions file", "ckpt_path"])
@pytest.mark.parametrize("node", ["fifo", "device", "loop", "dangling", "missing"])
def test_a_file_that_is_not_a_regular_one_is_named_for_what_it_is(tmp_path, reader, node):
    """A FIFO or /dev/zero would block or never end where a file is read, a symbolic link loop is no missing
    file: each is one line saying what the path is, and nothing is opened."""
    from smolinstruct_fixture import write_smolinstruct

    root = write_smolinstruct(tmp_path / "smol")
    path, read = _readers(root)[reader]
    path.unlink(missing_ok=True)
    if node == "fifo":
        os.mkfifo(path)
        said = "is a named pipe (FIFO), not a regular file"
    elif node == "device":
        path.symlink_to("/dev/zero")
        said = "is a character device (through a symbolic link), not a regular file"
    elif node == "loop":
        path.symlink_to(path.with_name("other"))
        path.with_name("other").symlink_to(path)
        said = "is a symbolic link loop"
    elif node == "dangling":
        path.symlink_to(tmp_path / "gone")
        said = f"is a symbolic link to {tmp_path / 'gone'}, which does not exist"
    else:
        said = "does not exist"
    with refused(path, said):
        read()


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_atomic_writes_never_replace_a_node_that_is_not_a_regular_file(tmp_path, writer):
    import stat

    nodes = _special_nodes(tmp_path)
    before = {path: os.lstat(path) for path in nodes.values()}
    data, _ = WRITERS[writer]
    for kind, path in nodes.items():
        with refused(f"{path} is {kind}", "regular file"):
            getattr(files, writer)(path, data)
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


WRITER = """
import sys, time
from llasmol.core.files import write_jsonl
def records():
    for i in range(10**6):
        if i == 50:
            print("writing", flush=True)
        time.sleep(0.001)
        yield {"i": i, "text": "x" * 100}
write_jsonl(sys.argv[1], records())
"""


def test_a_kill_while_writing_predictions_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "predictions" / "val.jsonl"
    target.parent.mkdir()
    target.write_text('{"old": true}\n')
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(0.2)
    proc.kill()
    proc.wait()
    assert target.read_text() == '{"old": true}\n'
    # The partial data only ever lived in a hidden temporary file, never under the real name.
    assert [p.name for p in target.parent.iterdir() if not p.name.startswith(".")] == ["val.jsonl"]


def test_checkpoints_are_written_through_a_rename_in_their_own_folder(tmp_path, monkeypatch):
    from llasmol.finetune.checkpointing import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    target = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"w": torch.ones(2)}, target)
    before = target.read_bytes()

    def dies_halfway(obj, fh):
        fh.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"w": torch.zeros(2)}, target)
    assert target.read_bytes() == before  # the old checkpoint, whole
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_written_files_and_adapter_folders_respect_the_umask(tmp_path):
    """Atomic writes go through mkstemp/mkdtemp (0600/0700); under a 022 umask a plain open gives 0644."""
    import stat

    from llasmol.core.files import write_json
    from llasmol.model.adapters import save_adapter_atomically

    class Saver:
        def save_pretrained(self, folder, state_dict=None, **kwargs):
            (Path(folder) / "adapter_config.json").write_text("{}")

    old = os.umask(0o022)
    try:
        write_json(tmp_path / "m.json", {"a": 1})
        save_adapter_atomically(Saver(), tmp_path / "x.adapter")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "x.adapter").stat().st_mode) == 0o755


def _mounted_tmpfs(folder: Path, options: str) -> None:
    folder.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small file system here ({mount.stderr.decode().strip()[:80]})")


@pytest.mark.slow
def test_a_full_disk_ends_training_with_one_line_naming_the_file(tmp_path):
    small = tmp_path / "small"
    _mounted_tmpfs(small, "size=700k")  # room for the run's logs and an adapter, not for a checkpoint
    try:
        run = small / "run"
        proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", "logger=csv", "trainer.enable_progress_bar=false",
                        "trainer.max_steps=2", "val_every_n_steps=1000"], tmp_path)
        line = error_line(proc, f"{run}/checkpoints/last.ckpt", "no space left", "0.00 GB free", "hydra.run.dir=")
        assert line in (run / "train.log").read_text()  # the log says why the run ended
        assert not [p.name for p in (run / "checkpoints").iterdir()]  # no temporaries, no adapter without its .ckpt
    finally:
        subprocess.run(["umount", str(small)])


@pytest.mark.slow
def test_a_read_only_run_folder_is_one_line_before_hydra_writes(tmp_path):
    frozen = tmp_path / "frozen"
    _mounted_tmpfs(frozen, "size=100k,ro")
    try:
        for command in (["llasmol.train"], ["llasmol.evaluate", "ckpt=none"], ["llasmol.audit"]):
            refused_cli([*command, f"hydra.run.dir={frozen}/run"], tmp_path, f"{frozen}/run", "read-only")
    finally:
        subprocess.run(["umount", str(frozen)])


def _fill(folder: Path) -> None:
    """Take every free byte of the file system `folder` is on."""
    with open(folder / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


@pytest.mark.slow
def test_every_command_meets_a_full_disk_with_one_line(tmp_path):
    """Hydra writes the run's config before any of our code runs: a full disk is refused before that, for
    every command with a run folder; report's files go through the atomic writer and name the file."""
    from test_analysis import write_run

    full = tmp_path / "full"
    _mounted_tmpfs(full, "size=300k")
    run = write_run(tmp_path / "run")
    try:
        _fill(full)
        for command in (["llasmol.train"], ["llasmol.evaluate", f"predictions={tmp_path}/none.jsonl"],
                        ["llasmol.baseline", "method=rdkit"], ["llasmol.audit"]):
            refused_cli([*command, f"hydra.run.dir={full}/run"], tmp_path, f"{full}/run", "no space left", "0.00 GB free")
            assert not (full / "run").exists()
        refused_cli(["llasmol.report", str(run), "--out", str(full / "report")], tmp_path, f"--out {full}/report",
                    "no space left", "0.00 GB free")
        assert not (full / "report").exists()  # refused before its folder or any chart
    finally:
        subprocess.run(["umount", str(full)])


def test_report_out_naming_a_file_is_one_line(tmp_path, capsys):
    from test_analysis import write_run

    from llasmol.report import main as report_main

    run = write_run(tmp_path / "run")
    taken = tmp_path / "taken.md"
    taken.write_text("mine")
    for out in (taken, taken / "sub" / "report"):  # a folder under a file cannot be made either
        with pytest.raises(SystemExit) as stop:
            report_main([str(run), "--out", str(out)])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and f"--out {out} " in err and f"{taken} is a file" in err
    assert taken.read_text() == "mine"
    assert report_main([str(run), "--out", str(tmp_path / "again")])  # a fresh folder: written
    assert report_main([str(run), "--out", str(tmp_path / "again")])  # an existing report: overwritten cleanly


def test_temporaries_of_dead_writers_are_removed_and_those_of_live_ones_kept(tmp_path):
    from llasmol.core.files import remove_stale_temporaries, write_json

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(dead.stdout), os.getpid()
    (tmp_path / "checkpoints" / f".last.adapter.{dead_pid}.ab_c1234").mkdir(parents=True)
    (tmp_path / "checkpoints" / f".last.adapter.{dead_pid}.ab_c1234" / "adapter_model.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "checkpoints" / f".last.ckpt.{dead_pid}.q1w2e3r4.tmp").write_bytes(b"y" * 5)
    (tmp_path / "predictions").mkdir()
    (tmp_path / "predictions" / f".val.jsonl.{live_pid}.q1w2e3r4.tmp").write_text("live")
    # A number no process can have (os.kill overflows) is not known dead: its file stays.
    kept = ["notes.txt", ".hidden", f".last.ckpt.{dead_pid}.tmp", "last.ckpt",
            ".last.ckpt.99999999999999999999.q1w2e3r4.tmp"]
    for name in kept:
        (tmp_path / "checkpoints" / name).write_text("mine")
    write_json(tmp_path / "metrics.json", {"a": 1})  # a finished write leaves no temporary

    removed, size = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [f".last.adapter.{dead_pid}.ab_c1234", f".last.ckpt.{dead_pid}.q1w2e3r4.tmp"]
    assert size == 15
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == sorted(kept)
    assert (tmp_path / "predictions" / f".val.jsonl.{live_pid}.q1w2e3r4.tmp").read_text() == "live"


def test_a_full_disk_or_read_only_folder_is_a_user_error_naming_the_file(tmp_path, monkeypatch):
    import errno

    from llasmol.core.files import write_json

    for code, words in ((errno.ENOSPC, "no space left on device ("), (errno.EROFS, "read-only file system;"),
                        (errno.EDQUOT, "disk quota exceeded (")):
        def full(fd, code=code):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "fsync", full)
        with refused(tmp_path / "m.json", words):
            write_json(tmp_path / "m.json", {"a": 1})
        assert list(tmp_path.iterdir()) == []  # the temporary went with the error
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):  # a failing disk is not a user's mistake: it stays loud
        write_json(tmp_path / "m.json", {"a": 1})


def _statvfs_saying(monkeypatch, folder: Path, **facts) -> None:
    """`os.statvfs(folder)` as a read-only, full or virtual file system would answer (others: the real one)."""
    from types import SimpleNamespace

    real = os.statvfs
    said = {"f_flag": 0, "f_bavail": 1 << 30, "f_frsize": 4096, "f_blocks": 1 << 30, **facts}
    said.setdefault("f_bfree", said["f_bavail"])  # shutil.disk_usage reads it
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(**said) if str(p) == str(folder) else real(p))


@pytest.mark.parametrize("case, named", [
    ("virtual", ["/proc/x.json", "virtual file system"]),
    ("under a file", ["notes.txt", "not a folder"]),
    ("full", ["out/m.json", "no space left", "0.00 GB free"]),
    ("read-only", ["out/m.json", "read-only file system"]),
    ("fifo", ["m.json", "named pipe (FIFO)"]),
])
def test_an_evaluation_target_that_cannot_be_written_is_refused_before_any_scoring(tmp_path, monkeypatch, case,
                                                                                   named):
    """`evaluate output=<full disk>` once scored 3,000 captions for 130 s before failing: every file the
    evaluation will write is checked first (space, permission, kind), and the scorer never runs."""
    from llasmol.evaluate import evaluate
    from llasmol.inference import pipeline

    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"task": "forward_synthesis", "input": "CCO", "gold": "CCO",
                                       "predictions": ["CCO"]}) + "\n")
    (tmp_path / "out").mkdir()
    output = tmp_path / "out" / "m.json"
    if case == "virtual":
        output = Path("/proc/x.json")
    elif case == "under a file":
        (tmp_path / "notes.txt").write_text("mine")
        output = tmp_path / "notes.txt" / "m.json"
    elif case == "full":
        _statvfs_saying(monkeypatch, tmp_path / "out", f_bavail=10)
    elif case == "read-only":
        _statvfs_saying(monkeypatch, tmp_path / "out", f_flag=os.ST_RDONLY)
        monkeypatch.setattr(os, "access", lambda p, mode, real=os.access: False if str(p) == str(tmp_path / "out")
                            else real(p, mode))
    else:
        os.mkfifo(output)
    scored = []
    monkeypatch.setattr(pipeline.Evaluation, "finish", lambda self, records: scored.append(records))
    cfg = compose_config([f"predictions={predictions}", f"output={output}", f"paths.output_dir={tmp_path / 'run'}"],
                         "evaluate")
    with refused(*named):
        evaluate(cfg)
    assert scored == []


@pytest.mark.parametrize("node", ["loop", "dangling"])
def test_an_adapter_path_that_is_a_broken_link_is_named_so_not_as_holding_no_adapter(tmp_path, node):
    from llasmol.inference.loading import resolve_checkpoint

    link = tmp_path / "adapter"
    link.symlink_to(tmp_path / ("other" if node == "loop" else "gone"))
    if node == "loop":
        (tmp_path / "other").symlink_to(link)
    with refused(f"ckpt={link}", "symbolic link loop" if node == "loop" else "which does not exist"):
        resolve_checkpoint(str(link), compose_config([], "evaluate"))


def test_a_path_that_is_no_regular_file_is_refused_before_the_work_that_would_write_it(tmp_path):
    """check_writable_file, asked before hours of generation: a FIFO or a device in the way is said now, as the
    atomic write would say it only at the end."""
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    with refused(f"output={fifo} is a named pipe (FIFO), not a regular file", "name a new file"):
        files.check_writable_file(fifo, "output")
    device = tmp_path / "dev.jsonl"
    device.symlink_to("/dev/null")
    with refused(f"{device} is a character device"):
        files.check_writable_file(device)
    files.check_writable_file(tmp_path / "new.jsonl")  # a new path in a writable folder: fine


def test_a_second_log_file_starts_each_session_with_its_command(tmp_path, monkeypatch):
    """log_also_to: the run folder's shared log (evaluate.log) heads each session with the command that ran,
    then takes every later line; a file a handler writes already gets nothing twice."""
    import logging
    import shlex

    from llasmol.core.log_files import log_also_to

    root = logging.getLogger()
    before = list(root.handlers)
    monkeypatch.setattr(sys, "argv", ["evaluate.py", "ckpt=/r", "data.split=test"])
    path = tmp_path / "evaluate.log"
    try:
        log_also_to(path, "llasmol.evaluate")
        log_also_to(path, "llasmol.evaluate")  # already written by a handler: not added again
        logging.getLogger("llasmol.x").warning("a later line")
    finally:
        for handler in root.handlers[len(before):]:
            handler.close()
        root.handlers[:] = before
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith(shlex.join(["python", "-m", "llasmol.evaluate", "ckpt=/r",
                                                               "data.split=test"]))
    assert lines[1].endswith("a later line")


@pytest.mark.parametrize("text, said", [
    ("[1, 2]", "holds a JSON list, not a run's facts: restore it"),
    ('"text"', "holds a JSON str, not a run's facts: restore it"),
    ("7", "holds a JSON int, not a run's facts: restore it"),
    ("null", "holds a JSON NoneType, not a run's facts: restore it"),
    ('{\n  "a": 1,\n}', "is not valid JSON (Expecting property name enclosed in double quotes at line 3): restore it"),
    ('{"a": "' + "x" * 40 + '"}', "is larger than a run's facts can be (32 bytes at most): restore it"),
])
def test_read_json_names_what_the_file_holds_against_what_was_expected(tmp_path, text, said):
    from llasmol.core.files import read_json

    path = tmp_path / "facts.json"
    path.write_text(text)
    with refused(f"{path} {said}"):
        read_json(path, "restore it", dict, "a run's facts", limit=32)
    path.write_text('{"a": [1]}')
    assert read_json(path, "restore it", dict, "a run's facts", limit=32) == {"a": [1]}
