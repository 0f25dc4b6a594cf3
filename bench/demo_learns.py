"""Does the default job learn chemistry? Its test split against each task's trivial answer, with intervals.

    python bench/demo_learns.py                      # trains the default job, evaluates it on the test split
    python bench/demo_learns.py --run outputs/train/<run>   # a run already trained (and evaluated, or evaluated now)
    python bench/demo_learns.py --run <run> --label random   # a row label of your own (e.g. a model.random_init run)

For every task of the test split: its headline metric (the task table's), the 95% percentile bootstrap interval of
that metric over the test samples (10,000 resamples; the unit is the input for tasks whose golds are pooled, as
`llasmol.metrics.intervals` resamples), the best constant answer's value on the same samples (`analysis.trivial`:
the majority class, the golds' mean, the most frequent gold, chosen with the golds in view), and whether the
interval lies wholly on the better side of it (for RMSE, over every sample: the model must answer each with a
number, as the constant does). Also the paired interval of (model - constant) over the same
resampled samples. Written to bench/results/demo_learns.json (and printed as a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, write_result

RESAMPLES = 10_000


def _trained(run: Path | None) -> tuple[Path, float | None]:
    if run is not None:
        return run, None
    out = ROOT / "outputs" / "bench" / f"demo_learns_{time.strftime('%Y%m%d_%H%M%S')}"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={out}", "logger=csv"], check=True, cwd=ROOT)
    return out, time.perf_counter() - started


def _evaluated(run: Path) -> Path:
    predictions = run / "predictions" / "test.jsonl"
    if not predictions.is_file():
        subprocess.run([sys.executable, "-m", "llasmol.evaluate", f"ckpt={run}", "data.split=test"], check=True,
                       cwd=ROOT)
    return predictions


def compare(predictions: Path) -> list[dict]:
    """One row per task: the model's headline metric and interval, the constant answer's, and the paired gap."""
    from llasmol.analysis.trivial import constant_answer_table
    from llasmol.core.run_dir import read_tasks
    from llasmol.inference.predictions import read_predictions
    from llasmol.metrics.intervals import bootstrap_intervals, paired_difference
    from llasmol.metrics.scoring import per_sample_statistics

    tasks = read_tasks(predictions.parent.parent)
    records = read_predictions(predictions, tasks=tasks)
    samples = per_sample_statistics(records, tasks)
    intervals = bootstrap_intervals(samples, RESAMPLES, seed=0)
    floors = {row["task"]: row for row in constant_answer_table(records, tasks).records()}
    rows = []
    for task, sample in samples.items():
        row = tasks.task(task)
        metric, value = row.headline, sample.metrics().get(row.headline)
        floor = floors.get(task)
        constant = floor["constant answer"] if floor else None
        constant_records = [{**r, "predictions": [_wrapped(row, constant)]} for r in records if r["task"] == task]
        mine = [r for r in records if r["task"] == task]
        gap = paired_difference(mine, constant_records, {task: metric}, RESAMPLES, seed=0, tasks=tasks).get(task, {})
        low, high = intervals[task].get(metric) or (None, None)
        lower_better = metric == "rmse"
        beats = None
        stats = sample.metrics()
        # RMSE counts only the answers that are numbers, the constant answers every sample: a model that answered
        # 1 of 30 would "beat" it on that one. Beating it means answering all the samples it answers.
        answered = int(stats["num_valid"]) if "num_valid" in stats and metric == "rmse" else None
        if low is not None and floor and floor["value"] is not None:
            beats = high < floor["value"] if lower_better else low > floor["value"]
            beats = beats and (answered is None or answered == int(stats["num_samples"]))
        rows.append({"task": task, "metric": metric, "samples": int(stats["num_samples"]), "answered": answered,
                     "value": value, "lo": low, "hi": high, "constant_answer": constant,
                     "constant_value": floor["value"] if floor else None, "interval_excludes_constant": beats,
                     "paired_gap": gap.get("difference"), "paired_lo": (gap.get("interval") or [None, None])[0],
                     "paired_hi": (gap.get("interval") or [None, None])[1]})
    return rows


def _wrapped(row, answer) -> str:
    return f"<{row.answer_tag}> {answer} </{row.answer_tag}>" if row.answer_tag else str(answer)


def _cell(value, digits: int = 3) -> str:
    return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))


def markdown(rows: list[dict]) -> str:
    lines = ["| task | metric | n | model [95% interval] | best constant answer | model − constant [paired 95%] | beats it |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        n = r["samples"] if r.get("answered") is None else f"{r['answered']} of {r['samples']} answered"
        lines.append(f"| {r['task']} | {r['metric']} | {n} | {_cell(r['value'])} [{_cell(r['lo'])}, "
                     f"{_cell(r['hi'])}] | {_cell(r['constant_value'])} (`{r['constant_answer']}`) | "
                     f"{_cell(r['paired_gap'])} [{_cell(r['paired_lo'])}, {_cell(r['paired_hi'])}] | "
                     f"{'yes' if r['interval_excludes_constant'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a trained run directory (default: train the default job now)")
    parser.add_argument("--label", default="default job", help="what the result calls this run")
    parser.add_argument("--name", default="demo_learns", help="the result file's name under bench/results/")
    args = parser.parse_args()
    run, seconds = _trained(args.run)
    rows = compare(_evaluated(run))
    print(markdown(rows))
    beaten = [r for r in rows if r["interval_excludes_constant"]]
    print(f"\n{len(beaten)} of {len(rows)} tasks beat their best constant answer (interval wholly on the better side)")
    write_result(args.name, {"label": args.label, "run": str(run), "train_seconds": seconds, "resamples": RESAMPLES,
                             "tasks": rows, "beaten": [r["task"] for r in beaten]})


if __name__ == "__main__":
    main()
