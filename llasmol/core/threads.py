"""The CPU threads of a command that runs a model: how many intra-op threads, and how OpenMP threads wait.

torch runs each CPU op on one thread per core, and its OpenMP threads meet at a barrier after every op. libgomp's
waiting threads spin a while before they sleep. On cores nobody else uses that is the fastest wait (a passive
wait, which sleeps at once, costs 1.7x per step on 2 quiet cores); beside other work it is the slowest: the
thread that arrives first spins on a core its late partner needs (3,000 tokens/s against 8,000 passively and
10,700 on one thread beside one busy process; bench/cpu_threads.py, BENCHMARKS.md section 13). So the default (`wait_policy: auto`)
spins as the runtime does, but only on the cores other work leaves free: it counts them while torch loads and,
in training, every `RETUNE_EVERY_S` seconds (`retune_threads`), and runs one thread per free core.

OpenMP reads its wait policy once, when torch loads it, so `use_cpu_threads` runs before anything imports torch
(each command's first step); where torch is loaded already (a notebook, a test calling `train` in-process) only
the thread count can still change.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from typing import Any, Mapping, Optional

from llasmol.core.errors import UserError

log = logging.getLogger(__name__)

MAX_THREADS = 1024  # the most intra-op threads a process takes, from cpu.threads or OMP_NUM_THREADS
WAIT_POLICIES = {"passive": "PASSIVE", "active": "ACTIVE"}  # conf/cpu wait_policy -> OMP_WAIT_POLICY
RETUNE_EVERY_S = 5.0  # how often training recounts the free cores under wait_policy: auto


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's, taskset's or SLURM's limit),
    not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def thread_count(threads: Optional[int], environ: Mapping[str, str] = os.environ) -> int:
    """`threads`, or for null: OMP_NUM_THREADS where a launcher set it (Lightning's DDP on CPUs gives each
    process its share that way), else one per usable core. An OMP_NUM_THREADS that is no count from 1 to
    MAX_THREADS is one line: OpenMP ignores a malformed one with a warning, and 100,000,000 threads ended the
    first step with a segmentation fault."""
    if threads is not None:
        return int(threads)
    raw = environ.get("OMP_NUM_THREADS", "")
    if not raw.strip():
        return usable_cores()  # set empty (`export OMP_NUM_THREADS=$N` with N unset): as if unset, as OpenMP takes it
    # As OpenMP reads it: spaces around the number, and of a nested list ("4,2") the outermost level's.
    given = raw.split(",")[0].strip()
    if not (given.isdigit() and 1 <= int(given) <= MAX_THREADS):
        raise UserError(f"OMP_NUM_THREADS={raw!r} is no thread count from 1 to {MAX_THREADS}: unset it (one "
                        "thread per usable core), or give a whole number, e.g. OMP_NUM_THREADS=4")
    return int(given)


def wait_policy_env(wait_policy: str) -> dict[str, str]:
    """The environment that sets OpenMP's wait policy (nothing for `inherit`)."""
    return {"OMP_WAIT_POLICY": WAIT_POLICIES[wait_policy]} if wait_policy in WAIT_POLICIES else {}


class OtherWork:
    """How many of this process's usable cores other processes kept busy since the last look: the busy time of
    those cores (/proc/stat) less this process's own CPU time, over the wall time. None where /proc/stat is
    not there (macOS, Windows) or cannot be read."""

    def __init__(self) -> None:
        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._mark = self._now()

    def _now(self) -> Optional[tuple[float, float, float]]:
        """(busy seconds of our cores, this process's CPU seconds, wall seconds), or None."""
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        wanted = {f"cpu{c}" for c in self.cores}
        busy = 0.0
        for line in lines:
            fields = line.split()
            if fields and fields[0] in wanted and len(fields) >= 5:
                values = [int(v) for v in fields[1:8]]
                busy += sum(values) - values[3] - (values[4] if len(values) > 4 else 0)  # all but idle, iowait
        own = os.times()
        return busy / tick, own.user + own.system, time.monotonic()

    def cores_busy(self) -> Optional[float]:
        """Cores other processes held since the last call (or since this object was made), then a new mark."""
        before, now = self._mark, self._now()
        self._mark = now
        if before is None or now is None or now[2] - before[2] < 0.05:
            return None
        return max(0.0, ((now[0] - before[0]) - (now[1] - before[1])) / (now[2] - before[2]))


def free_cores(busy: Optional[float], usable: int) -> int:
    """One thread per usable core that other work leaves free (a core counts as taken from half a core's use);
    at least one."""
    if busy is None:
        return usable
    return max(1, usable - math.floor(busy + 0.5))


_watch: Optional[OtherWork] = None  # set by use_cpu_threads under wait_policy: auto with no thread count set


def use_cpu_threads(cpu: Optional[Mapping[str, Any]]) -> int:
    """Apply a command's `cpu` settings (conf/cpu/): the wait policy first, while torch is not yet loaded,
    then the intra-op thread count. Returns the thread count."""
    global _watch
    cpu = cpu or {"threads": None, "wait_policy": "inherit"}
    wanted = wait_policy_env(cpu["wait_policy"])
    # auto with no count set, no launcher's count, and a wait that spins (an inherited OMP_WAIT_POLICY=PASSIVE, as
    # the test suite sets, never holds a core): the other work is measured over torch's import (about a second)
    counting = (cpu["wait_policy"] == "auto" and cpu["threads"] is None and thread_count(None) == usable_cores()
                and os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE")
    watch = OtherWork() if counting else None
    if "torch" not in sys.modules:
        os.environ.update(wanted)
    elif wanted and os.environ.get("OMP_WAIT_POLICY") != wanted["OMP_WAIT_POLICY"]:
        log.debug("cpu.wait_policy=%s not applied: torch was loaded before the command started",
                  cpu["wait_policy"])
    import torch  # here, after the wait policy: this import is what starts OpenMP

    n = thread_count(cpu["threads"])
    if watch is not None:
        busy = watch.cores_busy()  # None when torch was loaded already (no import to measure over): every core
        n = free_cores(busy, n)
        if n < usable_cores():
            log.info("other work holds %.1f of this process's %d cores: %d thread(s) (cpu.wait_policy=auto)",
                     busy, usable_cores(), n)
    _watch = watch
    torch.set_num_threads(n)
    return n


def wait_description(cpu: Optional[Mapping[str, Any]], environ: Mapping[str, str] = os.environ) -> str:
    """How OpenMP threads wait under `cpu` (conf/cpu/), for the run's log: the policy, and the environment's
    OMP_WAIT_POLICY where the policy leaves it in force (auto, inherit)."""
    policy = (cpu or {}).get("wait_policy", "inherit")
    given = environ.get("OMP_WAIT_POLICY")
    if policy in WAIT_POLICIES:
        return policy
    if given:
        return f"{policy} (OMP_WAIT_POLICY={given} from the environment)"
    return f"{policy} (the runtime's: spin, then sleep)"


def retune_threads() -> Optional[int]:
    """Under wait_policy: auto, the thread count for the cores other work leaves free now, set when it changed;
    called as training goes (at most once per `RETUNE_EVERY_S`). Returns the new count, or None for no change."""
    if _watch is None or _watch._mark is None or time.monotonic() - _watch._mark[2] < RETUNE_EVERY_S:
        return None
    if os.environ.get("OMP_NUM_THREADS"):  # a launcher divided the cores among its processes (Lightning's DDP)
        return None
    import torch

    n = free_cores(_watch.cores_busy(), usable_cores())
    if n == torch.get_num_threads():
        return None
    log.info("other work on this process's cores changed: %d thread(s) from now (cpu.wait_policy=auto)", n)
    torch.set_num_threads(n)
    return n
