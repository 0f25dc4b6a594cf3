"""What goes to W&B beyond scalars: the predictions table and the best value of every validation metric."""

from __future__ import annotations

import json

# Lower is better for these; every other validation metric is better higher.
LOWER_IS_BETTER = ("loss", "rmse", "num_no_answer", "num_invalid", "num_skipped")
COUNTS = ("num_samples", "num_valid", "tp", "fp", "tn", "fn")


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
