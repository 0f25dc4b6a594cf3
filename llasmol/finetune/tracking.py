"""What goes to W&B beyond scalars: the predictions table and the best value of every validation metric."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Optional

from lightning.pytorch.callbacks import Callback

from llasmol.core.config import wandb_mode
from llasmol.core.errors import UserError, log_to_files
from llasmol.core.files import NO_SPACE, folder_problem, nearest_existing, write_text
from llasmol.core.tasks import TaskTable
from llasmol.inference.progress import progress_line
from llasmol.metrics.families import COUNTS, LOWER_IS_BETTER
from llasmol.metrics.scoring import given_answers, judge
from llasmol.finetune.lightning_private import (
    CSVLoggerWithWriter, StepBoundBar, WandbLoggerWithoutAnonymous, WriterKeepingFile, wandb_run_started,
)

log = logging.getLogger("llasmol.train")  # the closing lines belong in the run's train.log


# The modes W&B takes from WANDB_MODE, spelt as it takes them: lower case, no spaces.
WANDB_MODES = ("online", "offline", "disabled", "dryrun", "shared", "run")


def check_wandb_mode(environ=os.environ) -> None:
    """WANDB_MODE as users write it (`ONLINE`, `Offline `): W&B itself refuses any spelling but its own, in a
    validation traceback at the first logged value, so a known mode is respelt and an unknown one is one line."""
    given = environ.get("WANDB_MODE")
    if given is None:
        return
    mode = wandb_mode(given)
    if mode not in WANDB_MODES:
        raise UserError(f"WANDB_MODE={given!r} is not a W&B mode: set WANDB_MODE=online or offline (or unset it: "
                        "llasmol logs offline by default)")
    environ["WANDB_MODE"] = mode


def check_loggers(logger_cfg) -> None:
    """Settings that would fail only after the run has started, as one line now: a logger's folder that cannot
    take its files (W&B's offline run on a full disk fails in its own process, in hundreds of lines), W&B's
    mode from the environment."""
    for name, node in (logger_cfg or {}).items():
        target = (node or {}).get("_target_", "")
        if target.endswith("WandbLogger"):
            check_wandb_mode()  # before `offline` below is read
        save_dir = (node or {}).get("save_dir")
        existing = nearest_existing(Path(save_dir)) if save_dir else None
        problem = None if existing is None else (
            folder_problem(existing) if existing.is_dir() else "is a file, not a folder")
        if problem:
            fix = "free space there, or give" if problem.startswith(NO_SPACE) else "give"
            raise UserError(f"logger.{name}.save_dir={save_dir} cannot take the logger's files: {existing} {problem}; "
                            f"{fix} logger.{name}.save_dir=<another folder>")
        if target.endswith("WandbLogger") and node.get("log_model") and node.get("offline"):
            raise UserError(
                f"logger.{name}.log_model={node.get('log_model')} uploads checkpoints as W&B artifacts and needs an "
                f"online run: set logger.{name}.offline=false (or WANDB_MODE=online), or log_model=false"
            )
        if target.endswith("TensorBoardLogger") and not any(
            importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")
        ):
            raise UserError(f"logger={name} needs the tensorboard package: pip install tensorboard, or drop logger={name}")


class WandbLogger(WandbLoggerWithoutAnonymous):
    """Lightning's W&B logger, started without the deprecation warning Lightning's arguments cause, and quiet:
    W&B's closing block (a sparkline per metric and the whole run summary, some 30 lines at every run's end)
    is left out, and `finish_wandb_runs` says in one line where the run's files are. WANDB_QUIET or
    WANDB_SILENT in the environment, or `settings` given, decide instead."""

    def __init__(self, *args, **kwargs) -> None:
        if "settings" not in kwargs and not any(v in os.environ for v in ("WANDB_QUIET", "WANDB_SILENT")):
            kwargs["settings"] = {"quiet": True}
        super().__init__(*args, **kwargs)


class ProgressBar(StepBoundBar):
    """Lightning's rich progress bar without `v_num` (the logger version, which says nothing here), and with no
    epoch bound where the run has none."""

    def get_metrics(self, trainer, pl_module) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics


class ProgressLines(Callback):
    """The progress bar's stand-in off a terminal (nohup, tee, SLURM), where a run would otherwise say nothing
    between validations, and on a terminal train.log's (the bar holds the console): a line when training starts, after this process's first step (the rate
    is known from then on, and a slow first step on a busy machine would read as a hang), then every `every_s`
    seconds of training (0: every step): 'training: 120/826 steps (15%), 9.80 steps/s, about 1m12s left; loss
    3.2104'. The rate counts the steps of this process (a resumed run's earlier steps took their own time). Rank 0
    alone speaks."""

    def __init__(self, every_s: float, files_only: bool = False) -> None:
        """`files_only`: a progress bar holds the console (a terminal), so the lines go to train.log alone."""
        self.every_s = float(every_s)
        self.files_only = files_only
        self._start = self._last = 0.0
        self._first_step = 0
        self._said_step = -1

    def _say(self, line: str) -> None:
        if self.files_only:
            log_to_files(line, logging.INFO, log.name)
        else:
            log.info("%s", line)

    def on_train_start(self, trainer, pl_module) -> None:
        self._start = self._last = time.monotonic()
        self._first_step = trainer.global_step
        if trainer.is_global_zero:
            total = trainer.estimated_stepping_batches
            self._say(f"training: from step {trainer.global_step}"
                      f"{f' to {int(total)}' if math.isfinite(total) else ', no end set'}; a line after the first "
                      f"step, then every {self.every_s:g}s (progress_every_s)")
            interval = getattr(trainer, "val_check_interval", None)  # set by build_trainer (val_every_n_steps)
            every = interval // trainer.accumulate_grad_batches if isinstance(interval, int) else None
            if every and math.isfinite(total) and trainer.global_step == 0 and total < every:
                log.warning("training takes %d optimizer step(s), fewer than one validation interval "
                            "(val_every_n_steps=%d): it is validated at its last step only; trainer.max_epochs or "
                            "trainer.max_steps make it longer, val_every_n_steps validates it sooner", int(total), every)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now, step = time.monotonic(), trainer.global_step
        if not trainer.is_global_zero or step == self._said_step or step == self._first_step:
            return  # another rank, an accumulating micro-batch, or no step done yet
        if now - self._last < self.every_s and step > self._first_step + 1:
            return
        self._last, self._said_step = now, step
        loss = trainer.callback_metrics.get("train/loss")
        total = trainer.estimated_stepping_batches  # infinite with max_steps=-1 and max_epochs=-1
        line = progress_line("training", step, int(total) if math.isfinite(total) else None,
                             step - self._first_step, now - self._start, unit="steps")
        self._say(line + (f"; loss {float(loss):.4f}" if loss is not None else ""))


def epoch_of_latest_step(trainer) -> int:
    """The 0-based epoch in which the latest optimizer step was taken. During fit that is Lightning's
    `current_epoch`; once fit has ended Lightning counts the epoch it left as done, one past the last step's."""
    if trainer.state.fn == "fit" or trainer.global_step == 0:
        return trainer.current_epoch
    return max(trainer.current_epoch - 1, 0)


def number_rows_by_optimizer_step(trainer) -> None:
    """Every logger's rows (CSV, W&B, TensorBoard) at the optimizer steps completed, the number train.log,
    checkpoint names and validation files give (`llasmol.core.run_dir`), and their `epoch` the epoch of that
    step. Lightning passes a counter one lower during fit (a validation after 100 steps at step 99) but
    not after it, and the epoch after the last one to a validation run after fit."""
    for logger in trainer.loggers:
        def log_metrics(metrics, step=None, _log=logger.log_metrics):
            metrics = dict(metrics)
            if "epoch" in metrics:
                metrics["epoch"] = epoch_of_latest_step(trainer)
            _log(metrics, step=trainer.global_step)

        logger.log_metrics = log_metrics


def wandb_loggers(trainer) -> list:
    from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger

    return [lg for lg in trainer.loggers if isinstance(lg, LightningWandbLogger)]


def finish_wandb_runs(trainer, stopped: bool = False) -> None:
    """Close W&B runs, so the next job of a multirun (same process) starts its own run, each with one line
    saying where its files are. `stopped`: Ctrl-C or SIGTERM ended the fit, on purpose; W&B would record
    the process's exit status (1, 143), i.e. a failed run. It is marked preempting instead (W&B's state for
    a run that stops to be continued; a resume in place continues the same run id) and closed with exit
    code 0, which W&B and `wandb leet` do not count as a failure."""
    for logger in wandb_loggers(trainer):
        if not wandb_run_started(logger):
            continue
        run = logger.experiment
        if stopped:
            run.mark_preempting()
        where = f"files in {run.sync_dir} (upload: wandb sync {run.sync_dir})" if run.offline else run.url
        run.finish(exit_code=0)
        log.info("W&B run %s%s: %s", run.id, " (stopped: marked preempting, not failed)" if stopped else "", where)


def _correct(record: dict, tasks: TaskTable):
    """Whether the top-1 answer is right, by the metric's own rule; None where a metric is not a yes/no."""
    category, _ = judge(record["task"], record["predictions"], record["gold"], record.get("skipped", False),
                        given_answers(record), tasks)
    return None if category == "scored" else category == "correct"


def log_predictions_table(trainer, records: list[dict], tasks: TaskTable) -> None:
    """One row per validation sample: task, input, gold, top predictions, extracted answer, correct (judged by
    `tasks`, the run's table: its own tasks are in no other)."""
    loggers = wandb_loggers(trainer)
    if not loggers:
        return
    columns = ["task", "input", "gold", "predictions", "answer", "correct"]
    rows = [
        [r["task"], r["input"], json.dumps(r["gold"], ensure_ascii=False),
         json.dumps(r["predictions"], ensure_ascii=False), (r["answers"] or [None])[0], _correct(r, tasks)]
        for r in records
    ]
    for logger in loggers:
        logger.log_table(key="val/predictions", columns=columns, data=rows, step=trainer.global_step)


def update_best_summary(trainer, metrics: dict[str, float], notes: Optional[dict[str, tuple[int, str]]] = None) -> None:
    """Keep `<metric>_best` in each W&B run summary (min for losses/errors, max otherwise), and where `notes`
    has the metric (``(n, note)``: `llasmol.metrics.support`), the samples that best value stands on as
    `<metric>_best_n` and `<metric>_best_note` (``n=1 of 30, too few``; '' on enough samples, all of them)."""
    for logger in wandb_loggers(trainer):
        summary = logger.experiment.summary
        for key, value in metrics.items():
            name = key.rsplit("/", 1)[-1]
            if (name in COUNTS and name not in LOWER_IS_BETTER) or value != value:  # tallies have no best; NaN never is
                continue
            best_key = f"{key}_best"
            previous = summary.get(best_key)
            better = min if name in LOWER_IS_BETTER or name == "loss" else max
            if previous is not None and better(previous, value) == previous:
                continue
            summary[best_key] = value
            if notes and key in notes:
                n, note = notes[key]
                summary[f"{best_key}_n"] = n
                summary[f"{best_key}_note"] = note


class KeepingCSVLogger(CSVLoggerWithWriter):
    """`CSVLogger` that keeps what an earlier session of this run wrote when the run resumes in its own
    directory (Lightning's deletes ``metrics.csv`` as the logger starts): rows up to the resumed step
    stay, later ones (logged after the checkpoint, before the stop) are dropped, as they are redone."""

    keep_until_step: Optional[int] = None  # set by `llasmol.finetune.resume` when resuming in place

    def make_writer(self, log_dir: str) -> WriterKeepingFile:
        path = Path(log_dir) / WriterKeepingFile.METRICS_FILE
        keep = self.keep_until_step is not None and path.is_file()
        keys: list[str] = []
        if keep:
            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                keys = list(reader.fieldnames or [])
                # Rows are numbered by the optimizer steps completed: those up to the checkpoint's step were
                # logged for work the checkpoint holds (its step's loss, its validation); later ones are redone.
                kept = [row for row in reader if row.get("step") and int(float(row["step"])) <= self.keep_until_step]
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
            write_text(path, buf.getvalue())  # the trimmed file replaces the old one in one rename
        return WriterKeepingFile(log_dir, keep_file=keep, columns=tuple(keys))
