"""The run folder (`llasmol.core.run_lock`, `llasmol.core.run_dir`, `llasmol.finetune.preflight`): one
training at a time holds it, a finished run in it is not replaced unless asked, and what a run cannot do on
this machine is said before anything is written there."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import HANG_TIMEOUT, QUICK, compose_config
from refusals import error_line, refused, refused_cli, run_cli

HOLDER = """
import sys, time
from llasmol.core.run_lock import hold_run_lock
hold_run_lock(sys.argv[1], *sys.argv[2:])
print("holding", flush=True)
time.sleep(600)
"""


def test_a_run_directory_lock_is_exclusive_and_dies_with_its_holder(tmp_path):
    from llasmol.core.run_lock import check_run_lock, hold_run_lock

    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        for attempt in (hold_run_lock, check_run_lock):
            with refused(run, f"pid {holder.pid}"):
                attempt(run)
    finally:
        holder.kill()  # no chance to clean up: the kernel releases the lock
        holder.wait()
    check_run_lock(run)
    hold_run_lock(run)  # free again
    hold_run_lock(run)  # and taking it twice in one process is not a conflict


@pytest.mark.slow
def test_a_second_run_into_a_busy_directory_stops_before_touching_it(tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={run}", "logger=csv",
                              "trainer.max_steps=400", "trainer.enable_progress_bar=false", "seed=1"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.time() + HANG_TIMEOUT
        while time.time() < deadline and first.poll() is None and not (
                (run / ".lock").is_file() and (run / ".lock").read_text()):
            time.sleep(0.05)
        config = (run / ".hydra" / "overrides.yaml").read_text()
        refused_cli(["llasmol.train", f"hydra.run.dir={run}", "logger=csv", "seed=2"], tmp_path, run, f"pid {first.pid}")
        assert (run / ".hydra" / "overrides.yaml").read_text() == config  # the first run's config, untouched
        assert "is in use" not in (run / "train.log").read_text()  # its Hydra never started there
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.wait()


def test_claiming_a_run_folder_locks_it_and_clears_what_a_killed_run_left(tmp_path, caplog):
    """What train does first (in-process): the folder is this process's alone, and a dead writer's temporary
    is gone with a line in the log."""
    from llasmol.finetune.preflight import claim_run_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "run" / "checkpoints" / f".last.ckpt.{int(dead.stdout)}.q1w2e3r4.tmp"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"y" * 5)
    with caplog.at_level("WARNING", logger="llasmol.train"):
        assert claim_run_dir(tmp_path / "run") == tmp_path / "run"
    assert not stale.exists() and "removed 1 temporary file(s)" in caplog.text
    other = subprocess.run([sys.executable, "-c", "import sys; from llasmol.core.run_lock import check_run_lock; "
                            "check_run_lock(sys.argv[1])", str(tmp_path / "run")], capture_output=True, text=True,
                           timeout=HANG_TIMEOUT)
    assert other.returncode != 0 and f"{tmp_path / 'run'}" in other.stderr and f"(pid {os.getpid()}" in other.stderr


def _finished_run(folder: Path) -> Path:
    """What a finished training leaves that a fresh start would replace (no training: the check reads names)."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"old")
    (folder / "result.json").write_text('{"global_step": 800}')
    return folder


def test_a_fresh_start_in_a_folder_holding_a_run_is_refused_unless_asked(tmp_path):
    from llasmol.core.config import command_line_values
    from llasmol.core.run_lock import check_fresh_start

    run = _finished_run(tmp_path / "run")
    with refused(run, "ckpt_path=last", "hydra.run.dir=", "overwrite=true"):
        check_fresh_start(run, None, False)
    for ckpt_path, overwrite in (("last", False), ("auto", False), (None, True)):
        check_fresh_start(run, ckpt_path, overwrite)  # resuming, or said explicitly
    with refused(run, "overwrite=true"):
        check_fresh_start(run, None, "maybe")  # only a real true says so
    check_fresh_start(tmp_path / "new", None, False)
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "train.log").write_text("error: a typo")  # a start that stopped before training
    check_fresh_start(tmp_path / "started", None, False)
    # A sweep's folder holding a finished job; a run killed before its first checkpoint cannot be resumed.
    sweep = tmp_path / "sweep"
    _finished_run(sweep / "1_tiny_attn")
    for first_job in (0, 1):
        with refused(sweep / "1_tiny_attn"):
            check_fresh_start(sweep, None, False, first_job)
    check_fresh_start(sweep, None, False, 2)  # the jobs a stopped sweep had not started: numbered from 2 on
    # A folder in a sweep's folder not named as a job (`<number>_...`) counts as its first job.
    other = tmp_path / "other"
    _finished_run(other / "notes")
    with refused(other / "notes"):
        check_fresh_start(other, None, False, 0)
    check_fresh_start(other, None, False, 1)
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "params.json").write_text("{}")
    with refused(tmp_path / "early", "overwrite=true") as seen:
        check_fresh_start(tmp_path / "early", None, False)
    assert "ckpt_path=last" not in seen.message  # nothing to continue
    defaults = {"ckpt_path": None, "overwrite": False}
    assert command_line_values(["hydra.run.dir=x", "ckpt_path=last"], defaults) == {"ckpt_path": "last",
                                                                                      "overwrite": False}
    assert command_line_values(["overwrite=true", "ckpt_path=null"], defaults) == {"ckpt_path": None,
                                                                                     "overwrite": True}


def test_a_multirun_into_a_sweep_folder_holding_its_first_job_is_refused_before_hydra_starts(tmp_path):
    """The check runs in the command's first lines (rank 0 only), with `first_job` 0 unless given: job 0's
    finished run is not replaced by a new sweep into its folder. (--cfg job: were the check passed, Hydra
    would print the config and exit 0, running nothing.)"""
    sweep = tmp_path / "sweep"
    _finished_run(sweep / "0_tiny_lite")
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    proc = run_cli(["llasmol.train", "--multirun", f"hydra.sweep.dir={sweep}", "lora=lite,attn", "--cfg", "job"],
                   tmp_path)
    error_line(proc, sweep / "0_tiny_lite")
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before
    # The jobs after it (first_job=1, as a stopped sweep's continue command says) pass the check.
    # (--cfg job cannot go with --multirun: the check reads the same line either way)
    proc = run_cli(["llasmol.train", f"hydra.sweep.dir={sweep}", "lora=attn", "first_job=1", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0 and "first_job: 1" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.slow
def test_train_into_a_finished_run_stops_before_hydra_writes_there(tmp_path):
    """The command line is refused before Hydra writes .hydra/ (or anything else) into the finished run."""
    run = _finished_run(tmp_path / "run")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", *QUICK], tmp_path)
    error_line(proc, run, "ckpt_path=last")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # Said explicitly, the command line passes the check (--cfg job: composed and printed, nothing run).
    proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", "overwrite=true", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0 and "overwrite: true" in proc.stdout, proc.stderr[-2000:]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def _open_fds(path) -> int:
    """This process's open descriptors of `path` (others' threads may open and close files meanwhile)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:  # closed since it was listed
            pass
    return count


def test_a_lock_held_by_an_unnamed_holder_is_refused_in_one_line_without_leaking(tmp_path, monkeypatch):
    """flock locks belong to an open file, so a second open in this process conflicts like another process
    would. A lock file that does not say who holds it still gives the one-line refusal; the refusals close what
    they opened."""
    import fcntl

    from llasmol.core.run_lock import check_run_lock, hold_run_lock

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("not json")
    fd = os.open(run / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        before = _open_fds(run / ".lock")
        for attempt in (hold_run_lock, check_run_lock):
            with refused(run, "another process", "hydra.run.dir"):
                attempt(run)
        assert _open_fds(run / ".lock") == before == 1  # the test's own descriptor only
        # The holder named in the file, its start time in local time.
        monkeypatch.setenv("TZ", "UTC")
        time.tzset()
        (run / ".lock").write_text(json.dumps({"pid": 7, "host": "node3", "started": 86400 + 3661}))
        with refused("pid 7 on node3, started 1970-01-02 01:01:01"):
            check_run_lock(run)
    finally:
        os.close(fd)
        monkeypatch.undo()  # TZ as it was, and the process's time zone read again
        time.tzset()
    check_run_lock(run)  # released: free again
    check_run_lock(None)  # nothing to check
    check_run_lock(tmp_path / "new")  # no lock file: nothing opened
    assert not (tmp_path / "new").exists()


def test_a_taken_lock_names_this_process_in_a_file_readable_by_all(tmp_path, monkeypatch):
    """A longer text left in the lock file by an earlier holder is replaced whole; the file is created
    rw-rw-rw- less the umask, like any file the package writes."""
    from llasmol.core import run_lock
    from llasmol.core.run_lock import hold_run_lock

    held = {}
    monkeypatch.setattr(run_lock, "_held", held)  # this test's locks, released at its end

    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(json.dumps({"pid": 1, "host": "x" * 500, "started": 0}))
    hold_run_lock(run)
    info = json.loads((run / ".lock").read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert abs(info["started"] - time.time()) < 600
    fresh = tmp_path / "fresh" / "deeper"
    hold_run_lock(fresh)  # the folder is made
    umask = os.umask(0)
    os.umask(umask)
    assert (fresh / ".lock").stat().st_mode & 0o777 == 0o666 & ~umask
    for fd in held.values():
        os.close(fd)


def test_a_fresh_start_counts_every_job_folder_by_default_or_for_a_sweep_of_first_jobs(tmp_path):
    from llasmol.core.run_lock import check_fresh_start

    sweep = tmp_path / "sweep"
    _finished_run(sweep / "0_tiny_attn")
    for args in ((), (0,), ("1,2",)):  # the default and a sweep over first_job (not one number) start from job 0
        with refused(sweep / "0_tiny_attn"):
            check_fresh_start(sweep, None, False, *args)
    check_fresh_start(sweep, None, False, 1)


def test_only_rank_0_locks_and_tidies_the_run_folder(tmp_path, monkeypatch):
    """Every DDP process makes sure the folder exists; the lock and the tidying are rank 0's, once."""
    from lightning.pytorch.utilities import rank_zero_only

    from llasmol.finetune import preflight

    done = []
    monkeypatch.setattr(preflight, "hold_run_lock", lambda out: done.append(("lock", out)))
    monkeypatch.setattr(preflight, "tidy_run_dir", lambda out: done.append(("tidy", out)) or [])
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert preflight.claim_run_dir(str(tmp_path / "a" / "run")) == tmp_path / "a" / "run"
    assert (tmp_path / "a" / "run").is_dir() and done == []
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    preflight.claim_run_dir(tmp_path / "a" / "run")
    assert done == [("lock", tmp_path / "a" / "run"), ("tidy", tmp_path / "a" / "run")]


@pytest.mark.parametrize("override, message", [
    ("+logger.w={_target_:llasmol.finetune.tracking.WandbLogger,log_model:true,offline:true}", "logger.w.log_model=True"),
])  # packing a base that cannot pack: train's, before the base's files (tests/test_packing.py)
def test_the_preflight_check_names_what_this_machine_cannot_run(override, message, monkeypatch):
    from llasmol.core.config import compose_config
    from llasmol.finetune.preflight import check_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose_config(["paths.output_dir=/x", "logger=csv", *override.split()])
    with refused(message):
        check_run(cfg)
    check_run(compose_config(["paths.output_dir=/x", "logger=csv"]))  # the default run: fine


def test_a_second_evaluation_into_a_busy_folder_is_one_line_naming_the_first(trained_run, tmp_path):
    """Two evaluations into one folder would leave one's predictions beside the other's metrics: the second
    stops before its model loads, naming the first, and writes nothing there."""
    from llasmol.evaluate import evaluate

    folder = tmp_path / "eval"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), "evaluate"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        cfg = compose_config([f"paths.output_dir={folder}", f"ckpt={trained_run}", "data.split=test",
                              "data.max_samples_per_task={test: 1}", "generation.max_new_tokens_limit=2"], "evaluate")
        with refused(f"{folder} is in use by another llasmol.evaluate", f"pid {holder.pid}", "hydra.run.dir"):
            evaluate(cfg)
        assert sorted(p.name for p in folder.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    evaluate(cfg)  # free again once the first has ended
    assert (folder / "predictions" / "test.jsonl").is_file()
    # A run's whole split is answered into the run's folder, whatever hydra.run.dir says: the way round is a part.
    run = tmp_path / "run"  # a copy: this process holds the lock of the run it trained
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns(".lock"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run), "evaluate"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        whole = compose_config([f"paths.output_dir={tmp_path / 'other'}", f"ckpt={run}", "data.split=test"],
                               "evaluate")
        with refused(f"{run} is in use by another llasmol.evaluate", "data.tasks=[...]",
                     "data.max_samples_per_task", "answered into the run's folder"):
            evaluate(whole)
    finally:
        holder.kill()
        holder.wait()
