"""The evaluation pipeline: samples of a split -> answers -> records -> metrics and intervals -> files.

    samples = Samples.of(source, "test")                        # a split, which of its samples, their golds
    records = ModelAnswers(generator, cfg.generation).answer(samples)  # or a baseline's answers, or a file's
    outcome = Evaluation(RunFiles.named(folder, "test"), cfg.intervals).finish(records)

Every command that scores answers goes through here: the validation callback (a fixed, task-balanced
subset of the validation split, every validation), `evaluate` (a whole split, or a predictions file),
`generate` (one question, `ModelAnswers.ask`, nothing written) and the baselines (answers without a model,
`llasmol.classical.runner`). Each record's `gold` is the list of gold answers its task's pooling rule gives
(`llasmol.metrics.scoring.GoldPool`: for pooled tasks every sample of the split with the same task, core
input and target), so a predictions file re-scores to the same numbers on its own.

The predictions are written before anything is scored: a failure while scoring never loses the answers.
Metrics and intervals come from one computation of the per-sample statistics; the only other route is the
DDP reducer (`llasmol.metrics.reducer`), whose metrics a validation under DDP passes in.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

import numpy as np
import torch.distributed as dist

from llasmol.core.errors import UserError
from llasmol.core.files import check_writable_file, write_json, write_jsonl
from llasmol.core.run_dir import DECLARED_TASKS, METRICS, PREDICTIONS, intervals_file, read_tasks, write_tasks
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.data.split import Split
from llasmol.inference.beam_search import BeamGenerator, most_of_any_rank, task_settings
from llasmol.inference.predictions import make_record
from llasmol.metrics.intervals import interval_report, wants_intervals
from llasmol.metrics.scoring import GoldPool, per_sample_statistics, task_metrics

Advance = Callable[[int], None]  # called with the number of samples just answered (a progress bar)


def split_golds(split: Split) -> GoldPool:
    """The golds of every sample of `split`, pooled by the rule of its task table (`split.table`)."""
    pool = GoldPool(split.table)
    for i in range(len(split)):
        if split.task_row(i).pooled:
            sample = split[i]
            pool.add(sample, sample["raw_output"])
    return pool


def balanced_subset(split, per_task: Optional[int], seed: int) -> list[int]:
    """Up to `per_task` sample indices of each task, drawn once from `seed` (all when None)."""
    chosen = []
    start = 0
    for task, count in split.counts().items():
        idx = np.arange(start, start + count)
        if per_task is not None and count > per_task:
            idx = np.sort(np.random.default_rng([seed, len(chosen)]).choice(idx, per_task, replace=False))
        chosen.extend(int(i) for i in idx)
        start += count
    return chosen


@dataclass(frozen=True)
class Samples:
    """What is answered: `indices` of `split` (in the split's order), and the golds they are scored against
    (pooled over the whole split, or over the full split a subset was drawn from)."""

    split: Split
    indices: list[int]
    golds: GoldPool

    @classmethod
    def of(cls, source, name: str, per_task: Optional[int] = None, seed: Optional[int] = None) -> "Samples":
        """Split `name` of `source` (a `SMolInstructSource`): up to `per_task` samples of each task, drawn
        from `seed` (all when None, and then no seed is needed)."""
        if per_task is not None and seed is None:
            raise ValueError("a subset of each task is drawn from a seed: pass the config's `seed`")
        split = source.split(name)
        return cls(split, balanced_subset(split, per_task, seed), split_golds(source.pooling_split(name)))

    def share(self, rank: int, world: int) -> "Samples":
        """This rank's stride of the samples (DDP)."""
        return Samples(self.split, self.indices[rank::world], self.golds)


def gather_to_all(records: list[dict]) -> list[dict]:
    """Every rank's records on every rank (a no-op without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return records
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, records)
    return [r for part in parts for r in part]


class Answerer(Protocol):
    """A way to answer: one record (`predictions.make_record`) per sample, in `samples.indices` order, or
    grouped by task where the answerer works task by task."""

    def answer(self, samples: Samples, advance: Optional[Advance] = None) -> list[dict]: ...


class ModelAnswers:
    """A model's answers: beam search (`BeamGenerator`) with the `generation` settings of each task.

    `queries` replaces samples' own queries by index (a base model's protocol,
    `llasmol.inference.prompting`). `done` maps sample indices to records already made (a continued
    evaluation): they are kept, not generated again. `sink(records)` receives each batch's records as soon as
    they exist, so a caller can keep them before the next batch (`llasmol.inference.partial`).
    """

    def __init__(self, generator: BeamGenerator, generation, queries: Optional[dict[int, str]] = None,
                 done: Optional[dict[int, dict]] = None, sink: Optional[Callable[[list[dict]], None]] = None,
                 tasks: TaskTable = SMOLINSTRUCT) -> None:
        self.generator = generator
        self.generation = generation
        self.tasks = tasks  # whose declared tasks bring their own beams
        self.queries = queries
        self.done = done or {}
        self.sink = sink

    def ask(self, query: str, task: str = "") -> Optional[list[str]]:
        """The responses to one question, best first, with `task`'s beams ("": one question's, `generation.question`);
        None when it is over the prompt limit."""
        return self.generator.generate([query], task_settings(self.generation, task, self.tasks))[0]

    def answer(self, samples: Samples, advance: Optional[Advance] = None) -> list[dict]:
        """One record per sample, grouped by task (each task's samples in index order): task, index, input,
        gold, predictions (best first), answers; predictions None if skipped."""
        done, split = self.done, samples.split
        by_task: dict[str, list[int]] = defaultdict(list)
        todo_samples = {i: split[i] for i in samples.indices if i not in done}
        for i in samples.indices:
            by_task[(done[i] if i in done else todo_samples[i])["task"]].append(i)
        made = dict(done)
        asked = {task: [(i, self.queries[i] if self.queries is not None else todo_samples[i]["input"])
                        for i in rows if i not in done] for task, rows in by_task.items()}
        lockstep = getattr(self.generator, "lockstep", False)  # other generators (replays) answer alone
        if lockstep:  # as many generate calls as the rank with the most (beam_search docstring)
            calls = sum(self.generator.count_batches([q for _, q in pairs]) for pairs in asked.values())
            idle = most_of_any_rank(calls, self.generator.device) - calls
        for task, pairs in asked.items():
            if not pairs:
                continue
            todo = [i for i, _ in pairs]
            queries = [q for _, q in pairs]
            for positions, outputs in self.generator.generate_batches(queries, task_settings(self.generation, task,
                                                                                              self.tasks)):
                batch = [make_record(todo[p], todo_samples[todo[p]], samples.golds, out)
                         for p, out in zip(positions, outputs)]
                if self.sink is not None:
                    self.sink(batch)
                made.update((r["index"], r) for r in batch)
                if advance is not None:
                    advance(len(batch))
        if lockstep:
            self.generator.idle(idle)
        return [made[i] for rows in by_task.values() for i in rows]


@dataclass(frozen=True)
class RunFiles:
    """Where one evaluation's files go: its predictions (None: not written, e.g. a predictions file scored
    in place) and metrics; the intervals lie beside the metrics (`core.run_dir.intervals_file`); `folder`: the
    run folder the command writes (None for a file scored in place), whose `tasks.json` declares the user's own
    tasks its predictions name. Nothing else is written: not beside a file the user named."""

    predictions: Optional[Path]
    metrics: Path
    folder: Optional[Path] = None

    @property
    def declared(self) -> Optional[Path]:
        """Where the declarations of the user's own tasks the predictions name go: the run folder's `tasks.json`."""
        return None if self.folder is None else self.folder / DECLARED_TASKS

    @classmethod
    def named(cls, folder: Path, name: str, metrics: Optional[Path] = None) -> "RunFiles":
        """A run directory's `predictions/<name>.jsonl` and `metrics/<name>.json` (or `metrics`, the user's
        `output=`)."""
        folder = Path(folder)
        return cls(folder / PREDICTIONS / f"{name}.jsonl",
                   Path(metrics) if metrics else folder / METRICS / f"{name}.json", folder)

    @property
    def intervals(self) -> Path:
        return intervals_file(self.metrics)

    def check_writable(self) -> "RunFiles":
        """Refuse now, in one line, a target that could not be written once the answers are scored (a full or
        read-only disk, /proc, a FIFO in its place): not after an hour of generation."""
        for path in (self.predictions, self.metrics, self.intervals, self.declared):
            if path is not None:
                check_writable_file(path)
        return self


@dataclass
class Outcome:
    """What one evaluation yields: its records, `{task: {metric: value}}`, the intervals (None when not
    asked for) and the files they were written to."""

    records: list[dict]
    metrics: dict[str, dict[str, float]]
    intervals: Optional[dict]
    files: RunFiles


class Evaluation:
    """The scorer: records in, predictions, metrics and intervals (`intervals`: the intervals settings,
    None for none) out, written under `files` unless `write` is false (the ranks of a DDP validation but
    the first); `tasks`: the task table the records' tasks are rows of."""

    def __init__(self, files: RunFiles, intervals=None, write: bool = True, tasks: TaskTable = SMOLINSTRUCT) -> None:
        self.files = files
        self.tasks = tasks
        self.intervals = intervals
        self.write = write

    def finish(self, records: list[dict], metrics: Optional[dict] = None) -> Outcome:
        """Write `records` (first: a failure while scoring never loses them), then score them."""
        self.write_predictions(records)
        return self.score(records, metrics)

    def write_predictions(self, records: list[dict]) -> None:
        if self.write and self.files.predictions is not None:
            self.write_declared(records)
            write_jsonl(self.files.predictions, records)

    def write_declared(self, records: list[dict]) -> None:
        """The declarations of the user's own tasks among `records`, added to the run folder's `tasks.json`."""
        own = self.tasks.declared
        named = {r.get("task") for r in records} & set(own)
        if not named or self.files.folder is None:
            return
        try:  # the folder's earlier declarations (a run's, read at the command's start) are kept
            kept = read_tasks(self.files.folder).declared
        except UserError:
            kept = {}
        write_tasks(self.files.folder, {**kept, **{t: own[t] for t in sorted(named)}})

    def score(self, records: list[dict], metrics: Optional[dict] = None) -> Outcome:
        """The metrics of `records` (`metrics` when given: the DDP reducer's, equal on every rank) from their
        per-sample statistics, which the intervals resample too (computed once for both), written."""
        samples = per_sample_statistics(records, self.tasks) if metrics is None or wants_intervals(self.intervals) else {}
        metrics = task_metrics(samples) if metrics is None else metrics
        intervals = interval_report(samples, self.intervals)
        if self.write:
            write_json(self.files.metrics, metrics)
            if intervals is not None:
                write_json(self.files.intervals, intervals)
        return Outcome(records, metrics, intervals, self.files)

    def run(self, answerer: Answerer, samples: Samples, advance: Optional[Advance] = None) -> Outcome:
        """Answer `samples` and finish."""
        return self.finish(answerer.answer(samples, advance))
