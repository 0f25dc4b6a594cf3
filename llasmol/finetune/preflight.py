"""What `llasmol.train` settles before it builds anything: the run directory made this process's own, and
the settings that would fail only once the run had started, each said in one line now."""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from llasmol.core.run_lock import hold_run_lock
from llasmol.finetune.checkpointing import tidy_run_dir
from llasmol.finetune.distributed import check_optimizer
from llasmol.finetune.tracking import check_loggers

log = logging.getLogger("llasmol.train")  # the run's log lines keep the command's name in train.log


def claim_run_dir(output_dir: str | Path) -> Path:
    """The run directory, created; rank 0 locks it for this process (one run per directory) and then puts
    in order what a killed run left there, naming each thing it did in the log."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if rank_zero_only.rank == 0:
        hold_run_lock(out)  # one run per directory, until this process ends
        for note in tidy_run_dir(out):  # what a killed run left: safe to touch now the lock is ours
            log.warning("%s", note)
    return out


def check_run(cfg: DictConfig) -> None:
    """A `UserError` for an optimizer or logger this machine cannot run, cheapest first (the quantisation
    settings are the schema's to check; packing and the base's files, `train`'s before Lightning loads)."""
    check_optimizer(cfg.optimizer, cfg.trainer)
    check_loggers(cfg.get("logger"))
