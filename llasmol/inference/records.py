"""Generate for a set of samples and score the answers with the paper's metrics.

Shared by the validation callback (a fixed, task-balanced subset of the validation split, every
validation) and `python -m llasmol.evaluate` (a whole split). Each record's `gold` is the list of gold
answers its task's pooling rule gives (`llasmol.metrics.scoring.GoldPool`: for pooled tasks every sample
of the split with the same task, core input and target), so a predictions file re-scores to the same
numbers on its own.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from llasmol.inference.beam_search import BeamGenerator, task_settings
from llasmol.metrics.scoring import GoldPool


def split_golds(split) -> GoldPool:
    """The golds of every sample of `split`, pooled by the task table's rule."""
    pool = GoldPool()
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


def generate_records(generator: BeamGenerator, split, indices: list[int], golds: GoldPool, gen_cfg,
                     advance: Optional[Callable[[int], None]] = None,
                     queries: Optional[dict[int, str]] = None, done: Optional[dict[int, dict]] = None,
                     sink: Optional[Callable[[list[dict]], None]] = None) -> list[dict]:
    """One record per sample: task, index, input, gold, predictions (best first), answers; None if skipped.

    `advance(n)` is called as samples finish (for a progress bar); `queries` replaces samples' own queries
    by index (a base model's protocol, `llasmol.inference.base_protocol`). `done` maps sample indices to
    records already made (a continued evaluation): they are kept, not generated again. `sink(records)`
    receives each batch's records as soon as they exist, so a caller can keep them before the next batch.
    """
    done = done or {}
    by_task: dict[str, list[int]] = defaultdict(list)
    samples = {i: split[i] for i in indices if i not in done}
    for i in indices:
        by_task[(done[i] if i in done else samples[i])["task"]].append(i)
    made = dict(done)
    for task, rows in by_task.items():
        todo = [i for i in rows if i not in done]
        if not todo:
            continue
        asked = [queries[i] if queries is not None else samples[i]["input"] for i in todo]
        batches = generator.generate_batches(asked, task_settings(gen_cfg, task))
        for positions, outputs in batches:
            batch = [make_record(todo[p], samples[todo[p]], golds, out) for p, out in zip(positions, outputs)]
            if sink is not None:
                sink(batch)
            made.update((r["index"], r) for r in batch)
            if advance is not None:
                advance(len(batch))
    return [made[i] for rows in by_task.values() for i in rows]


def make_record(index: int, sample: dict, golds: GoldPool, predictions: Optional[list[str]]) -> dict:
    """The predictions-file record of sample `index` of a split answered with `predictions` (raw responses,
    best first; None: not generated). Every writer of predictions files (validation, evaluate, the
    baselines) builds its records here, so they carry the same fields."""
    from llasmol.metrics.extract import extract_answer

    task = sample["task"]
    return {
        "task": task,
        "index": index,
        "input": sample["input"],
        "raw_input": sample["raw_input"],
        **({"target": sample["target"]} if sample.get("target") is not None else {}),
        "gold": golds.golds(sample, sample["raw_output"]),
        "predictions": predictions,
        "answers": None if predictions is None else [extract_answer(task, p) for p in predictions],
        "skipped": predictions is None,
    }


def gather_to_all(records: list[dict]) -> list[dict]:
    """Every rank's records on every rank (a no-op without torch.distributed)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return records
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, records)
    return [r for part in parts for r in part]


def score(records: list[dict], tasks: list[str], device) -> dict[str, dict[str, float]]:
    """Synchronised metrics of this rank's `records` (every rank must call it)."""
    from llasmol.metrics.metric import ChemistryMetrics
    from llasmol.metrics.scoring import sample_stats

    metric = ChemistryMetrics(tasks).to(device)
    for record in records:
        stats = sample_stats(record["task"], record["predictions"], record["gold"], record["skipped"])
        metric.update([record["task"]], [stats])
    return metric.compute()


def score_and_write(records: list[dict], out: Path, settings) -> tuple[dict, Optional[dict]]:
    """The metrics of `records` (written to `out`) and, unless `settings` is None or its `resamples` is 0,
    their bootstrap intervals (written beside it). The per-sample statistics are computed once for both."""
    from llasmol.core.files import write_json
    from llasmol.core.run_dir import intervals_file
    from llasmol.metrics.intervals import bootstrap_intervals, per_sample_statistics

    samples = per_sample_statistics(records)
    results = {task: sample.metrics() for task, sample in samples.items()}
    write_json(out, results)
    intervals = None
    if settings is not None and settings.resamples:
        intervals = {"level": settings.level, "resamples": settings.resamples, "seed": settings.seed,
                     "tasks": bootstrap_intervals(samples, settings.resamples, settings.seed, settings.level)}
        write_json(intervals_file(out), intervals)
    return results, intervals


def write_and_score(records: list[dict], predictions_path: Path, metrics_path: Path,
                    settings=None) -> tuple[dict, Optional[dict]]:
    """Write `records` as a predictions file, then score them into the metrics file and its intervals (the
    predictions first: a failure while scoring never discards them); (metrics, intervals or None). Every
    whole-split predictions file (evaluate, the baselines) is written and scored here."""
    from llasmol.core.files import write_jsonl

    write_jsonl(predictions_path, records)
    return score_and_write(records, metrics_path, settings)
