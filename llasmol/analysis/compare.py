"""Comparing the variants of a multirun (e.g. the LoRA ablation) with each other and the paper."""

from __future__ import annotations

from typing import Optional, Sequence, Union

from llasmol.analysis.paper import PAPER_MODELS, PAPER_RESULTS, PAPER_SOURCES, PAPER_TRAINABLE
from llasmol.analysis.runs import PathLike, Run, load_sweep
from llasmol.analysis.tables import Table, headline

# The paper rows `compare_table` shows unless told: the base of Section 5.4's LoRA ablation (LlaSMol Llama 2,
# which `paper_trainable` refers to) and the paper's best model.  `paper_models=PAPER_MODELS` shows every
# system the paper reports; `paper_table` lists them all without runs.
COMPARE_PAPER_MODELS: tuple[str, ...] = ("LlaSMol-Mistral", "LlaSMol-Llama 2")


def _runs(source: Union[PathLike, Sequence[Run]]) -> list[Run]:
    if isinstance(source, (list, tuple)):
        return list(source)
    return load_sweep(source)


def _compared(run: Run) -> dict[str, dict[str, Optional[float]]]:
    """The metrics a run is compared by: its latest validation's, or for a folder without validations (a
    baseline) its test split's."""
    return run.latest.metrics if run.latest is not None else run.evaluations.get("test", {})


def comparison_columns(runs: Sequence[Run], metrics: Optional[dict[str, Sequence[str]]] = None) -> list[tuple[str, str]]:
    """(task, metric) pairs to compare: every task any run's latest validation (a baseline: its test split)
    has, in first-seen order, with its headline metric (or the metrics `metrics[task]` names)."""
    columns: list[tuple[str, str]] = []
    for run in runs:
        for task in _compared(run):
            wanted = (metrics or {}).get(task) or [headline(task, run.table)]
            for m in wanted:
                if m and (task, m) not in columns:
                    columns.append((task, m))
    return columns


def variant_label(run: Run) -> str:
    """A short name for a variant: ``baseline:<method>`` for a baseline, the name of an outside system,
    ``<model>/<lora>`` when known, else the folder name."""
    if run.baseline is not None or run.system is not None:
        return run.label
    if run.params.get("model") and run.params.get("lora"):
        return f"{run.params['model']}/{run.params['lora']}"
    return run.name


def variant_labels(runs: Sequence[Run]) -> list[str]:
    """`variant_label` of each run; the folder name where two runs would share a label."""
    labels = [variant_label(run) for run in runs]
    return [run.name if labels.count(label) > 1 else label for run, label in zip(runs, labels)]


def compare_table(
    source: Union[PathLike, Sequence[Run]],
    metrics: Optional[dict[str, Sequence[str]]] = None,
    paper_models: Sequence[str] = COMPARE_PAPER_MODELS,
) -> Table:
    """One row per variant (its latest validation), one per variant evaluated on the whole test split (a
    baseline has this row only, named ``baseline:<method> (test)``), then one row per paper model.

    Columns: ``variant``, ``source`` (``run``, ``baseline`` or ``paper``), ``lora``, ``trainable``, ``percent``
    (of all parameters, in percent), ``paper_trainable``, ``paper_percent`` (Section 5.4's counts
    for the same `lora=` setting on Llama-2-7B), ``validation``, ``val/loss`` (at that validation: the
    number that separates the variants of a short run), ``paper_source`` (a paper row's tables and
    whether it is on the whole test set, `PaperSource.label`), then ``<task>/<metric>`` for each
    task's headline metric.  Paper rows carry the reported test-set numbers (fractions) and are
    blank where the paper's number is not available; ``lora`` and the trainable counts are filled
    for the LlaSMol rows only (the main tables' models use the full LoRA setting).
    """
    runs = _runs(source)
    columns = comparison_columns(runs, metrics)
    head = ["variant", "source", "lora", "trainable", "percent", "paper_trainable", "paper_percent", "validation",
            "val/loss", "paper_source"]
    rows = []
    for run, label in zip(runs, variant_labels(runs)):
        paper = PAPER_TRAINABLE.get(run.lora or "", {})
        latest = run.latest
        if latest is None and "test" in run.evaluations:
            continue  # nothing but a test split (a baseline): its test row below says it all
        rows.append(
            [label, "run", run.lora, run.params.get("trainable"), run.params.get("percent"),
             paper.get("trainable"), paper.get("percent"), latest.name if latest else None, run.val_loss, None]
            + [latest.metrics.get(t, {}).get(m) if latest else None for t, m in columns]
        )
    for run, label in zip(runs, variant_labels(runs)):
        if "test" in run.evaluations:  # the whole test split, where evaluated: comparable with the paper rows
            test = run.evaluations["test"]
            rows.append([f"{label} (test)", "baseline" if run.baseline is not None else "run", run.lora,
                         run.params.get("trainable"), run.params.get("percent"), None, None, "test", None, None]
                        + [test.get(t, {}).get(m) for t, m in columns])
    for model in paper_models:
        results, src = PAPER_RESULTS[model], PAPER_SOURCES[model]
        lora, full = ("full", PAPER_TRAINABLE["full"]) if src.kind == "LlaSMol" else (None, {})
        rows.append(
            [model, "paper", lora, None, None, full.get("trainable"), full.get("percent"),
             "test" if src.full_test_set else "test subset", None, src.label]
            + [results.get(t, {}).get(m) for t, m in columns]
        )
    return Table(head + [f"{t}/{m}" for t, m in columns], rows, title="Variants beside the paper")


def paper_table(
    tasks: Optional[Sequence[str]] = None,
    models: Sequence[str] = PAPER_MODELS,
    metrics: Optional[dict[str, Sequence[str]]] = None,
) -> Table:
    """The paper's reported numbers side by side: one row per system (`models`, default all), with its
    ``kind``, ``paper_source`` (tables; whole test set or not) and ``caveat``, then ``<task>/<metric>``
    for each of `tasks` (default: every task any of `models` has) with its headline metric (or the
    metrics `metrics[task]` names).  Blank where the paper's number is not here (see `paper`)."""
    if tasks is None:
        tasks = list(dict.fromkeys(t for m in models for t in PAPER_RESULTS[m]))
    columns = [(t, m) for t in tasks for m in ((metrics or {}).get(t) or [headline(t)]) if m]  # the paper's: SMolInstruct's
    rows = [
        [model, PAPER_SOURCES[model].kind, PAPER_SOURCES[model].label, PAPER_SOURCES[model].caveat or None]
        + [PAPER_RESULTS[model].get(t, {}).get(m) for t, m in columns]
        for model in models
    ]
    return Table(["system", "kind", "paper_source", "caveat"] + [f"{t}/{m}" for t, m in columns], rows,
                 title="The paper's reported numbers (test set)")


# The share of samples with an answer between the task's tags, over every task: it parts a short run's variants
# while each exact match is still 0.
ANSWERED = "answered"


def _answered(metrics: dict[str, dict[str, Optional[float]]]) -> Optional[float]:
    counted = [v for v in metrics.values() if v.get("num_samples") is not None and v.get("num_no_answer") is not None]
    samples = sum(v["num_samples"] for v in counted)
    return (samples - sum(v["num_no_answer"] for v in counted)) / samples if samples else None


def ablation_data(
    source: Union[PathLike, Sequence[Run]], metrics: Optional[dict[str, str]] = None
) -> dict[str, dict[str, Optional[float]]]:
    """``{task/metric: {variant label: value}}`` of each task's headline metric (or ``metrics[task]``) at
    each variant's latest validation (a baseline: its test split), with ``val/loss``, ``train/loss`` (the
    last logged), ``trainable (M)``, ``minutes`` (the training command's wall time) and `ANSWERED` (the share
    of samples answered between the tags, over all tasks) first; the input of
    `llasmol.analysis.plots.plot_ablation`."""
    runs = _runs(source)
    wanted = {t: [m] for t, m in (metrics or {}).items()}
    labels = variant_labels(runs)
    data: dict[str, dict[str, Optional[float]]] = {
        "val/loss": {label: run.val_loss for run, label in zip(runs, labels)},
        "train/loss": {label: run.train_loss for run, label in zip(runs, labels)},
        "trainable (M)": {label: (run.params["trainable"] / 1e6 if run.params.get("trainable") else None)
                          for run, label in zip(runs, labels)},
        "minutes": {label: (run.seconds / 60 if run.seconds is not None else None)
                    for run, label in zip(runs, labels)},
    }
    data[ANSWERED] = {label: _answered(_compared(run)) for run, label in zip(runs, labels)}
    for task, metric in comparison_columns(runs, wanted):
        data[f"{task}/{metric}"] = {
            label: _compared(run).get(task, {}).get(metric) for run, label in zip(runs, variant_labels(runs))
        }
    return data
