"""What a report folder holds: the files `python -m llasmol.report` writes for a run, a multirun or two runs.

A run's (of its latest validation unless one is named): each evaluated split beside the paper's numbers, the
metrics, the best constant answer, the intervals, top-k, failures, trends, the worst examples and their charts;
a multirun's: the variants beside the paper, the ablation chart with intervals, every pair of variants; two
runs': their paired differences (the command's docstring lists the files).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from llasmol import analysis
from llasmol.analysis import grpo_stage, pairs, trivial
from llasmol.core.errors import UserError
from llasmol.core.files import check_room, nearest_existing, raise_if_unwritable, write_text
from llasmol.core.tasks import TASK_NAMES


def _write(path: Path, text: str, written: list[Path]) -> None:
    write_text(path, text)  # atomic: a full disk or a read-only folder is one line naming the file
    written.append(path)


def _out_folder(out: Path) -> Path:
    """The report's folder, made; `--out` naming a file (or a pipe) is one line, not a traceback."""
    # The first part of the path that exists must be a folder: --out <file>/sub cannot be made either.
    existing = nearest_existing(out)
    if not existing.is_dir():
        raise UserError(f"--out {out} is not a folder: {existing} is a file; give the folder the report's files go "
                        "into (it is made if missing), e.g. --out " + str(existing.parent / "report"))
    check_room(f"--out {out}", out)  # read-only, virtual (/proc) or full: before any chart is drawn
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise_if_unwritable(err, out)
        raise
    return out


ALL_METRICS_NOTE = ("\nEach task's headline metric (the one the paper's tables lead with) and its samples; every "
                    "metric is in metrics.csv, and in this table with `python -m llasmol.report <run> --all-metrics`.\n")


def coverage_note(tasks: Sequence[str]) -> str:
    """A line saying which of the 14 tasks the run's data lacks, and which tasks of its own it has; or nothing."""
    missing = [t for t in TASK_NAMES if t not in tasks]
    own = [t for t in tasks if t not in TASK_NAMES]
    note = f" and {len(own)} of your own ({', '.join(own)}, data.new_tasks)" if own else ""
    if not missing:
        return f"\nTasks: the {len(TASK_NAMES)} SMolInstruct tasks{note}.\n" if own else ""
    if len(missing) == len(TASK_NAMES):
        return f"\nTasks: {len(own)} of your own ({', '.join(own)}, data.new_tasks), none of SMolInstruct's.\n"
    return (f"\nTasks: {len(TASK_NAMES) - len(missing)} of the {len(TASK_NAMES)} SMolInstruct tasks{note}; not in "
            f"this run's data: {', '.join(missing)} (`data.tasks=[...]` chooses tasks; "
            "llasmol/data/bundled/PROVENANCE.md says which the bundled excerpt leaves out, and why).\n")


def report_run(run_dir, out_dir=None, validation=None, worst: int = 5, all_metrics: bool = False) -> list[Path]:
    """Write a run's report (`all_metrics`: every metric in metrics.md, not each task's headline one); returns
    the files written."""
    run = analysis.load_run(run_dir, require_validation=True)
    val = run.validation(validation)
    out = _out_folder(Path(out_dir) if out_dir else run.path / "report")
    written: list[Path] = []

    for split in run.evaluations:  # whole-split results (evaluate ckpt=<run>), beside the paper's numbers
        table = analysis.evaluation_table(run, split)
        _write(out / f"{split}.md", analysis.evaluation_note(run, table) + table.to_markdown(), written)
        _write(out / f"{split}.csv", table.to_csv(), written)
    metrics = analysis.metric_table(val)  # metrics.csv: every metric; metrics.md: the headline ones unless asked
    shown = metrics if all_metrics else analysis.headline_table(val)
    shown.title = f"{run.label}: {'metrics' if all_metrics else 'headline metrics'} at {val.name}"
    _write(out / "metrics.md", (trivial.NOTE if run.model == "tiny" else "") + shown.to_markdown() + "\n"
           + coverage_note(val.tasks) + ("" if all_metrics else ALL_METRICS_NOTE), written)
    floors = {}
    if val.predictions():
        floor = trivial.constant_answer_table(val.predictions(), val.table)
        _write(out / "trivial.md", floor.to_markdown(), written)
        _write(out / "trivial.csv", floor.to_csv(), written)
        if val.split is None:  # a validation subset is drawn once per run: one floor for all its validations
            floors = {f"{r['task']}/{r['metric']}": r["value"] for r in floor.records()}
    _write(out / "metrics.csv", metrics.to_csv(), written)
    intervals = pairs.interval_table(val)
    intervals.title = f"{run.label}: {intervals.title}"
    _write(out / "intervals.md", INTERVALS_NOTE + intervals.to_markdown(), written)
    _write(out / "intervals.csv", intervals.to_csv(), written)
    _write(out / "topk.csv", analysis.topk_table(val).to_csv(), written)
    analysis.plot_topk(analysis.topk_curves(val), out / "topk.png", title=f"{run.label}: top-k exact match at {val.name}")
    written.append(out / "topk.png")

    if run.validations:  # a baseline or an evaluation alone has no validations to follow
        trends = analysis.metric_trends(run)
        _write(out / "trends.csv", trends.to_csv(), written)
        analysis.plot_trends(trends, out / "trends.png", title=f"{run.label}: loss and headline metrics across "
                             "validations", losses=run.loss_curves(), floors=floors, rewards=run.reward_curves())
        written.append(out / "trends.png")
    if grpo_stage.is_grpo(run):  # the RL stage: its rewards, terms and the signs of an exploit
        stage = grpo_stage.stage_table(run)
        _write(out / "grpo.md", GRPO_NOTE + stage.to_markdown(), written)
        _write(out / "grpo.csv", stage.to_csv(), written)
        analysis.plot_grpo_stage(run, out / "grpo.png", title=f"{run.label}: the GRPO stage")
        written.append(out / "grpo.png")

    if val.predictions_path is None:
        print(f"note: {run.path} has no predictions/{val.name}.jsonl: no failure breakdown or worst examples")
        return written
    counts = analysis.failure_counts(val)
    failures = analysis.failure_table(val)
    _write(out / "failures.md", failures.to_markdown(), written)
    _write(out / "failures.csv", failures.to_csv(), written)
    analysis.plot_failures(counts, out / "failures.png", title=f"{run.label}: top-1 answer outcomes at {val.name}")
    written.append(out / "failures.png")

    worst_by_task = analysis.worst_examples(val, n=worst)
    _write(out / "worst.md", analysis.worst_table(worst_by_task).to_markdown(), written)
    for task, examples in worst_by_task.items():
        if val.table.task(task).answer_tag == "SMILES" and analysis.draw_examples(examples, out / f"worst_{task}.png") is not None:
            written.append(out / f"worst_{task}.png")
    return written


def report_sweep(sweep_dir, out_dir=None) -> list[Path]:
    """Write a multirun's comparison; returns the files written."""
    runs = analysis.load_sweep(sweep_dir)
    if not any(run.validations or run.evaluations for run in runs):
        raise UserError(f"{sweep_dir}: no run has a validation yet (no metrics/val-step*.json) nor an "
                        "evaluated split (metrics/<split>.json)")
    out = _out_folder(Path(out_dir) if out_dir else Path(sweep_dir) / "report")
    written: list[Path] = []
    table = analysis.compare_table(runs)
    note = (
        "Run rows: each variant's latest validation (a subset of the validation split); '(test)' rows: the whole "
        "test split (baselines have only these). Paper rows: the paper's reported test-set numbers (fractions), "
        "their tables in `paper_source`; '-' where not available. Every system the paper reports: "
        "`analysis.paper_table()`.\n\n"
    )
    _write(out / "comparison.md", note + table.to_markdown(), written)
    _write(out / "comparison.csv", table.to_csv(), written)
    data = analysis.ablation_data(runs)
    labels = list(data["val/loss"])
    intervals = pairs.ablation_intervals(runs, labels)
    drawn = any(bound is not None for by_variant in intervals.values() for bound in by_variant.values())
    analysis.plot_ablation(data, out / "ablation.png",
                           title=f"{Path(sweep_dir).name}: variants at their latest validation"
                           + ("" if all(run.validations for run in runs) else " (or test split)")
                           + (", 95% intervals" if drawn else ""), intervals=intervals)
    written.append(out / "ablation.png")
    written += _write_pairs(pairs.paired_table(runs, labels), out)
    return written


def report_two(path_a, path_b, out_dir=None) -> list[Path]:
    """Write the paired comparison of two runs; returns the files written."""
    run_a, run_b = (analysis.load_run(p, require_validation=True) for p in (path_a, path_b))
    labels = [run_a.label, run_b.label] if run_a.label != run_b.label else [str(path_a), str(path_b)]
    out = _out_folder(Path(out_dir) if out_dir else run_a.path / "report" / f"vs_{run_b.name}")
    return _write_pairs(pairs.paired_table([run_a, run_b], labels), out)


def _write_pairs(table, out: Path) -> list[Path]:
    written: list[Path] = []
    note = (PAIRS_NOTE + pairs.paired_runs_note(table) + "\n\n") if table.rows else (
        "No two runs share scored samples (paired comparisons need the same samples).\n\n")
    _write(out / "pairs.md", note + table.to_markdown(), written)
    _write(out / "pairs.csv", table.to_csv(), written)
    print(pairs.paired_runs_note(table) if table.rows else note.strip())
    return written


GRPO_NOTE = (
    "What reveals an exploit before the reward does (docs/rl.md, \"What to watch\"): completions that stop ending "
    "(`completion_ended` falls, `completion_clipped` rises), one answer taking over its groups (`top_answer_share` "
    "towards 1, `distinct_answers` towards 1), and the policy's entropy collapsing, while `val/reward` rises. "
    "`val/reward`'s interval is a 95% bootstrap over the validation samples: two checkpoints whose intervals overlap "
    "widely are not told apart by it.\n\n")
INTERVALS_NOTE = (
    "Percentile intervals of 1,000 bootstrap resamples of the scored samples (for tasks whose golds are "
    "pooled over one input, of the inputs). They say how much the number could move on another draw of "
    "samples of this size.\n\n")
PAIRS_NOTE = (
    "A - B of each task's headline metric on the samples both answered, with a 95% paired bootstrap "
    "interval (both resampled together). `excludes_zero: yes`: the samples tell A and B apart (the interval "
    "excludes 0 and each value stands on at least 10 answers); `no`: the difference may be noise. RMSE is lower-is-better: there a negative difference favours A.\n\n")


def report_paths(paths: Sequence[str], out=None, validation=None, worst: int = 5, all_metrics: bool = False) -> list[Path]:
    """`python -m llasmol.report`'s paths, checked, to the report they ask for: a run's, a multirun's, or two
    runs' paired differences; the files written."""
    if worst < 0:
        raise UserError(f"--worst {worst} must be a whole number >= 0 (worst examples per task; 0: none)")
    if len(paths) > 2:
        raise UserError(f"{len(paths)} paths given: give one run or multirun directory, or two runs to compare")
    for given in paths:
        if not Path(given).is_dir():
            raise UserError(f"{given} is not a directory (give a run directory or a multirun directory)")
    path = Path(paths[0])
    if len(paths) == 2:
        for given in paths:
            if not analysis.is_run_dir(given):
                raise UserError(f"{given} is not a run directory: two paths compare two runs (params.json, "
                                "metrics/, predictions/)")
        return report_two(path, Path(paths[1]), out)
    if analysis.is_run_dir(path):
        return report_run(path, out, validation, worst, all_metrics)
    if analysis.is_multirun_dir(path):
        return report_sweep(path, out)
    raise UserError(f"{path} is neither a run directory (params.json, metrics/, predictions/) "
                    "nor a multirun directory (run directories inside)")
