"""`python -m llasmol.train [overrides]`: LoRA fine-tuning on SMolInstruct.

`train(cfg)` is a plain function (the tests call it); `main` is the thin Hydra shell around it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig

from llasmol.core.config import command_line_values, named_run_dir
from llasmol.core.errors import UserError
from llasmol.core.schema import check_config
from llasmol.core.run_lock import check_fresh_start, check_resume_objective, check_run_lock, process_rank
from llasmol.frame import command, start

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit one run; returns its final metrics, parameter counts and best checkpoint.

    What can be refused is checked before Lightning's import (some 4 s); `llasmol.finetune.fit.run` then does
    the rest: preflight, build, fit, finish.
    """
    started = time.monotonic()
    # The first line at once: what runs and where, before torch, Lightning and the base take their seconds.
    tasks, threads = start(cfg, lambda c: f"training {c.model.name} + LoRA {c.lora.name} into {c.paths.output_dir} "
                                          "(loading torch, Lightning and the base)")
    from llasmol.inference.loading import starting_adapter  # torch: after the threads
    from llasmol.metrics.rewards import check_rewards
    from llasmol.model.base import check_base_reachable, check_packing

    rewards = check_rewards(cfg, tasks)  # GRPO's, built once here and handed on
    check_monitor(cfg, tasks)
    start_from = starting_adapter(cfg)  # an init_from that does not fit this run is said before anything loads
    if cfg.data.get("packing"):
        check_packing(cfg.model)  # a setting the base cannot take is said before its files are looked for
    check_base_reachable(cfg.model)  # missing weights are one line before Lightning's import (some 4 s)
    # Here, not at the top: importing the command (the Hydra shell, the checks before Hydra) loads no torch.
    from llasmol.finetune.fit import run

    return run(cfg, tasks, threads, start_from, started, rewards)


def _claim_run_folder(argv: list[str]) -> None:
    """Before Hydra writes its config into the folder: a second run must not replace the first one's."""
    if process_rank() == 0:  # DDP's other processes run this too, while rank 0 holds the lock
        check_run_lock(named_run_dir(argv))
        given = command_line_values(argv, {"ckpt_path": None, "overwrite": False, "first_job": 0, "objective": "sft"})
        objective = given.pop("objective")
        check_fresh_start(named_run_dir(argv), *given.values())
        check_resume_objective(named_run_dir(argv), given["ckpt_path"], objective)


def _check_rewards(cfg: DictConfig) -> None:
    from llasmol.metrics.rewards import check_rewards  # RDKit's import: only when a command line is checked

    check_rewards(cfg)
    check_monitor(cfg)


def check_monitor(cfg: DictConfig, tasks=None) -> None:
    """The metric the best checkpoint is chosen by is one the run logs (`metrics.support.monitor_problem`)."""
    from llasmol.metrics.support import monitor_problem  # with the scorer's families: only when a line is checked

    tasks = tasks if tasks is not None else check_config(cfg).tasks
    trained = list(cfg.data.get("tasks") or [t for t in tasks])
    callbacks = cfg.get("callbacks") or {}
    samples = (callbacks.get("generation_evaluator") or {}).get("samples_per_task")
    why = monitor_problem((callbacks.get("model_checkpoint") or {}).get("monitor"), cfg.objective.name, tasks, trained,
                          generates=samples != 0)
    if why:
        raise UserError(why)


@command("train", run_folder=True, check=_check_rewards, before=_claim_run_folder)
def main(cfg: DictConfig) -> None:
    result = train(cfg)
    if process_rank() == 0:  # once, not once per DDP process
        print(f"run directory: {result['output_dir']}", flush=True)


if __name__ == "__main__":
    main.from_command_line()
