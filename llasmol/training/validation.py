"""At each validation: beam-search generation on a fixed, task-balanced validation subset, scored with
the paper's chemistry metrics, logged as `val/<task>/<metric>` and written to the run directory:

    predictions/val-epoch{E}-step{S}.jsonl   one line per sample (task, input, gold, predictions, answers)
    metrics/val-epoch{E}-step{S}.json        {task: {metric: value}}
    metrics/val-epoch{E}-step{S}.intervals.json   their bootstrap intervals, also logged as
                                                  val/<task>/<metric>_lo and _hi

Under DDP each rank generates its stride of the subset; the metric sums are torchmetrics states, so
2 ranks give the same numbers as 1, and rank 0 gathers the records to write one file.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Optional

from lightning.pytorch.callbacks import Callback

from llasmol.inference.records import balanced_subset, gather_to_all, generate_records, score, split_golds
from llasmol.inference.beam_search import BeamGenerator
from llasmol.core.files import write_json, write_jsonl
from llasmol.core.run_dir import METRICS, PREDICTIONS, intervals_file, validation_name
from llasmol.core.tasks import get_task
from llasmol.inference.progress import generation_progress
from llasmol.training.lightning_private import live_progress


log = logging.getLogger("llasmol.train")


class GenerationEvaluator(Callback):
    def __init__(self, generation: dict, samples_per_task: Optional[int] = 20, seed: int = 13,
                 output_dir: Optional[str] = None, intervals: Optional[dict] = None) -> None:
        self.generation = generation
        self.intervals = intervals or {"resamples": 0}
        self.samples_per_task = samples_per_task
        self.seed = seed
        self.output_dir = output_dir
        self._subset: Optional[list[int]] = None
        self._last_results: Optional[dict] = None
        self._best: Optional[tuple[float, int]] = None  # (val/loss, step)
        self._epoch: Optional[int] = None  # the epoch of the latest training batch
        self._golds = None  # GoldPool of the validation split, built once

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._epoch = trainer.current_epoch

    def _prepare(self, trainer) -> None:
        source = trainer.datamodule.source
        self._subset = balanced_subset(source.split("validation"), self.samples_per_task, self.seed)
        self._golds = split_golds(source.pooling_split("validation"))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        if self._subset is None:
            self._prepare(trainer)
        dm = trainer.datamodule
        data = dm.split("validation")
        share = self._subset[trainer.global_rank :: trainer.world_size]
        generator = BeamGenerator(pl_module.model, dm.tokenizer, dm.formatter,
                                  self.generation["max_prompt_tokens"], self.generation["batch_size"])
        with generation_progress("Generation", len(share), live_progress(trainer)) as advance:
            records = generate_records(generator, data, share, self._golds, self.generation, advance)
        everything = sorted(gather_to_all(records), key=lambda r: r["index"])
        out = Path(self.output_dir or trainer.default_root_dir)
        # A validation after fit (of the last step) belongs to the epoch that step was trained in.
        epoch = trainer.current_epoch if trainer.state.fn == "fit" or self._epoch is None else self._epoch
        stem = validation_name(epoch, trainer.global_step)
        if trainer.is_global_zero:  # the predictions first: a failure while scoring never loses the generation
            write_jsonl(out / PREDICTIONS / f"{stem}.jsonl", everything)
        results = score(records, list(data.tasks), pl_module.device)
        flat = {f"val/{task}/{name}": float(value) for task, values in results.items()
                for name, value in values.items() if isinstance(value, (int, float))}
        intervals = self._intervals(everything)
        bounds = {f"val/{task}/{name}_{side}": bound for task, values in (intervals or {}).get("tasks", {}).items()
                  for name, pair in values.items() if pair for side, bound in zip(("lo", "hi"), pair)}
        for key, value in {**flat, **bounds}.items():
            # Already synchronised (equal on every rank); sync_dist keeps Lightning's DDP bookkeeping quiet.
            pl_module.log(key, value, sync_dist=True)
        if trainer.is_global_zero:
            from llasmol.training.tracking import log_predictions_table, update_best_summary, wandb_loggers

            if wandb_loggers(trainer):
                log_predictions_table(trainer, everything)
                update_best_summary(trainer, flat)
            write_json(out / METRICS / f"{stem}.json", results)
            if intervals:
                write_json(intervals_file(out / METRICS / f"{stem}.json"), intervals)
        self._last_results = results

    def _intervals(self, records: list[dict]) -> Optional[dict]:
        """Bootstrap intervals of all ranks' records (gathered: the same on every rank, seeded)."""
        settings = self.intervals
        if not settings.get("resamples") or not records:
            return None
        from llasmol.metrics.intervals import bootstrap_intervals, per_sample_statistics

        tasks = bootstrap_intervals(per_sample_statistics(records), settings["resamples"], settings["seed"],
                                    settings["level"])
        return {"level": settings["level"], "resamples": settings["resamples"], "seed": settings["seed"],
                "tasks": tasks}

    def on_validation_end(self, trainer, pl_module) -> None:
        # val/loss is aggregated only after the epoch-end hooks, so its best value and the log line are here.
        from llasmol.training.tracking import update_best_summary, wandb_loggers

        loss = trainer.callback_metrics.get("val/loss")
        if trainer.sanity_checking or not trainer.is_global_zero or loss is None:
            return
        loss = float(loss)
        if wandb_loggers(trainer):
            update_best_summary(trainer, {"val/loss": loss})
        if self._best is None or loss < self._best[0]:
            self._best = (loss, trainer.global_step)
        # One line per validation in the run's log (train.log): a run without a terminal tells its story.
        parts = []
        for task, values in (self._last_results or {}).items():
            name = get_task(task).headline
            if isinstance(values.get(name), float) and math.isfinite(values[name]):
                parts.append(f"{task} {name} {values[name]:.3f}")
        headline = ", ".join(parts)
        log.info("validation at step %d: val/loss %.4f (best %.4f at step %d)%s", trainer.global_step, loss,
                 *self._best, f"; {headline}" if headline else "")
