"""What `llasmol.train` settles before it builds anything: the run directory made this process's own, and
the settings that would fail only once the run had started, each said in one line now."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from llasmol.core.errors import UserError
from llasmol.core.run_lock import hold_run_lock
from llasmol.finetune.checkpointing import tidy_run_dir
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
    """A `UserError` for devices or a logger this machine cannot run, cheapest first (the
    quantisation settings are the schema's to check; packing and the base's files, `train`'s before Lightning
    loads)."""
    check_devices(cfg.trainer)
    check_loggers(cfg.get("logger"))


def check_devices(trainer_cfg) -> None:
    """The GPUs the trainer asks for, against those torch sees: Lightning would find out only once the base had
    loaded, in an exception that names no setting (the paper's recipe on a CPU-only machine)."""

    if str(trainer_cfg.get("accelerator")) not in ("gpu", "cuda"):
        return
    seen = torch.cuda.device_count()
    if seen == 0:
        raise UserError(f"trainer.accelerator={trainer_cfg.get('accelerator')} but torch sees no CUDA GPU on this "
                        "machine: add trainer=cpu to train on the CPU (slow for a 7B base), or run where a GPU is")
    devices = trainer_cfg.get("devices")
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > seen:
        raise UserError(f"trainer.devices={devices} but torch sees {seen} CUDA GPU(s) on this machine: give "
                        f"trainer.devices={seen} (or auto), or run where {devices} are")
