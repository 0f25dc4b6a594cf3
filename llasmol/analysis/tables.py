"""Tables from a run: per-task metrics, top-k curves, failure breakdowns, worst examples, trends.

Tables are plain `Table` objects (column names + rows of cells) that render to Markdown and CSV;
in a notebook they display as Markdown.  Per-sample judgements reuse
`llasmol.metrics.scoring.sample_stats` (golds pooled over samples sharing an input, as the metrics
do), so a table's "correct" count over its samples equals ``exact_match`` (or ``accuracy``) x
``num_samples`` of the same validation.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence, Union

from llasmol.analysis.paper import NOT_TRANSCRIBED, PAPER_MODEL_OF_BASE, PAPER_MODELS, PAPER_RESULTS, PAPER_SOURCES
from llasmol.analysis.runs import Run, Validation
from llasmol.core.errors import UserError
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.metrics.families import CATEGORIES, COUNTS, FAMILIES, METRIC_ORDER, TOPK
from llasmol.metrics.scoring import as_list, is_skipped, judge, record_answers, record_golds
from llasmol.metrics.support import shown, with_support

Cell = Union[str, int, float, None]

# The metric the paper's main tables (Tables 2 and 3) report first for each task (the task table's).
def headline(task: str, tasks: TaskTable = SMOLINSTRUCT) -> Optional[str]:
    """The metric `task`'s tables show first (its row's in `tasks`); None for a task `tasks` lacks."""
    row = tasks.get(task)
    return row.headline if row is not None else None

FAILURE_CATEGORIES: tuple[str, ...] = CATEGORIES
"""Per-sample outcome of the top-1 answer (`llasmol.metrics.families.CATEGORIES`):

- ``correct``: right by the task's metric (exact match; for yes/no tasks, the right label);
- ``wrong``: a well-formed answer that is not right (for SMILES tasks: a valid molecule that is
  not a gold one);
- ``invalid``: an answer is there but does not parse (SMILES RDKit cannot read, a formula that
  is not one, a number that is not one, a word other than yes/no);
- ``no_answer``: no answer between the task's tags (the model was asked and did not answer);
- ``skipped``: not generated (prompt over the token limit);
- ``scored``: a well-formed answer with no right/wrong verdict, only a continuous score
  (ESOL/Lipo numbers for RMSE, captions for METEOR/BLEU/ROUGE).
"""


@dataclass
class Table:
    """Column names and rows; `to_markdown`, `to_csv`, and `records` (list of dicts)."""

    columns: list[str]
    rows: list[list[Cell]]
    title: str = ""

    def records(self) -> list[dict[str, Cell]]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def column(self, name: str) -> list[Cell]:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]

    def row(self, first_cell: Cell) -> dict[str, Cell]:
        """The row whose first cell is `first_cell` (e.g. a task name), as a dict."""
        for row in self.rows:
            if row[0] == first_cell:
                return dict(zip(self.columns, row))
        raise KeyError(first_cell)

    def to_markdown(self, digits: int = 3, max_chars: Optional[int] = 80) -> str:
        def fmt(cell: Cell, column: str) -> str:
            counted = column in COUNTS
            if counted and isinstance(cell, float) and cell.is_integer():
                cell = int(cell)  # a count, even when it is 0
            text = format_cell(cell, digits)
            if max_chars and len(text) > max_chars:
                text = text[: max_chars - 1] + "…"
            return text.replace("|", "\\|").replace("\n", " ")

        lines = []
        if self.title:
            lines += [f"**{self.title}**", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(fmt(c, name) for c, name in zip(row, self.columns)) + " |")
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        for row in self.rows:
            writer.writerow(["" if c is None else c for c in row])
        return buf.getvalue()

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return self.to_markdown()


def format_cell(cell: Cell, digits: int = 3) -> str:
    """Markdown text of a cell: None -> '-', whole floats as integers, others rounded; a metric value with
    the samples it stands on where that is not all or too few (`llasmol.metrics.support`)."""
    if cell is None:
        return "-"
    if isinstance(cell, float):
        if not math.isfinite(cell):
            return shown("-", cell)
        if cell.is_integer() and abs(cell) >= 1:
            return shown(str(int(cell)), cell)
        return shown(f"{cell:.{digits}f}", cell)
    return str(cell)


def _text_cell(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.4f}"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def headline_metrics(task: str, values: dict[str, Any], tasks: TaskTable = SMOLINSTRUCT) -> list[str]:
    """The metrics shown for `task` by default: its headline metric (the task table's) and its sample count,
    those of the two `values` has. Every metric stays in the files; `all_metrics=true` (evaluate, baseline)
    and `report --all-metrics` show them all."""
    wanted = [headline(task, tasks), "num_samples"]
    return [name for name in wanted if name in values]


def metric_lines(results: dict[str, dict[str, Any]], intervals: Optional[dict] = None, all_metrics: bool = False,
                 tasks: TaskTable = SMOLINSTRUCT) -> str:
    """What `evaluate` and `baseline` print: one line per task, its headline metric and sample count (all its
    metrics with `all_metrics`) as `name=value [lo, hi]`; `tasks`: the table the results' tasks are rows of."""
    width = max((len(t) for t in results), default=4)
    bounds = (intervals or {}).get("tasks", {})
    results = {task: with_support(task, metrics, tasks) for task, metrics in results.items()}
    if not all_metrics:
        results = {task: {m: metrics[m] for m in headline_metrics(task, metrics, tasks)}
                   for task, metrics in results.items()}

    def cell(task: str, name: str, value: Any) -> str:
        interval = bounds.get(task, {}).get(name)
        bounds_text = f" [{_text_cell(interval[0])}, {_text_cell(interval[1])}]" if interval else ""
        return shown(f"{name}={_text_cell(value)}{bounds_text}", value)

    return "\n".join(
        f"{task:<{width}}  " + "  ".join(cell(task, k, v) for k, v in metrics.items())
        for task, metrics in results.items()
    )


def _validation(source: Union[Run, Validation], which=None) -> Validation:
    return source if isinstance(source, Validation) else source.validation(which)


def _ordered_metrics(names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    known = [m for m in METRIC_ORDER if m in names]
    return known + [m for m in names if m not in METRIC_ORDER]


# --------------------------------------------------------------------------- metric table


def headline_table(source: Union[Run, Validation], validation=None) -> Table:
    """One row per task of a validation (the latest unless `validation` picks one): its headline metric's
    name and value and the samples scored (`metric_table` has every metric)."""
    val = _validation(source, validation)
    rows = [[task, name, values.get(name), values.get("num_samples")]
            for task, values in val.metrics.items() for name in [headline(task, val.table)]]
    return Table(["task", "metric", "value", "num_samples"], rows, title=f"Headline metrics at {val.name}")


def metric_table(
    source: Union[Run, Validation], validation=None, metrics: Optional[Sequence[str]] = None
) -> Table:
    """One row per task of a validation (the latest unless `validation` picks one), one column per
    metric (all metrics any task reports, scores first; or those in `metrics`)."""
    val = _validation(source, validation)
    names = list(metrics) if metrics else _ordered_metrics(m for values in val.metrics.values() for m in values)
    rows = [[task] + [values.get(m) for m in names] for task, values in val.metrics.items()]
    return Table(["task"] + names, rows, title=f"Metrics at {val.name}")


# --------------------------------------------------------------------------- top-k curves


def topk_curves(source: Union[Run, Validation], validation=None) -> dict[str, list[tuple[int, float]]]:
    """``{task: [(k, top-k exact match), ...]}`` for tasks reporting top-k exact match, k ascending."""
    val = _validation(source, validation)
    curves = {}
    for task, values in val.metrics.items():
        points = [(k, values[f"top{k}_exact_match"]) for k in TOPK if values.get(f"top{k}_exact_match") is not None]
        if points:
            curves[task] = points
    return curves


def topk_table(source: Union[Run, Validation], validation=None) -> Table:
    """The top-k curves as a table: one row per task, one column per k (blank where not generated)."""
    curves = topk_curves(source, validation)
    ks = sorted({k for points in curves.values() for k, _ in points})
    rows = [[task] + [dict(points).get(k) for k in ks] for task, points in curves.items()]
    return Table(["task"] + [f"top{k}" for k in ks], rows, title="Top-k exact match")


# --------------------------------------------------------------------------- per-sample judgement


def judge_sample(task: str, predictions: Sequence[str], golds: Sequence[str],
                 answers=None, tasks: TaskTable = SMOLINSTRUCT) -> tuple[str, Optional[float]]:
    """The failure category (`FAILURE_CATEGORIES`, except ``skipped``) of one sample's top-1 answer,
    and a per-sample score where one exists: Morgan Tanimoto similarity to the closest gold for
    SMILES tasks, absolute error for ESOL/Lipo, METEOR for captions (None otherwise). `answers`: what is
    scored of each prediction when already read (`llasmol.metrics.scoring.record_answers`)."""
    return judge(task, list(predictions), list(golds), answers=answers, tasks=tasks)


def judged_samples(source: Union[Run, Validation], validation=None) -> list[dict]:
    """Every prediction record of a validation with ``category``, ``score`` and ``answer`` (the
    extracted top-1 answer) added; golds pooled as the scorer pools them (`record_golds`)."""
    val = _validation(source, validation)
    records = val.predictions()
    out = []
    for record, golds in zip(records, record_golds(records, val.table)):
        task = record["task"]
        predictions = as_list(record.get("predictions"))
        answers = record_answers(record, val.table)
        if is_skipped(record):
            category, score = "skipped", None
        else:
            category, score = judge_sample(task, predictions, golds, answers, val.table)
        out.append(
            {
                **record,
                "gold": golds,
                "answer": answers[0] if answers else None,
                "category": category,
                "score": score,
            }
        )
    return out


# --------------------------------------------------------------------------- failure breakdown


def failure_counts(source: Union[Run, Validation], validation=None) -> dict[str, dict[str, int]]:
    """``{task: {category: count}}`` over the validation's prediction records (every category of
    `FAILURE_CATEGORIES` present, zeros included), tasks in file order."""
    counts: dict[str, dict[str, int]] = {}
    for sample in judged_samples(source, validation):
        row = counts.setdefault(sample["task"], dict.fromkeys(FAILURE_CATEGORIES, 0))
        row[sample["category"]] += 1
    return counts


def failure_table(source: Union[Run, Validation], validation=None) -> Table:
    """`failure_counts` as a table: task, num_samples, then one column per category."""
    counts = failure_counts(source, validation)
    rows = [[task, sum(row.values())] + [row[c] for c in FAILURE_CATEGORIES] for task, row in counts.items()]
    return Table(["task", "num_samples", *FAILURE_CATEGORIES], rows, title="Top-1 answer outcomes")


# --------------------------------------------------------------------------- worst examples

_CATEGORY_RANK = {"wrong": 0, "scored": 0, "invalid": 1, "no_answer": 2, "skipped": 3}


def _badness(sample: dict, lower_is_better: bool) -> tuple:
    score = sample["score"]
    rank = _CATEGORY_RANK[sample["category"]]
    if score is None:
        return (rank, 0.0)
    if lower_is_better:  # an error: larger is worse
        return (rank, -score)
    return (rank, score)  # similarity / METEOR: smaller is worse


def worst_examples(
    source: Union[Run, Validation], validation=None, n: int = 5, tasks: Optional[Sequence[str]] = None
) -> dict[str, list[dict]]:
    """Up to `n` samples per task that are not correct, worst first: well-formed but wrong (or
    scored) answers ordered by lowest similarity to the gold (SMILES), largest error (ESOL/Lipo)
    or lowest METEOR (captions); then invalid answers, then missing answers, then skipped."""
    val = _validation(source, validation)
    worst: dict[str, list[dict]] = {}
    for sample in judged_samples(val):
        if sample["category"] == "correct" or (tasks and sample["task"] not in tasks):
            continue
        worst.setdefault(sample["task"], []).append(sample)
    errors = {task: FAMILIES[val.table.task(task).family].score_lower_is_better for task in worst}
    return {task: sorted(samples, key=lambda s: _badness(s, errors[task]))[:n] for task, samples in worst.items()}


def worst_table(worst: dict[str, list[dict]]) -> Table:
    """The `worst_examples` as one table: task, index, category, score, input (the core input),
    answer (extracted top-1), gold (all, '; '-joined), prediction (the raw top-1 text)."""
    rows = []
    for task, samples in worst.items():
        for s in samples:
            rows.append(
                [task, s.get("index"), s["category"], s["score"], s.get("raw_input") or s.get("input"),
                 s["answer"], "; ".join(as_list(s["gold"])), (as_list(s.get("predictions")) or [None])[0]]
            )
    columns = ["task", "index", "category", "score", "input", "answer", "gold", "prediction"]
    return Table(columns, rows, title="Worst examples")


# --------------------------------------------------------------------------- trends


def metric_trends(run: Run, metrics: Union[None, str, Sequence[str]] = None) -> Table:
    """One row per validation, oldest first (by optimizer step), one column ``<task>/<metric>`` per task
    and metric: each task's headline metric (`headline`) by default, or the given metric name(s)
    for every task that reports them."""
    if isinstance(metrics, str):
        metrics = [metrics]
    columns: list[tuple[str, str]] = []
    for val in run.validations:
        for task, values in val.metrics.items():
            wanted = metrics if metrics else [headline(task, run.table)]
            for m in wanted:
                if m in values and (task, m) not in columns:
                    columns.append((task, m))
    rows = [[val.step] + [val.metrics.get(t, {}).get(m) for t, m in columns] for val in run.validations]
    return Table(["step"] + [f"{t}/{m}" for t, m in columns], rows, title="Metric trends")


# --------------------------------------------------------------------------- test set beside the paper


def _paper_model(run: Run) -> Optional[str]:
    """The paper's row a run's whole-split results stand beside; None where the paper has none."""
    # A baseline stands beside the paper's first (best) model: what a fine-tuned LLM reaches on the task.
    if run.baseline is not None:
        return PAPER_MODELS[0]
    return (run.system or {}).get("paper_row") or PAPER_MODEL_OF_BASE.get(run.model or "")


def evaluation_note(run: Run, table: Table) -> str:
    """The line above `evaluation_table(run)` saying why its paper column, or some of its cells, are empty
    ('' when every cell is there): a reader should not take '-' for a zero or a bug."""
    paper_model = _paper_model(run)
    if not paper_model:
        what = ("the tiny demo model (2 layers, minutes of training: a demo, not a chemistry model)"
                if run.model == "tiny" else f"{run.label} (model={run.model})")
        return (f"Paper column empty: the paper reports no results for {what}. Its LlaSMol rows stand beside "
                f"runs on model={', '.join(PAPER_MODEL_OF_BASE)}.\n\n")
    empty = sorted({row[0] for row in table.rows if row[-1] is None})
    if not empty:
        return ""
    reasons = sorted({NOT_TRANSCRIBED[task] for task in empty if task in NOT_TRANSCRIBED})
    others = [task for task in empty if task not in NOT_TRANSCRIBED]
    if others:
        reasons.append(f"{paper_model} has no reported value for {', '.join(others)}")
    return "'-' in the paper column: " + "; ".join(reasons) + ".\n\n"


def evaluation_table(run: Run, split: str = "test") -> Table:
    """A run's whole-split results (`evaluate ckpt=<run> data.split=<split>`) beside the paper's Table
    values for the same base (`paper.PAPER_MODEL_OF_BASE`; a baseline's beside the paper's first model; an
    untuned base asked by the paper's protocol beside the paper's row of it, its `system.json` `paper_row`): one
    row per task and metric the paper reports for it (the task's headline metric where the paper has none)."""
    if split not in run.evaluations:
        have = ", ".join(sorted(run.evaluations)) or "none"
        raise UserError(f"{run.path} has no {split} results (has: {have}): run python -m llasmol.evaluate "
                        f"ckpt={run.path} data.split={split}")
    paper_model = _paper_model(run)
    paper = PAPER_RESULTS.get(paper_model, {}) if paper_model else {}
    rows = []
    for task, values in run.evaluations[split].items():
        reported = paper.get(task, {})
        names = [m for m in _ordered_metrics(reported) if m in values] or [headline(task, run.table)]
        rows += [[task, m, values.get(m), reported.get(m)] for m in names if m]
    source = f" (paper, {PAPER_SOURCES[paper_model].label})" if paper_model else ""
    title = f"{run.label}: {split} results" + (f" beside {paper_model}{source}" if paper_model else "")
    return Table(["task", "metric", "ours", f"paper {paper_model}" if paper_model else "paper"], rows, title=title)
