"""CPU threads (conf/cpu/, llasmol.core.threads): the wait policy reaches OpenMP before torch loads it, the
thread count follows the setting, the launcher or the cores this process may use."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import HANG_TIMEOUT, compose_config
from refusals import refused
from llasmol.core.schema import check_config
from llasmol.core.threads import thread_count, usable_cores

# A fresh interpreter (OpenMP reads its wait policy once, when torch loads it): the command's first step,
# then one parallel op; libgomp prints its settings at start-up with OMP_DISPLAY_ENV=VERBOSE.
CHILD = """
import logging, os, sys
logging.basicConfig(level=logging.INFO)
from llasmol.core.config import compose_config
from llasmol.core.threads import use_cpu_threads
cfg = compose_config(sys.argv[1:])
n = use_cpu_threads(cfg.cpu)
import torch
torch.ones(1 << 16).sum()
print("threads", n, torch.get_num_threads())
"""


def run_child(*overrides: str, affinity: set | None = None, **env: str) -> tuple[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    code = CHILD if affinity is None else f"import os; os.sched_setaffinity(0, {affinity!r})\n" + CHILD
    proc = subprocess.run([sys.executable, "-c", code, *overrides], capture_output=True, text=True,
                          env={**environ, "OMP_DISPLAY_ENV": "VERBOSE", **env}, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("policy,spin", [("passive", "0"), ("active", "30000000000"), ("inherit", "300000"),
                                         ("auto", "300000")])
def test_the_wait_policy_reaches_openmp(policy, spin):
    # libgomp's own default (inherit or auto, nothing set) spins 300,000 times before sleeping; passive never spins.
    _, err = run_child(f"cpu.wait_policy={policy}", "cpu.threads=1")
    assert f"GOMP_SPINCOUNT = '{spin}'" in err


def test_inherit_and_auto_leave_the_environments_policy():
    for policy in ("inherit", "auto"):
        _, err = run_child(f"cpu.wait_policy={policy}", "cpu.threads=1", OMP_WAIT_POLICY="ACTIVE")
        assert "GOMP_SPINCOUNT = '30000000000'" in err


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="counts busy cores from /proc/stat")
def test_the_default_runs_on_the_cores_other_work_leaves_free():
    """Beside a process that keeps a core busy, the default (wait_policy auto, threads null) runs one thread
    fewer than its usable cores (at least one), with the runtime's own spinning wait."""
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        out, err = run_child()
    finally:
        rival.kill()
        rival.wait()
    assert "GOMP_SPINCOUNT = '300000'" in err
    n, now = map(int, out.split()[1:])
    assert n == now == max(1, usable_cores() - 1) if usable_cores() <= 2 else 1 <= n < usable_cores()
    if usable_cores() > 1:
        assert f"of this process's {usable_cores()} cores: {n} thread(s) (cpu.wait_policy=auto)" in err


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="counts busy cores from /proc/stat")
def test_auto_under_an_inherited_passive_wait_keeps_every_core():
    """Nothing spins under OMP_WAIT_POLICY=PASSIVE (the test suite's): the cores are not counted, so two commands
    started side by side run the same threads and give the same numbers."""
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        out, err = run_child(OMP_WAIT_POLICY="PASSIVE")
    finally:
        rival.kill()
        rival.wait()
    assert "GOMP_SPINCOUNT = '0'" in err and out.split()[1:] == [str(usable_cores())] * 2


def test_the_free_cores_are_the_usable_ones_less_the_busy_ones_rounded_and_never_none():
    from llasmol.core.threads import free_cores

    assert [free_cores(busy, 2) for busy in (None, 0.0, 0.49, 0.5, 1.0, 1.6, 5.0)] == [2, 2, 2, 1, 1, 1, 1]
    assert free_cores(2.6, 8) == 5 and free_cores(0.2, 1) == 1


def test_other_work_is_the_cores_busy_time_less_this_processs_own(monkeypatch):
    """(busy seconds of the cores, own CPU seconds, wall seconds) between two looks: 3 s of the cores busy in
    2 s of which this process used 1 is 1 core of other work; a look too soon, or none, counts nothing."""
    from llasmol.core import threads

    real = threads.OtherWork._now
    marks = iter([(10.0, 1.0, 100.0), (13.0, 2.0, 102.0), (13.0, 2.0, 102.01), None])
    monkeypatch.setattr(threads.OtherWork, "_now", lambda self: next(marks))
    watch = threads.OtherWork()
    assert watch.cores_busy() == pytest.approx(1.0)
    assert watch.cores_busy() is None  # 10 ms later: too short to say
    assert watch.cores_busy() is None  # /proc/stat unreadable
    if os.path.exists("/proc/stat"):  # the real reading: three numbers, CPU seconds not above the wall's
        busy, own, wall = real(watch)
        assert busy >= 0 and 0 <= own and wall > 0


def test_training_recounts_the_free_cores_every_few_seconds(monkeypatch, caplog):
    import logging

    import torch

    from llasmol.core import threads

    before = torch.get_num_threads()
    clock = [1000.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])

    class Watch:
        _mark = (0.0, 0.0, 1000.0)
        busy = [1.0]

        def cores_busy(self):
            self._mark = (0.0, 0.0, clock[0])
            return self.busy[0]

    monkeypatch.setattr(threads, "_watch", Watch())
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    caplog.set_level(logging.INFO, logger="llasmol.core.threads")
    try:
        torch.set_num_threads(2)
        assert threads.retune_threads() is None  # not yet: the last look was now
        clock[0] += threads.RETUNE_EVERY_S
        assert threads.retune_threads() == 1 and torch.get_num_threads() == 1  # a core taken: one thread
        clock[0] += threads.RETUNE_EVERY_S
        assert threads.retune_threads() is None  # the same: nothing changes, nothing said
        Watch.busy[0] = 0.1
        clock[0] += threads.RETUNE_EVERY_S
        assert threads.retune_threads() == 2 and torch.get_num_threads() == 2  # the other work went away
        Watch.busy[0] = 1.0
        clock[0] += threads.RETUNE_EVERY_S
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a launcher divided the cores (DDP): its share stays
        assert threads.retune_threads() is None and torch.get_num_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setattr(threads, "_watch", None)  # any other policy: never a change
        clock[0] += threads.RETUNE_EVERY_S
        assert threads.retune_threads() is None
    finally:
        torch.set_num_threads(before)
    assert [r.getMessage() for r in caplog.records] == [
        "other work on this process's cores changed: 1 thread(s) from now (cpu.wait_policy=auto)",
        "other work on this process's cores changed: 2 thread(s) from now (cpu.wait_policy=auto)"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores and affinity masks")
def test_a_process_limited_to_one_core_gets_one_thread():
    out, _ = run_child(affinity={sorted(os.sched_getaffinity(0))[0]})
    assert out.split()[1:] == ["1", "1"]


def test_without_affinity_masks_the_cores_are_the_machines(monkeypatch):
    """macOS and Windows have no sched_getaffinity: the machine's count, or one where it is unknown."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1


def test_a_set_count_and_a_launchers_count():
    out, _ = run_child("cpu.threads=1")
    assert out.split()[1:] == ["1", "1"]
    assert thread_count(None, {"OMP_NUM_THREADS": "3"}) == 3  # Lightning's DDP on CPUs sets each process's share
    assert thread_count(2, {"OMP_NUM_THREADS": "3"}) == 2
    assert thread_count(2, {"OMP_NUM_THREADS": "x"}) == 2  # cpu.threads set: the environment's count is not read


@pytest.mark.parametrize("override,named", [("cpu.threads=0", ("cpu.threads=0",)),
                                            ("cpu.threads=-2", ("cpu.threads=-2",)),
                                            ("cpu.threads=1025", ("cpu.threads=1025", "<= 1024")),
                                            ("cpu.wait_policy=spin", ("cpu.wait_policy='spin'",))])
@pytest.mark.parametrize("command", ["train", "evaluate", "generate"])
def test_a_bad_cpu_setting_is_one_line(command, override, named):
    extra = ["ckpt=none"] if command == "evaluate" else []  # something to evaluate
    with refused(*named):
        check_config(compose_config([override, *extra], command))
    check_config(compose_config(["cpu.threads=1024", *extra], command))  # the bound itself is allowed


def test_generate_applies_the_thread_count_before_it_answers():
    import torch

    from llasmol.generate import generate

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cfg = compose_config(["cpu.threads=1", "ckpt=none", "generation.max_new_tokens_limit=2",
                              "task=forward_synthesis"], "generate")
        assert len(generate(cfg, "<SMILES> CCO </SMILES>")) >= 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("env", [{}, {"RANK": "1"}, {"LOCAL_RANK": "2", "SLURM_PROCID": "5"}, {"SLURM_PROCID": "3"},
                                 {"JSM_NAMESPACE_RANK": "4"}, {"RANK": "0", "LOCAL_RANK": "1"}])
def test_the_rank_read_before_lightning_loads_is_lightnings(monkeypatch, env):
    from lightning.fabric.utilities.rank_zero import _get_rank

    from llasmol.core.run_lock import RANK_VARIABLES, process_rank

    for key in RANK_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert process_rank() == (_get_rank() or 0)


def test_a_wait_policy_asked_after_torch_loaded_is_said_not_applied(monkeypatch, caplog):
    """In a notebook (torch loaded already) only the thread count can still change; the log says so."""
    import logging

    import torch

    from llasmol.core.threads import use_cpu_threads

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    caplog.set_level(logging.DEBUG, logger="llasmol.core.threads")
    try:
        assert use_cpu_threads({"threads": 1, "wait_policy": "active"}) == 1
    finally:
        torch.set_num_threads(before)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"  # not changed: OpenMP read it already
    assert [r.getMessage() for r in caplog.records] == [
        "cpu.wait_policy=active not applied: torch was loaded before the command started"]


def test_a_launchers_count_must_be_a_positive_integer():
    # "1" is one thread, as a launcher giving each process one core means; empty is unset
    assert thread_count(None, {"OMP_NUM_THREADS": "1"}) == 1
    assert thread_count(None, {"OMP_NUM_THREADS": " "}) == usable_cores()
    assert thread_count(None, {}) == usable_cores()
    assert thread_count("3", {}) == 3


def test_the_wait_policy_env_names_openmps_values():
    from llasmol.core.threads import wait_policy_env

    assert wait_policy_env("passive") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert wait_policy_env("active") == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert wait_policy_env("inherit") == {}


def test_with_torch_loaded_a_policy_already_in_place_or_inherited_says_nothing(monkeypatch, caplog):
    """Only a policy that differs from the environment's is worth a line; no cpu group at all (a notebook
    calling a command's function) is a thread per usable core with the policy inherited."""
    import torch

    from llasmol.core.threads import use_cpu_threads

    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        with caplog.at_level("DEBUG", logger="llasmol.core.threads"):
            assert use_cpu_threads({"threads": 1, "wait_policy": "passive"}) == 1  # already so
            assert torch.get_num_threads() == 1
            assert use_cpu_threads({"threads": 1, "wait_policy": "inherit"}) == 1
            assert use_cpu_threads(None) == usable_cores() == torch.get_num_threads()
        assert caplog.records == [] and os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("given, threads", [(" 3", 3), ("3 ", 3), ("3,1", 3), (" 2 , 1", 2), ("", None), ("1024", 1024)])
def test_a_launchers_count_is_read_as_openmp_reads_it(given, threads):
    """Spaces around the number and a nested list's first level count, as OpenMP takes them; empty is unset."""
    assert thread_count(None, {"OMP_NUM_THREADS": given}) == (threads or usable_cores())


@pytest.mark.slow
def test_a_malformed_count_stops_a_command_before_it_writes_anything(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "100000000"}
    proc = subprocess.run([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=HANG_TIMEOUT)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: OMP_NUM_THREADS='100000000' is no thread count from 1 to 1024: unset it (one thread per usable "
        "core), or give a whole number, e.g. OMP_NUM_THREADS=4"], proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("given", ["0", ",3", "-3", "3.0", "x", "1025", "100000000"])
def test_a_count_that_openmp_would_ignore_or_that_no_machine_has_is_one_line(given):
    """OpenMP ignores a malformed count with a warning (the cores then decide, unsaid); 100,000,000 threads
    ended the first step with a segmentation fault."""
    with refused(f"OMP_NUM_THREADS={given!r}", "from 1 to 1024", "unset it"):
        thread_count(None, {"OMP_NUM_THREADS": given})
