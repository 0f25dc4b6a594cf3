"""What `llasmol.train` settles before it builds anything: the run directory made this process's own, and
the settings that would fail only once the run had started, each said in one line now."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from llasmol.core.errors import UserError
from llasmol.core.files import unreadable
from llasmol.core.run_dir import ROLLOUTS
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
    check_nodes(cfg.trainer)
    check_loggers(cfg.get("logger"))
    if cfg.objective.name == "grpo":
        check_rollouts_folder(Path(cfg.paths.output_dir))


def check_rollouts_folder(run_dir: Path) -> None:
    """A GRPO run writes each step's completions into `<run>/rollouts/`: a pipe or file there ended the run after
    its first step (pathlib's FileExistsError), and a link wrote them into another folder."""
    path = run_dir / ROLLOUTS
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link (to {os.readlink(path)}): a GRPO run writes its rollouts into its "
                        "own folder only; remove the link, or give the run another hydra.run.dir")
    if path.exists() and not path.is_dir():
        what = unreadable(path) or "is a file"
        raise UserError(f"{path} {what}, where a GRPO run writes its rollouts folder: move it away, or give the run "
                        "another hydra.run.dir")


# What a launcher of several nodes sets in each process (SLURM's srun, torchrun, LSF, MPI), for Lightning to read
# the node's rank and the first node's address from.
_LAUNCHED = ("SLURM_NTASKS", "TORCHELASTIC_RUN_ID", "LSB_JOBID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def check_nodes(trainer_cfg, environ=os.environ) -> None:
    """trainer.num_nodes > 1 started by hand: without a launcher each node must be told its rank and the first
    node's address, or every node takes rank 0 and waits for the others forever after "MEMBER: 1/N"."""
    nodes = trainer_cfg.get("num_nodes") or 1
    if not isinstance(nodes, int) or any(environ.get(v) for v in _LAUNCHED):
        return
    if nodes <= 1:  # Lightning still reads NODE_RANK: one left from another job made this node wait for node 0
        left = environ.get("NODE_RANK")
        if left is not None and left.strip() not in ("", "0"):
            raise UserError(f"NODE_RANK={left!r} but trainer.num_nodes={nodes}: a run of one node is node 0 (a NODE_RANK "
                            "left in the environment by another job waits forever for nodes that never come): unset "
                            "NODE_RANK, or give trainer.num_nodes the job's node count")
        return
    missing = [v for v in ("MASTER_ADDR", "NODE_RANK") if not environ.get(v)]
    if missing:
        raise UserError(f"trainer.num_nodes={nodes} but no launcher started this process (no SLURM, torchrun, LSF or "
                        f"MPI variables) and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: "
                        "start each node with srun or torchrun, or set MASTER_ADDR (the first node's address), "
                        "MASTER_PORT and NODE_RANK (0 to num_nodes-1) on each node (docs/scale-out.md)")
    rank = environ["NODE_RANK"].strip()
    if not (rank.isdigit() and int(rank) < nodes):  # past the last node: it waited for peers that never come
        raise UserError(f"NODE_RANK={environ['NODE_RANK']!r} but trainer.num_nodes={nodes}: give each node its "
                        f"rank from 0 to {nodes - 1}")


def check_devices(trainer_cfg) -> None:
    """The GPUs the trainer asks for, against those torch sees: Lightning would find out only once the base had
    loaded, in an exception that names no setting (the paper's recipe on a CPU-only machine)."""

    if str(trainer_cfg.get("accelerator")) not in ("gpu", "cuda"):
        return
    seen = torch.cuda.device_count()
    if seen == 0:
        raise UserError(f"trainer.accelerator={trainer_cfg.get('accelerator')} but torch sees no CUDA GPU on this "
                        "machine: add trainer=cpu to train on the CPU (slow for a 7B base; a sharded trainer runs "
                        "on CPU processes with trainer.accelerator=cpu trainer.devices=2), or run where a GPU is")
    devices = trainer_cfg.get("devices")
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > seen:
        raise UserError(f"trainer.devices={devices} but torch sees {seen} CUDA GPU(s) on this machine: give "
                        f"trainer.devices={seen} (or auto), or run where {devices} are")
