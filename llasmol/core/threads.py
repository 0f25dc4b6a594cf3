"""The CPU threads of a command that runs a model: how many intra-op threads, and how OpenMP threads wait.

torch runs each CPU op on one thread per core, and its OpenMP threads meet at a barrier after every op. By
default libgomp's waiting threads spin before they sleep: on a machine shared with other work, the thread
that arrives first spins on a core the late one needs: beside one busy process, the default job trained
46-557 tokens/s on 2 cores that way and over 3,100 with a passive wait, which gives the core up at once
(bench/cpu_threads.py, BENCHMARKS.md section 13). OpenMP reads its wait policy once, when torch loads it,
so `use_cpu_threads` runs before anything imports torch (each command's first step); where torch is loaded
already (a notebook, a test calling `train` in-process) only the thread count can still change.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping, Optional

log = logging.getLogger(__name__)

WAIT_POLICIES = {"passive": "PASSIVE", "active": "ACTIVE"}  # conf/cpu wait_policy -> OMP_WAIT_POLICY


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a container's, taskset's or SLURM's limit),
    not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def thread_count(threads: Optional[int], environ: Mapping[str, str] = os.environ) -> int:
    """`threads`, or for null: OMP_NUM_THREADS where a launcher set it (Lightning's DDP on CPUs gives each
    process its share that way), else one per usable core."""
    if threads is not None:
        return int(threads)
    given = environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else usable_cores()


def wait_policy_env(wait_policy: str) -> dict[str, str]:
    """The environment that sets OpenMP's wait policy (nothing for `inherit`)."""
    return {"OMP_WAIT_POLICY": WAIT_POLICIES[wait_policy]} if wait_policy in WAIT_POLICIES else {}


def use_cpu_threads(cpu: Optional[Mapping[str, Any]]) -> int:
    """Apply a command's `cpu` settings (conf/cpu/): the wait policy first, while torch is not yet loaded,
    then the intra-op thread count. Returns the thread count."""
    cpu = cpu or {"threads": None, "wait_policy": "inherit"}
    wanted = wait_policy_env(cpu["wait_policy"])
    if "torch" not in sys.modules:
        os.environ.update(wanted)
    elif wanted and os.environ.get("OMP_WAIT_POLICY") != wanted["OMP_WAIT_POLICY"]:
        log.debug("cpu.wait_policy=%s not applied: torch was loaded before the command started",
                  cpu["wait_policy"])
    import torch  # here, after the wait policy: this import is what starts OpenMP

    n = thread_count(cpu["threads"])
    torch.set_num_threads(n)
    return n
