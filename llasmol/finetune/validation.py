"""At each validation: beam-search generation on a fixed, task-balanced validation subset, scored with
the paper's chemistry metrics, logged as `val/<task>/<metric>` and written to the run directory:

    predictions/val-step{S}.jsonl   one line per sample (task, input, gold, predictions, answers)
    metrics/val-step{S}.json        {task: {metric: value}}
    metrics/val-step{S}.intervals.json   their bootstrap intervals, also logged as val/<task>/<metric>_lo and _hi

Given `rewards` (a GRPO run's `Rewards`, the one object its rollouts are rewarded by: `train` hands it over), the
top answer of each sample is also rewarded as the training rollouts are (a beam that never ended earns nothing),
logged as `val/reward` (the mean over the subset) with its bootstrap interval (`val/reward_lo`, `_hi`),
`val/reward/<task>` and `val/reward/<task>/<term>`: what the RL stage optimises, measured on held-out prompts, and
what it keeps its best checkpoint by.

S is the optimizer steps completed, the number train.log, the checkpoint's name and the CSV/W&B step give the
same validation (`llasmol.core.run_dir.validation_name`).

Under DDP each rank generates its stride of the subset; the metric sums are torchmetrics states, so
2 ranks give the same numbers as 1, and rank 0 gathers the records to write one file.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Optional

from lightning.pytorch.callbacks import Callback

from llasmol.core.run_dir import validation_name
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.inference.beam_search import BeamGenerator
from llasmol.inference.pipeline import Evaluation, ModelAnswers, RunFiles, Samples, gather_to_all
from llasmol.inference.progress import generation_progress
from llasmol.metrics.intervals import mean_interval
from llasmol.metrics.reducer import reduced_metrics
from llasmol.metrics.rewards import Rewards
from llasmol.metrics.support import note_of, support, support_note
from llasmol.finetune.lightning_private import live_progress
from llasmol.finetune.tracking import log_predictions_table, update_best_summary, wandb_loggers


log = logging.getLogger("llasmol.train")


class GenerationEvaluator(Callback):
    def __init__(self, generation: dict, *, samples_per_task: Optional[int], seed: int,
                 output_dir: Optional[str] = None, intervals: Optional[dict] = None,
                 rewards: Optional[Rewards] = None, progress_every_s: Optional[float] = None) -> None:
        """The settings of `callbacks.generation_evaluator` (conf/callbacks/default.yaml states their values;
        `rewards`: a GRPO run's rewards, handed over by `train` once they are built)."""
        self.generation = generation
        self.rewards = rewards
        self.progress_every_s = progress_every_s  # off a terminal: a line this often while generating (None: none)
        self.intervals = intervals  # None: none
        self.samples_per_task = samples_per_task
        self.seed = seed
        self.output_dir = output_dir
        self._samples: Optional[Samples] = None  # the subset of the validation split and its golds, drawn once
        self._last_results: Optional[dict] = None
        self._tasks: TaskTable = SMOLINSTRUCT  # the table the last results were scored by
        self._best: Optional[tuple[float, int]] = None  # (the checkpoint's metric, its step)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        if self._samples is None:
            self._samples = Samples.of(trainer.datamodule.source, "validation", self.samples_per_task, self.seed)
        dm = trainer.datamodule
        share = self._samples.share(trainer.global_rank, trainer.world_size)
        generator = BeamGenerator(pl_module.model, dm.tokenizer, dm.formatter,
                                  self.generation["max_prompt_tokens"], self.generation["batch_size"])
        every = self.progress_every_s if trainer.is_global_zero else None  # rank 0 speaks for all
        with generation_progress("validation generation", len(share.indices), live_progress(trainer),
                                 log_every_s=every) as advance:
            records = ModelAnswers(generator, self.generation, tasks=share.split.table).answer(share, advance)
        everything = sorted(gather_to_all(records), key=lambda r: r["index"])
        out = Path(self.output_dir or trainer.default_root_dir)
        tasks = share.split.table
        evaluation = Evaluation(RunFiles.named(out, validation_name(trainer.global_step)), self.intervals,
                                write=trainer.is_global_zero, tasks=tasks)
        evaluation.write_predictions(everything)  # rank 0; before scoring, which may fail
        # The metrics are summed across ranks (every rank calls this); the intervals resample all ranks'
        # records (gathered: the same on every rank, seeded).
        outcome = evaluation.score(everything, reduced_metrics(records, list(share.split.tasks), pl_module.device, tasks))
        results = outcome.metrics
        flat = {f"val/{task}/{name}": float(value) for task, values in results.items()
                for name, value in values.items() if isinstance(value, (int, float))}
        bounds = {f"val/{task}/{name}_{side}": bound for task, values in (outcome.intervals or {}).get("tasks", {}).items()
                  for name, pair in values.items() if pair for side, bound in zip(("lo", "hi"), pair)}
        for key, value in {**flat, **bounds, **self._rewarded(everything, tasks, dm)}.items():
            # Already synchronised (equal on every rank); sync_dist keeps Lightning's DDP bookkeeping quiet.
            pl_module.log(key, value, sync_dist=True)
        if trainer.is_global_zero:
            if wandb_loggers(trainer):
                log_predictions_table(trainer, everything, tasks)
                notes = {f"val/{task}/{name}": (counted[0], note_of(counted))
                         for task, values in results.items() for name in values
                         if (counted := support(task, name, values, tasks)) is not None}
                update_best_summary(trainer, flat, notes)
        self._last_results, self._tasks = results, tasks

    def _rewarded(self, records: list[dict], tasks: TaskTable, datamodule) -> dict[str, float]:
        """`val/reward` (with its bootstrap interval), `val/reward/<task>` and `val/reward/<task>/<term>`: the mean
        reward of each sample's top answer (its first prediction, the one the metrics score first) against its golds;
        nothing without rewards."""
        if self.rewards is None or not records:
            return {}
        by_task: dict[str, list[tuple[float, dict]]] = {}
        for record in records:
            top = record["predictions"][0] if record["predictions"] else ""
            ended = bool((record.get("ended") or [True])[0]) and bool(record["predictions"])
            by_task.setdefault(record["task"], []).append(self.rewards(record["task"], top, record["gold"], ended))
        every = [value for pairs in by_task.values() for value, _ in pairs]
        settings = self.intervals or {}
        out = {"val/reward": sum(every) / len(every)}
        if settings.get("resamples") != 0:  # intervals.resamples=0: no intervals, here as in every metrics file
            out["val/reward_lo"], out["val/reward_hi"] = mean_interval(
                every, int(settings.get("resamples") or 1000), int(settings.get("seed") or 0),
                float(settings.get("level") or 0.95))
        for task, pairs in by_task.items():
            out[f"val/reward/{task}"] = sum(value for value, _ in pairs) / len(pairs)
            for term in pairs[0][1]:
                out[f"val/reward/{task}/{term}"] = sum(terms[term] for _, terms in pairs) / len(pairs)
        return out

    def on_validation_end(self, trainer, pl_module) -> None:
        # val/loss is aggregated only after the epoch-end hooks, so its best value and the log line are here.
        loss = trainer.callback_metrics.get("val/loss")
        if trainer.sanity_checking or not trainer.is_global_zero or loss is None:
            return
        loss = float(loss)
        if wandb_loggers(trainer):
            update_best_summary(trainer, {"val/loss": loss})
        # "best" is said of the metric the best checkpoint is chosen by (val/loss, or a GRPO run's val/reward), with
        # its rule: the better value, and on a tie the later step (`AdapterModelCheckpoint.check_monitor_top_k`).
        monitor, mode = _chosen_by(trainer)
        value = trainer.callback_metrics.get(monitor)
        if value is not None:
            value = float(value)
            if self._best is None or (value <= self._best[0] if mode == "min" else value >= self._best[0]):
                self._best = (value, trainer.global_step)
        # One line per validation in the run's log (train.log): a run without a terminal tells its story.
        shown = []
        tasks = self._tasks
        for task, values in (self._last_results or {}).items():
            name = tasks[task].headline
            if isinstance(values.get(name), float) and math.isfinite(values[name]):
                shown.append((f"{task} {name} {values[name]:.3f}", support_note(task, name, values, tasks)))
        notes = {note for _, note in shown}
        if len(notes) == 1 and len(shown) > 1:  # the demo's: every task on its 8 samples, said once
            headline = ", ".join(text for text, _ in shown) + (f" (each {notes.pop()})" if notes != {""} else "")
        else:
            headline = ", ".join(text + (f" ({note})" if note else "") for text, note in shown)
        metrics = [f"val/loss {loss:.4f}"]
        reward = trainer.callback_metrics.get("val/reward")  # a GRPO run's, with its interval
        if reward is not None:
            low, high = (trainer.callback_metrics.get(f"val/reward_{side}") for side in ("lo", "hi"))
            metrics.append(f"val/reward {float(reward):.4f}" + (f" [{float(low):.4f}, {float(high):.4f}]"
                                                                 if low is not None and high is not None else ""))
        best = f" (best {monitor} {self._best[0]:.4f} at step {self._best[1]})" if self._best else ""
        log.info("validation at step %d: %s%s%s", trainer.global_step, ", ".join(metrics), best,
                 f"; {headline}" if headline else "")


def _chosen_by(trainer) -> tuple[str, str]:
    """The metric the best checkpoint is chosen by and its mode (val/loss, min, without a best checkpoint)."""
    for callback in getattr(trainer, "checkpoint_callbacks", None) or ():
        if getattr(callback, "monitor", None):
            return callback.monitor, callback.mode
    return "val/loss", "min"
