"""A GRPO run's stage in the report (`grpo.md`, `grpo.csv`; its chart, `grpo.png`, is `plots.plot_grpo_stage`): at each validation, `val/reward` with its
interval and each of its terms, and over the training steps since the previous validation what reveals an exploit
before the reward does: the share of completions that ended (and were cut at their bound), the most frequent
answer's share in a group and the distinct answers per group (collapse), the policy's token entropy, and the groups
that taught nothing. All read from the run's CSV log (`csv/metrics.csv`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from llasmol.analysis.runs import Run
from llasmol.analysis.tables import Table

# What a step logs that the table averages over the steps before each validation (llasmol/finetune/rollouts.py).
WATCHED = ("train/reward", "train/completion_ended", "train/completion_clipped", "train/collapse/top_answer_share",
           "train/collapse/distinct_answers", "train/entropy", "train/no_signal")


def is_grpo(run: Run) -> bool:
    """Whether the run logged a GRPO stage (validation rewards or training rewards)."""
    return any(row.get("val/reward") is not None or row.get("train/reward") is not None for row in run.csv_log())


def stage_table(run: Run) -> Table:
    """One row per validation: val/reward [lo, hi], each term (per task), and the mean of each `WATCHED` series over
    the steps since the previous validation."""
    rows = run.csv_log()
    validations = [r for r in rows if r.get("val/reward") is not None and r.get("step") is not None]
    terms = sorted({name for r in validations for name in r if name.startswith("val/reward/") and name.count("/") == 3})
    columns = ["step", "val/reward", "lo", "hi", *terms, *(f"{name} (mean)" for name in WATCHED)]
    out, last = [], -1
    for row in validations:
        step = int(row["step"])
        window = [r for r in rows if r.get("step") is not None and last < int(r["step"]) <= step]
        means = []
        for name in WATCHED:
            values = [r[name] for r in window if r.get(name) is not None]
            means.append(sum(values) / len(values) if values else None)
        out.append([step, row["val/reward"], row.get("val/reward_lo"), row.get("val/reward_hi"),
                    *(row.get(term) for term in terms), *means])
        last = step
    return Table(columns, out, title=f"{run.label}: the GRPO stage, validation by validation (means of the "
                                     "training steps since the one before)")
