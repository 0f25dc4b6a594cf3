"""A run from its checked config: preflight, build, fit and finish (`run`, `train`'s table of contents), each step
a helper of `llasmol.finetune`. The fit (SIGTERM ends it with exit status 143), a validation of the last step
when `val_every_n_steps` does not divide the run's length, then result.json, the closing log line and the W&B
runs closed."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import lightning as L
import torch.distributed as dist
from lightning import LightningDataModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from llasmol.core import run_dir
from llasmol.core.errors import log_to_files
from llasmol.core.files import write_json
from llasmol.core.quiet import lightning_logs_to_root
from llasmol.core.threads import wait_description
from llasmol.finetune.build import build_datamodule, build_model, build_module, build_trainer, record_run
from llasmol.finetune.checkpointing import AdapterModelCheckpoint
from llasmol.finetune.module import LoRACausalLM
from llasmol.finetune.preflight import check_run, claim_run_dir
from llasmol.finetune.resume import Resume, resume_command
from llasmol.model.base import load_tokenizer
from llasmol.finetune.tracking import finish_wandb_runs

log = logging.getLogger("llasmol.train")  # the run's log lines keep the command's name in train.log


def run(cfg, tasks, threads: int, start_from, started: float, rewards=None) -> dict[str, Any]:
    """Fit one run whose settings, data declarations and starting adapter are checked (`llasmol.train.train`);
    returns its final metrics, parameter counts and best checkpoint. `started`: `time.monotonic()` at launch;
    `rewards`: a GRPO run's, built by the check (one object for its rollouts and its validation)."""
    # Preflight: what this machine runs, the run directory (ours alone), what ckpt_path= means.
    lightning_logs_to_root()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    log.info("CPU: %d intra-op thread(s), OpenMP threads wait %s (cpu.threads, cpu.wait_policy)", threads,
             wait_description(cfg.get("cpu")))
    check_run(cfg)  # before the folder is claimed: a refused run leaves nothing behind
    out = claim_run_dir(cfg.paths.output_dir)
    resume = Resume.plan(cfg.get("ckpt_path"), out, cfg.model.name, cfg.lora.name, cfg.objective.name)

    # Build: the data first, so bad data stops the run before the model loads and the loggers start.
    tokenizer = load_tokenizer(cfg.model)
    datamodule = build_datamodule(cfg, tokenizer, tasks)
    model, params = build_model(cfg, tokenizer, start_from)
    module = build_module(cfg, model, datamodule, start_from, rewards)
    trainer = build_trainer(cfg, datamodule, resume, rewards)  # the one place the resume plan meets the trainer
    record_run(cfg, trainer, datamodule, params)

    # Fit: from the planned checkpoint, if any; a SIGTERM ends the process with exit status 143.
    fit(trainer, module, datamodule, resume.checkpoint)

    # Finish: the last step validated if no validation fell on it, result.json, the closing line, the loggers.
    validate_last_step(trainer, module, datamodule, cfg.val_every_n_steps)
    result = run_result(trainer, params, out, resume.checkpoint, started)
    finish(trainer, result)
    return result


def fit(trainer: Trainer, module: LoRACausalLM, datamodule: LightningDataModule, checkpoint: Optional[str]) -> None:
    """Train from `checkpoint` (None: from the start); SIGTERM ends the process with exit status 143, Ctrl-C
    with 1, and either closes the W&B runs as stopped on purpose, not failed."""
    if checkpoint:
        log.info("resuming from %s", checkpoint)
    try:
        # weights_only: a checkpoint is data from disk; ours hold only tensors and plain containers.
        trainer.fit(module, datamodule=datamodule, ckpt_path=checkpoint, weights_only=True)
    except SIGTERMException:
        # Lightning's SIGTERM is a SystemExit without a code, i.e. success; a stopped run is not one.
        finish_wandb_runs(trainer, stopped=True)
        raise SystemExit(143) from None
    except SystemExit as stop:
        # Lightning answers Ctrl-C with sys.exit(1) from its KeyboardInterrupt handler.
        if trainer.interrupted and isinstance(stop.__context__, KeyboardInterrupt):
            finish_wandb_runs(trainer, stopped=True)
        raise
    except Exception as err:
        reason = peer_lost(err) if trainer.world_size > 1 else None
        if reason is None:
            raise
        # The survivors of a killed process (the OOM killer, a lost node) see only their transport's words.
        last = Path(trainer.default_root_dir) / run_dir.CHECKPOINTS / run_dir.LAST_CKPT
        line = (f"error: another of this run's {trainer.world_size} processes ended at step {trainer.global_step} "
                f"({reason}), and rank {trainer.global_rank} cannot go on without it: that process's output says "
                "why; " + (f"continue from {last.name} with: " if last.is_file() else "no checkpoint was saved yet, "
                           "start again with: ") + resume_command(Path(trainer.default_root_dir)))
        print(line, file=sys.stderr, flush=True)
        log_to_files(line)  # train.log keeps it: a console piped through tee may be gone
        raise SystemExit(1) from None


# What a collective says when a process it waits on is gone: gloo's TCP pair, and any `torch.distributed` error.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_lost(err: BaseException) -> Optional[str]:
    """The words of a collective that lost a process of the run (`err`), None for any other error."""
    text = str(err)
    found = next((words for words in _PEER_GONE if words in text), None)
    if found is not None:
        return f"torch.distributed: {found}"
    if isinstance(err, dist.DistError):
        return f"torch.distributed: {text.strip().splitlines()[0][:160]}" if text.strip() else type(err).__name__
    return None


def validate_last_step(trainer: Trainer, module: LoRACausalLM, datamodule: LightningDataModule,
                       val_every_n_steps: int) -> None:
    """Every run ends with something to report, even when `val_every_n_steps` does not divide its length: the
    last step is validated, and competes for the best checkpoint as the validations during the fit do."""
    if module.last_validated_step == trainer.global_step:
        return
    log.info("validating the last step (%d): val_every_n_steps=%d does not divide it",
             trainer.global_step, val_every_n_steps)
    try:
        with _signals_stop_at_once():
            trainer.validate(module, datamodule=datamodule, verbose=False)
    except (SIGTERMException, KeyboardInterrupt, SystemExit) as stop:
        ctrl_c = isinstance(stop, KeyboardInterrupt) or isinstance(stop.__context__, KeyboardInterrupt)
        if not ctrl_c and not isinstance(stop, SIGTERMException):  # (a SystemExit itself) another exit: as it is
            raise
        log.warning("stopped (%s) while validating the last step (%d): training is complete and saved in %s; "
                    "nothing of this validation was kept", "Ctrl-C" if ctrl_c else "SIGTERM", trainer.global_step,
                    Path(trainer.default_root_dir) / run_dir.CHECKPOINTS / run_dir.LAST_CKPT)
        finish_wandb_runs(trainer, stopped=True)
        raise SystemExit(1 if ctrl_c else 143) from None
    for callback in trainer.checkpoint_callbacks:  # every rank: gathering sharded adapters is collective
        if isinstance(callback, AdapterModelCheckpoint) and callback.monitor:
            callback.save_best_now(trainer)


@contextmanager
def _signals_stop_at_once() -> Iterator[None]:
    """After the fit, no step is left to finish: Ctrl-C or SIGTERM stops the validation of the last step at once.
    (Lightning alone only notes a SIGTERM there, and a validation that generates for minutes went on.)"""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return

    def stop(signum, frame) -> None:
        raise KeyboardInterrupt if signum == signal.SIGINT else SIGTERMException()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_result(trainer: Trainer, params: dict, output_dir: Path, resumed_from: Optional[str],
               started: float) -> dict[str, Any]:
    """What `train` returns and result.json holds; `started`: this process's `time.monotonic()` at its start."""
    checkpoint = trainer.checkpoint_callback
    return {
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        "params": params,
        "best_checkpoint": checkpoint.best_model_path if checkpoint else None,
        "best_by": checkpoint.monitor if checkpoint else None,  # val/loss, or val/reward for objective=grpo
        "output_dir": str(output_dir),
        "global_step": trainer.global_step,
        "resumed_from": resumed_from,
        "seconds": round(time.monotonic() - started, 1),  # this process's wall time, for the ablation chart
    }


def finish(trainer: Trainer, result: dict[str, Any]) -> None:
    """Rank 0 writes result.json and says where the run ended and what to run next; every rank closes its
    W&B runs."""
    if trainer.is_global_zero:
        out = result["output_dir"]
        write_json(Path(out) / run_dir.RESULT, result)
        best = trainer.checkpoint_callback.best_model_score if trainer.checkpoint_callback else None
        log.info("done at step %d: best checkpoint %s%s. Next: python -m llasmol.report %s ; "
                 "python -m llasmol.evaluate ckpt=%s data.split=test", trainer.global_step,
                 result["best_checkpoint"] or "(none: no validation kept one)",
                 f" ({result['best_by']} {float(best):.4f})" if best is not None else "", out, out)
    finish_wandb_runs(trainer)
