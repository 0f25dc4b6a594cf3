"""What goes to W&B beyond scalars: the predictions table and the best value of every validation metric."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Optional

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from omegaconf import open_dict

# Lower is better for these; every other validation metric is better higher.
LOWER_IS_BETTER = ("loss", "rmse", "num_no_answer", "num_invalid", "num_skipped")
COUNTS = ("num_samples", "num_valid", "num_scored", "tp", "fp", "tn", "fn")


def check_loggers(logger_cfg) -> None:
    """Settings that would fail only after the run has started, as one line now."""
    import importlib.util

    from llasmol.errors import UserError

    for name, node in (logger_cfg or {}).items():
        target = (node or {}).get("_target_", "")
        if target.endswith("WandbLogger") and node.get("log_model") and node.get("offline"):
            raise UserError(
                f"logger.{name}.log_model={node.get('log_model')} uploads checkpoints as W&B artifacts and needs an "
                f"online run: set logger.{name}.offline=false (or WANDB_MODE=online), or log_model=false"
            )
        if target.endswith("TensorBoardLogger") and not any(
            importlib.util.find_spec(m) for m in ("tensorboard", "tensorboardX")
        ):
            raise UserError(f"logger={name} needs the tensorboard package: pip install tensorboard, or drop logger={name}")


WANDB_ID_FILE = "wandb_run_id"


def continue_wandb_run(logger_cfg, output_dir: Path) -> None:
    """For a run resumed in its own directory: continue its W&B run (same id, ``resume="allow"``) rather
    than start a second one. A run resumed from another directory gets a new id, as a fresh one does."""
    id_file = output_dir / WANDB_ID_FILE
    if not id_file.is_file():
        return
    for node in (logger_cfg or {}).values():
        if node and str(node.get("_target_", "")).endswith("WandbLogger"):
            with open_dict(node):
                node.id = id_file.read_text().strip()
                node.resume = "allow"


def remember_wandb_run(trainer, output_dir: Path) -> None:
    """Keep the W&B run id in the run directory, for `continue_wandb_run`."""
    from llasmol.io import write_text

    for logger in wandb_loggers(trainer):
        if trainer.is_global_zero:
            write_text(output_dir / WANDB_ID_FILE, logger.experiment.id + "\n")


def wandb_loggers(trainer) -> list:
    return [lg for lg in trainer.loggers if type(lg).__name__ == "WandbLogger"]


def _correct(record: dict):
    """Whether the top-1 answer is right, by the metric's own rule; None where a metric is not a yes/no."""
    from llasmol.metrics.scoring import sample_stats

    stats = sample_stats(record["task"], record["predictions"] or [], record["gold"])
    if "hit_top1" in stats:
        return bool(stats["hit_top1"])
    if "tp" in stats:
        return bool(stats["tp"] + stats["tn"])
    return None


def log_predictions_table(trainer, records: list[dict]) -> None:
    """One row per validation sample: task, input, gold, top predictions, extracted answer, correct."""
    columns = ["task", "input", "gold", "predictions", "answer", "correct"]
    rows = [
        [r["task"], r["input"], json.dumps(r["gold"], ensure_ascii=False),
         json.dumps(r["predictions"], ensure_ascii=False), (r["answers"] or [None])[0], _correct(r)]
        for r in records
    ]
    for logger in wandb_loggers(trainer):
        logger.log_table(key="val/predictions", columns=columns, data=rows, step=trainer.global_step)


def update_best_summary(trainer, metrics: dict[str, float]) -> None:
    """Keep `<metric>_best` in each W&B run summary (min for losses/errors, max otherwise)."""
    for logger in wandb_loggers(trainer):
        summary = logger.experiment.summary
        for key, value in metrics.items():
            name = key.rsplit("/", 1)[-1]
            if name in COUNTS or value != value:  # counts have no "best"; NaN never is
                continue
            best_key = f"{key}_best"
            previous = summary.get(best_key)
            better = min if name in LOWER_IS_BETTER else max
            summary[best_key] = value if previous is None else better(previous, value)


class KeepingCSVLogger(CSVLogger):
    """`CSVLogger` that keeps what an earlier session of this run wrote when the run resumes in its own
    directory (Lightning's deletes ``metrics.csv`` as the logger starts): rows up to the resumed step
    stay, later ones (logged after the checkpoint, before the stop) are dropped, as they are redone."""

    keep_until_step: Optional[int] = None  # set by `train` when resuming in place

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _KeepingWriter(self.log_dir, self.keep_until_step)
        return self._experiment


class _KeepingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, keep_until_step: Optional[int]) -> None:
        path = Path(log_dir) / self.NAME_METRICS_FILE
        self._keep = keep_until_step is not None and path.is_file()
        keys: list[str] = []
        if self._keep:
            from llasmol.io import write_text

            with path.open(newline="") as fh:
                reader = csv.DictReader(fh)
                keys = list(reader.fieldnames or [])
                # Rows are numbered from 0: step S was logged after the checkpoint of S steps, so it is redone.
                kept = [row for row in reader if row.get("step") and int(float(row["step"])) < keep_until_step]
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
            write_text(path, buf.getvalue())  # the trimmed file replaces the old one in one rename
        super().__init__(log_dir)
        if keys:
            self.metrics_keys = keys

    def _check_log_dir_exists(self) -> None:
        if not self._keep:  # Lightning's check deletes an existing metrics.csv
            super()._check_log_dir_exists()


def checkpoint_step(path: str) -> int:
    """The optimizer step a Lightning checkpoint was saved at (tensors memory-mapped, not read)."""
    import torch

    return int(torch.load(path, map_location="cpu", mmap=True, weights_only=True)["global_step"])
