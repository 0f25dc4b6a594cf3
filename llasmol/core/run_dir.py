"""What a run directory holds, by name: training writes these, and evaluate, generate, resume and the
analysis read them. (The checkpoint folder and the CSV logger's folder are also named in
`conf/callbacks/default.yaml` and `conf/logger/csv.yaml`, where a user may move them.)"""

from __future__ import annotations

from pathlib import Path

PARAMS = "params.json"  # trainable/total parameters, model and LoRA variant
RESULT = "result.json"  # final metrics, best checkpoint, global step
HYDRA_CONFIG = ".hydra/config.yaml"  # the resolved config of the run
CHECKPOINTS = "checkpoints"
LAST_CKPT = "last.ckpt"  # rewritten every few optimizer steps and at the end
INTERRUPTED_CKPT = "interrupted.ckpt"  # written when Ctrl-C or SIGTERM stops the run at a step's end
RESUME_CKPTS = (LAST_CKPT, INTERRUPTED_CKPT)
PREDICTIONS = "predictions"  # <validation or split>.jsonl
METRICS = "metrics"  # <validation or split>.json
INTERVALS_SUFFIX = ".intervals"  # metrics/<name>.intervals.json: the bootstrap intervals of metrics/<name>.json
CSV_LOG = "csv/metrics.csv"
WANDB_ID = "wandb_run_id"  # the run's W&B id, continued by an in-place resume
SYSTEM = "system.json"  # evaluate predictions= name=<label>: an outside system's row (its name, its source file)
BASELINE = "baseline.json"  # a baseline's folder: the method, its settings, tasks answered and skipped, time, memory


def intervals_file(metrics_file: Path) -> Path:
    """The bootstrap intervals of a metrics file: beside it, `<name>.intervals.json`."""
    return metrics_file.with_name(metrics_file.stem + INTERVALS_SUFFIX + ".json")


def validation_name(epoch: int, step: int) -> str:
    """The stem of a validation's predictions and metrics files."""
    return f"val-epoch{epoch}-step{step}"
