"""Generate for a set of samples and score the answers with the paper's metrics.

Shared by the validation callback (a fixed, task-balanced subset of the validation split, every
validation) and `python -m llasmol.evaluate` (a whole split). Each sample's `gold` is the list of gold
answers of every sample of the split with its task, core input and target, for the tasks of
`POOLED_TASKS` (the paper counts a prediction right when it matches any of them), and its own label
for property tasks; a predictions file therefore re-scores to the same numbers on its own.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Optional

import numpy as np
import torch
import torch.distributed as dist

from llasmol.generation import BeamGenerator, task_settings
from llasmol.metrics.scoring import POOLED_TASKS, gold_key


def golds_by_input(split, tasks: Iterable[str]) -> dict[tuple, list[str]]:
    """`gold_key` -> gold answers of all samples of `split` with that key, for the pooled tasks."""
    wanted = set(tasks) & set(POOLED_TASKS)
    golds: dict[tuple, list[str]] = defaultdict(list)
    for i in range(len(split)):
        if split.tasks[split.task_index(i)] not in wanted:
            continue
        sample = split[i]
        answers = golds[gold_key(sample)]
        if sample["raw_output"] not in answers:
            answers.append(sample["raw_output"])
    return dict(golds)


def sample_golds(golds: dict, sample: dict) -> list[str]:
    """A sample's golds: pooled over its input for `POOLED_TASKS`, else its own answer."""
    if sample["task"] in POOLED_TASKS:
        return golds[gold_key(sample)]
    return [sample["raw_output"]]


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


def generate_records(generator: BeamGenerator, split, indices: list[int], golds: dict, gen_cfg,
                     advance: Optional[Callable[[int], None]] = None) -> list[dict]:
    """One record per sample: task, index, input, gold, predictions (best first), answers; None if skipped.

    `advance(n)` is called as samples finish (for a progress bar).
    """
    from llasmol.metrics.extract import extract_answer

    by_task: dict[str, list[int]] = defaultdict(list)
    samples = {i: split[i] for i in indices}
    for i in indices:
        by_task[samples[i]["task"]].append(i)
    records = []
    for task, rows in by_task.items():
        outputs = generator.generate([samples[i]["input"] for i in rows], task_settings(gen_cfg, task))
        if advance is not None:
            advance(len(rows))
        for i, predictions in zip(rows, outputs):
            sample = samples[i]
            records.append(
                {
                    "task": task,
                    "index": i,
                    "input": sample["input"],
                    "raw_input": sample["raw_input"],
                    **({"target": sample["target"]} if sample.get("target") is not None else {}),
                    "gold": sample_golds(golds, sample),
                    "predictions": predictions,
                    "answers": None if predictions is None else [extract_answer(task, p) for p in predictions],
                    "skipped": predictions is None,
                }
            )
    return records


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
    skipped = {t: 0 for t in tasks}
    for record in records:
        metric.update([record["task"]], [sample_stats(record["task"], record["predictions"] or [], record["gold"])])
        skipped[record["task"]] += int(record["skipped"])
    results = metric.compute()
    counts = torch.tensor([skipped[t] for t in tasks], dtype=torch.long, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts)
    for task, n in zip(tasks, counts.tolist()):
        if task in results:
            results[task]["num_skipped"] = float(n)
    return results
