"""`python -m llasmol.train [overrides]`: LoRA fine-tuning on SMolInstruct.

`train(cfg)` is a plain function (the tests call it); `main` is the thin Hydra shell around it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig

from llasmol.core.config import command_line_values, named_run_dir
from llasmol.core.run_lock import check_fresh_start, check_run_lock, process_rank
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

    check_rewards(cfg, tasks)
    start_from = starting_adapter(cfg)  # an init_from that does not fit this run is said before anything loads
    if cfg.data.get("packing"):
        check_packing(cfg.model)  # a setting the base cannot take is said before its files are looked for
    check_base_reachable(cfg.model)  # missing weights are one line before Lightning's import (some 4 s)
    # Here, not at the top: importing the command (the Hydra shell, the checks before Hydra) loads no torch.
    from llasmol.finetune.fit import run

    return run(cfg, tasks, threads, start_from, started)


def _claim_run_folder(argv: list[str]) -> None:
    """Before Hydra writes its config into the folder: a second run must not replace the first one's."""
    if process_rank() == 0:  # DDP's other processes run this too, while rank 0 holds the lock
        check_run_lock(named_run_dir(argv))
        check_fresh_start(named_run_dir(argv), *command_line_values(
            argv, {"ckpt_path": None, "overwrite": False, "first_job": 0}).values())


def _check_rewards(cfg: DictConfig) -> None:
    from llasmol.metrics.rewards import check_rewards  # RDKit's import: only when a command line is checked

    check_rewards(cfg)


@command("train", run_folder=True, check=_check_rewards, before=_claim_run_folder)
def main(cfg: DictConfig) -> None:
    result = train(cfg)
    if process_rank() == 0:  # once, not once per DDP process
        print(f"run directory: {result['output_dir']}", flush=True)


if __name__ == "__main__":
    main.from_command_line()
