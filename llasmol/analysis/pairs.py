"""Honest comparisons: the bootstrap interval beside each metric of a run, and paired differences between
runs evaluated on the same samples (`llasmol.metrics.intervals` does the resampling).

A run is compared on its whole test split when it has one (`evaluate ckpt=<run> data.split=test`, or a
baseline's), else on its latest validation; two runs are paired on the samples both answered, matched by
task, sample index and input. A difference whose interval excludes zero is one the samples can tell apart
at that level; one whose interval straddles zero may be noise.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import Optional, Sequence

from llasmol.analysis.runs import Run, Validation, load_run
from llasmol.analysis.tables import Table, evaluation_note, evaluation_table, headline
from llasmol.core.run_dir import PREDICTIONS, intervals_file
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.inference.predictions import read_predictions
from llasmol.metrics.intervals import bootstrap_intervals, paired_difference, per_sample_statistics


def basis(run: Run) -> tuple[str, list[dict]]:
    """What `run` is compared on: (``test`` or its latest validation's name, those prediction records)."""
    test = run.path / PREDICTIONS / "test.jsonl"
    if test.is_file():
        return "test", read_predictions(test, allow_empty=True, tasks=run.table)
    latest = run.latest
    if latest is None or latest.predictions_path is None:
        return "-", []
    return latest.name, latest.predictions()


def _saved(metrics_path: Path) -> dict:
    """The intervals file beside `metrics_path` when it is readable and holds tasks, else {}."""
    saved = intervals_file(metrics_path)
    try:
        content = json.loads(saved.read_text(encoding="utf-8")) if saved.is_file() else {}
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) and isinstance(content.get("tasks"), dict) else {}


def intervals_of(metrics_path: Path, records: Sequence[dict], resamples: int = 1000, seed: int = 0,
                 level: float = 0.95, tasks: TaskTable = SMOLINSTRUCT) -> dict:
    """The intervals written beside `metrics_path` (``{task: {metric: [lo, hi]}}``), or, for a run written
    before intervals were (no such file), computed now from its prediction records."""
    saved = _saved(metrics_path)
    if saved:
        return saved["tasks"]
    if not records:
        return {}
    return bootstrap_intervals(per_sample_statistics(records, tasks), resamples, seed, level)


def interval_table(val: Validation) -> Table:
    """One row per task and metric with an interval: the value beside its bounds."""
    intervals = intervals_of(val.metrics_path, val.predictions(), tasks=val.table)
    rows = []
    for task, values in val.metrics.items():
        for name, pair in intervals.get(task, {}).items():
            if pair is not None:
                rows.append([task, name, values.get(name), pair[0], pair[1]])
    # A run may have been trained or evaluated with another `intervals.level`: its file says which.
    level = _saved(val.metrics_path).get("level", 0.95)
    return Table(["task", "metric", "value", "lo", "hi"], rows, title=f"{level:.0%} bootstrap intervals at {val.name}")


def ablation_intervals(runs: Sequence[Run], labels: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """``{task/metric: {label: [lo, hi]}}`` of each task's headline metric at each run's latest validation
    (a baseline: its test split): the error bars of the ablation chart."""
    out: dict[str, dict[str, list[float]]] = {}
    for run, label in zip(runs, labels):
        # The bars' own source (`compare.ablation_data`): the latest validation, a baseline's test split.
        shown = run.latest if run.latest is not None else (run.evaluation("test") if "test" in run.evaluations else None)
        if shown is None:
            continue
        for task, values in intervals_of(shown.metrics_path, shown.predictions(), tasks=run.table).items():
            name = headline(task, run.table)
            pair = values.get(name or "")
            if pair is not None:
                out.setdefault(f"{task}/{name}", {})[label] = pair
    return out


# Up to this many runs every pair is compared (the four-variant ablation: 6 pairs); past it each run is compared
# with the first, so a sweep of 300 runs costs 299 comparisons, not 44,850, and holds two runs' answers at a time.
ALL_PAIRS_UP_TO = 8


def paired_table(runs: Sequence[Run], labels: Sequence[str], resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> Table:
    """For each pair of runs (in the given order; past `ALL_PAIRS_UP_TO` runs, each with the first), each task's
    headline metric: A, B, A - B with its paired bootstrap interval, whether the interval excludes zero, and
    the number of shared samples."""
    many = len(runs) > ALL_PAIRS_UP_TO
    pairs = ((0, j) for j in range(1, len(runs))) if many else combinations(range(len(runs)), 2)
    bases: dict[int, tuple] = {}
    rows = []
    for i, j in pairs:
        a, b = runs[i], runs[j]
        for k in (i, j):
            if k not in bases:
                bases[k] = basis(runs[k])
        (where_a, records_a), (where_b, records_b) = bases[i], bases[j]
        if many:
            bases.pop(j)  # each later run is read once
        if where_a != where_b and "test" in (where_a, where_b):
            # One was evaluated on the test split, the other not: compare their latest validations instead.
            where_a, records_a = (a.latest.name, a.latest.predictions()) if a.latest else ("-", [])
            where_b, records_b = (b.latest.name, b.latest.predictions()) if b.latest else ("-", [])
        table = a.table.with_declared(b.table.declared)  # one task by one name in both, or one line
        tasks = {r["task"]: headline(r["task"], table) for r in records_a}
        result = paired_difference(records_a, records_b, tasks, resamples, seed, level, table)
        on = where_a if where_a == where_b else f"{where_a} / {where_b}"
        for task, d in result.items():
            lo, hi = d["interval"] or (None, None)
            rows.append([labels[i], labels[j], on, task, d["metric"], d["a"], d["b"], d["difference"], lo, hi,
                         "yes" if d["excludes_zero"] else "no", d["samples"]])
    columns = ["a", "b", "on", "task", "metric", "a_value", "b_value", "difference", "lo", "hi", "excludes_zero",
               "samples"]
    title = f"Paired differences (A - B) with {level:.0%} bootstrap intervals"
    if many:
        title += f" (each of {len(runs) - 1} runs against {labels[0]}: more than {ALL_PAIRS_UP_TO} runs)"
    return Table(columns, rows, title=title)


def paired_runs_note(table: Table) -> str:
    """One line per pair saying on how many tasks the difference is clear."""
    lines = []
    pairs = dict.fromkeys((r["a"], r["b"]) for r in table.records())
    for a, b in pairs:
        mine = [r for r in table.records() if (r["a"], r["b"]) == (a, b)]
        clear = [r["task"] for r in mine if r["excludes_zero"] == "yes"]
        lines.append(f"- {a} vs {b}: {len(clear)} of {len(mine)} tasks differ beyond noise"
                     + (f" ({', '.join(clear)})" if clear else ""))
    return "\n".join(lines)


def compare_two(run_a: Run, run_b: Run, labels: Optional[Sequence[str]] = None, **settings) -> Table:
    """`paired_table` of two runs."""
    return paired_table([run_a, run_b], labels or [run_a.name, run_b.name], **settings)


def card_evaluation(folder: Path, ckpt: str) -> list[str]:
    """A model card's evaluation: the test metrics of the run in `folder` beside the paper's row with their
    intervals, or how to get them (`ckpt`: the run as the user named it, for the command they would run)."""
    run = load_run(folder)
    command = f"`python -m llasmol.evaluate ckpt={ckpt} data.split=test`"
    if "test" not in run.evaluations:
        return [f"Not evaluated on the test split yet: {command}, then export again."]
    table = evaluation_table(run, "test")
    bounds = {(r["task"], r["metric"]): (r["lo"], r["hi"]) for r in interval_table(run.evaluation("test")).records()}
    table.columns.insert(3, "95% interval")
    for row in table.rows:
        lo, hi = bounds.get((row[0], row[1]), (None, None))
        row.insert(3, "-" if lo is None else f"[{lo:.3f}, {hi:.3f}]")
    return [evaluation_note(run, table) + table.to_markdown(),
            f"Evaluated with {command}: the paper's beam search per task, answers read between the task's tags and "
            "scored by the paper's metrics (App. A.4); intervals are percentile bootstraps of the samples."]
