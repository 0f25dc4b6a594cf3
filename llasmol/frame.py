"""The one frame every Hydra command runs in, so that each command only parses, calls the library once and prints.

Two halves, each in the one order that works:

- before Hydra (`main.from_command_line()` of a function decorated with `command`): the command line checked against the composed configs (a mistyped
  setting is one `error:` line before Hydra writes a run folder), the run folder's writability, then the
  command's own check of its arguments (train's run lock);
- inside Hydra (`start`, the first call of each command's plain function, which the tests call too): known
  library noise silenced, the config checked (its task table returned) and declared tasks' headline metrics
  with it, all before torch loads; then the CPU threads and their wait policy (OpenMP reads its wait policy
  once, when torch loads).

A `UserError` anywhere in either half is one line on stderr and exit status 2 (`report_user_errors`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, NamedTuple, Optional

import hydra
from omegaconf import DictConfig

from llasmol.core.config import CONFIG_DIR, check_command_line, preview_sweep
from llasmol.core.errors import UserError, report_user_errors
from llasmol.core.quiet import quiet_known_noise, quiet_other_ranks
from llasmol.core.run_lock import process_rank
from llasmol.core.schema import check_config
from llasmol.core.tasks import TaskTable
from llasmol.core.threads import thread_count, use_cpu_threads
from llasmol.metrics.families import check_headlines

log = logging.getLogger(__name__)


class Started(NamedTuple):
    tasks: TaskTable  # SMolInstruct's tasks and the run's declared ones, as the config check read them
    threads: Optional[int]  # the intra-op thread count set, None for a command that loads no torch


def start(cfg: DictConfig, announce: Optional[Callable[[DictConfig], str]] = None, torch: bool = True) -> Started:
    """A command's first steps, in order. `announce`: a line logged once the config holds and before torch loads
    (train's, which says what runs while the imports take their seconds); `torch=False` for a command that never
    loads torch (its thread settings would cost the import)."""
    quiet_known_noise()
    quiet_other_ranks(process_rank())
    tasks = check_config(cfg).tasks
    check_headlines(tasks)
    if announce is not None:
        log.info("%s", announce(cfg))
    threads = use_cpu_threads(cfg.get("cpu")) if torch else None
    return Started(tasks, threads)


def command(name: str, run_folder: bool = False, check: Optional[Callable[[DictConfig], None]] = None,
            before: Optional[Callable[[list[str]], None]] = None, sweeps: bool = True,
            first: Optional[Callable[[list[str]], None]] = None) -> Callable[[Callable], Callable]:
    """Decorate a command's `main(cfg)` (conf/<name>.yaml composed) into Hydra's entry, which runs the body on a
    config it is given (as Hydra's own does) and gains `main.from_command_line()`, what `python -m
    llasmol.<name>` runs. `run_folder`: the command writes a run folder, checked writable before Hydra starts;
    `check`: the command's own check of each composed config of the command line; `before`: a check of the
    arguments run after those and before Hydra (train's run lock); `first`: a check of the arguments before any other
    (generate's question, which a setting-like question would otherwise meet as an unknown setting); `sweeps=False`:
    a command of one answer, whose --multirun would sweep nothing into folders it does not write."""

    def make(body: Callable[[DictConfig], Any]) -> Callable:
        # Hydra names the job (its log file, `<name>.log`) after the module of the unwrapped body
        main = hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=name)(report_user_errors(body))

        def from_command_line() -> None:
            argv = sys.argv[1:]
            if first is not None:
                report_user_errors(first)(argv)
            if not sweeps and {"--multirun", "-m"} & set(argv):
                report_user_errors(_no_sweeps)(name)
            if {"--multirun", "-m"} & set(argv) and {"--cfg", "-c"} & set(argv):  # Hydra takes one of the two
                check_command_line(name, run_folder=False, check=check)
                if before is not None:  # a sweep that would be refused is said so at its preview too
                    report_user_errors(before)(argv)
                report_user_errors(preview_sweep)(name, argv)
                return
            report_user_errors(thread_count)(None)  # a malformed OMP_NUM_THREADS: before Hydra writes a run folder
            check_command_line(name, run_folder=run_folder, check=check)
            if before is not None:
                report_user_errors(before)(sys.argv[1:])
            main()

        main.from_command_line = from_command_line
        return main

    return make


def _no_sweeps(name: str) -> None:
    raise UserError(f"llasmol.{name} runs once: --multirun sweeps train, evaluate and baseline; run llasmol.{name} "
                    "once per setting instead")
