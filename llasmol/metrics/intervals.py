"""Bootstrap confidence intervals and paired comparisons, from the per-sample statistics the scorer keeps.

Every metric is a function of sums of per-sample statistics (`llasmol.metrics.scoring`), so a bootstrap
resample is a weighted sum of rows already computed: RDKit never runs again. A resample draws the units
of a task with replacement; the unit is a sample, except for tasks whose golds are pooled across samples
that share an input (the task table's `pooled`): there the unit is the input, with all its samples, since
those samples are not independent (they share one gold list). Intervals are percentile intervals.

A paired comparison of two evaluations on the same samples resamples the units once for both and takes
the difference of the metric in each resample: the spread of that difference, not of each metric alone,
tells a real gap from noise (the two models' errors on the same hard samples cancel).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Optional

import numpy as np

from llasmol.metrics.families import COUNTS
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.metrics.support import FEWEST_TO_COMPARE, support
from llasmol.metrics.scoring import TaskSample, finalize, gold_key, per_sample_statistics, stat_names

__all__ = ["TaskSample", "bootstrap_intervals", "interval_report", "mean_interval", "paired_difference",
           "per_sample_statistics", "wants_intervals"]

CHUNK = 128  # resamples summed at once: bounds memory at CHUNK x samples floats per task


def _weights(rng: np.random.Generator, sample: TaskSample, count: int) -> np.ndarray:
    """(count, samples): how many times each row is drawn in each resample (its unit's draws)."""
    n = sample.n_units
    draws = rng.integers(0, n, size=(count, n))
    per_unit = np.zeros((count, n), dtype=np.float64)
    np.add.at(per_unit, (np.arange(count)[:, None], draws), 1.0)
    return per_unit[:, sample.units]


def _metric_rows(sample: TaskSample, sums: np.ndarray) -> list[dict[str, float]]:
    names = stat_names(sample.task, sample.tasks)
    return [finalize(sample.task, dict(zip(names, row)), sample.tasks) for row in sums]


def _percentiles(values: list[float], level: float) -> Optional[list[float]]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return [float(lo), float(hi)]


def bootstrap_intervals(samples: dict[str, TaskSample], resamples: int = 1000, seed: int = 0,
                        level: float = 0.95) -> dict[str, dict[str, Optional[list[float]]]]:
    """``{task: {metric: [lo, hi]}}`` for every metric that is not a count (None: undefined in every
    resample, e.g. RMSE with no valid answer). One seeded generator per task: adding a task changes no
    other task's interval."""
    out = {}
    for task, sample in samples.items():
        rng = np.random.default_rng([seed, *task.encode()])
        collected: dict[str, list[float]] = defaultdict(list)
        for start in range(0, resamples, CHUNK):
            weights = _weights(rng, sample, min(CHUNK, resamples - start))
            for metrics in _metric_rows(sample, weights @ sample.stats):
                for name, value in metrics.items():
                    if name not in COUNTS:
                        collected[name].append(value)
        out[task] = {name: _percentiles(values, level) for name, values in collected.items()}
    return out


def mean_interval(values: list[float], resamples: int = 1000, seed: int = 0,
                  level: float = 0.95) -> tuple[Optional[float], Optional[float]]:
    """The percentile bootstrap interval of the mean of `values` (one value a sample: a GRPO validation's rewards),
    seeded; (None, None) without values or resamples."""
    if not values or resamples <= 0:
        return None, None
    data = np.asarray(values, dtype=np.float64)
    draws = np.random.default_rng([seed, len(data)]).integers(0, len(data), size=(resamples, len(data)))
    bounds = _percentiles(list(data[draws].mean(axis=1)), level)
    return (bounds[0], bounds[1]) if bounds else (None, None)


def wants_intervals(settings) -> bool:
    """Whether the `intervals` settings (a mapping with ``resamples``, ``seed``, ``level``; None) ask for any."""
    return settings is not None and bool(settings.get("resamples"))


def interval_report(samples: dict[str, TaskSample], settings) -> Optional[dict]:
    """What an intervals file holds: ``{"level", "resamples", "seed", "tasks": bootstrap_intervals(...)}`` for
    the `intervals` settings; None when they ask for none or there are no samples. Every intervals file is
    built here."""
    if not wants_intervals(settings) or not samples:
        return None
    resamples, seed, level = settings["resamples"], settings["seed"], settings["level"]
    return {"level": level, "resamples": resamples, "seed": seed,
            "tasks": bootstrap_intervals(samples, resamples, seed, level)}


def _pair_keys(records: list[dict], by_index: bool) -> list[tuple]:
    """What identifies a sample across two files: its split index and input when both files have indices
    (llasmol's own), else its input and how many samples with that input came before it (another system's
    output, in the split's order)."""
    if by_index:
        return [(r["task"], r["index"], gold_key(r)) for r in records]
    seen: dict[tuple, int] = defaultdict(int)
    keys = []
    for record in records:
        key = gold_key(record)
        keys.append((key, seen[key]))
        seen[key] += 1
    return keys


def paired_difference(records_a: list[dict], records_b: list[dict], metrics: dict[str, str],
                      resamples: int = 1000, seed: int = 0, level: float = 0.95,
                      tasks: TaskTable = SMOLINSTRUCT) -> dict[str, dict]:
    """For each task in `metrics` ({task: metric}) evaluated in both: A's value minus B's, with a paired
    bootstrap interval, on the samples both evaluated (matched by task, sample index and input; by input
    and order for files without indices).

    Returns ``{task: {"metric", "a", "b", "difference" (None where either value is undefined), "interval":
    [lo, hi] | None, "excludes_zero", "samples"}}``.
    """
    indexed = all(isinstance(r.get("index"), int) for r in [*records_a, *records_b])
    keys_a, keys_b = _pair_keys(records_a, indexed), _pair_keys(records_b, indexed)
    b_by_key = dict(zip(keys_b, records_b))
    shared = [(r, b_by_key[k]) for r, k in zip(records_a, keys_a) if k in b_by_key]
    stats_a = per_sample_statistics([a for a, _ in shared], tasks)
    stats_b = per_sample_statistics([b for _, b in shared], tasks)
    out = {}
    for task, metric in metrics.items():
        if task not in stats_a:
            continue
        sa, sb = stats_a[task], stats_b[task]
        value_a, value_b = sa.metrics()[metric], sb.metrics()[metric]
        rng = np.random.default_rng([seed, *task.encode()])
        differences = []
        for start in range(0, resamples, CHUNK):
            weights = _weights(rng, sa, min(CHUNK, resamples - start))  # the same draws for both
            for ma, mb in zip(_metric_rows(sa, weights @ sa.stats), _metric_rows(sb, weights @ sb.stats)):
                differences.append(ma[metric] - mb[metric])
        difference = value_a - value_b
        if not math.isfinite(difference):  # e.g. RMSE with no valid answer on one side: no difference to bound
            difference, differences = None, []
        interval = _percentiles(differences, level)
        # an RMSE of 1 answer each has a zero-width interval: "apart" only where both stand on enough answers
        counted = [support(task, metric, s.metrics(), tasks) for s in (sa, sb)]
        enough = all(c is None or c[0] >= FEWEST_TO_COMPARE for c in counted)
        out[task] = {
            "metric": metric, "a": value_a, "b": value_b, "difference": difference, "interval": interval,
            "excludes_zero": enough and interval is not None and (interval[0] > 0 or interval[1] < 0),
            "samples": int(len(sa.units)),
        }
    return out
