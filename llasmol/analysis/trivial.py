"""What a constant answer scores on the samples a run was scored on: the floor a model must clear.

Per task, the answer that does best as a constant: the gold most often seen (the majority class of the
yes/no tasks), or the golds' mean for the numeric ones. It is chosen with the golds in view, so it bounds
what any constant answer could score there; it is scored by the same code as the model's answers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Optional, Sequence

from llasmol.analysis.tables import Table
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.metrics.intervals import per_sample_statistics

NOTE = (
    "How low to expect: the tiny demo model has 2 layers (0.8M parameters) and sees a few thousand samples for "
    "minutes. Pretrained on RDKit facts about the training split's molecules (llasmol/model/demo_base/README.md), "
    "it writes molecular formulas (NC-S2F) and little else right; from random weights (model.random_init=true) "
    "it learns the shape of the answers long before a correct molecule, formula or name, so exact match stays 0. "
    "A yes/no or numeric answer scores only once it sits between the right tags. For scale, the best constant "
    "answer on the same samples is in `trivial.md`; `python -m llasmol.baseline method=nearest_neighbor "
    "data.split=validation` answers every task from the most similar training inputs (compare with "
    "`python -m llasmol.report <run> <that folder>`).\n\n"
)


def _constant(family: str, golds: list[str]) -> Optional[str]:
    if family == "number":
        values = []
        for gold in golds:
            try:
                values.append(float(gold))
            except ValueError:
                continue
        return f"{sum(values) / len(values):.2f}" if values else None
    return Counter(golds).most_common(1)[0][0] if golds else None


def constant_answer_table(records: Sequence[dict], tasks: TaskTable = SMOLINSTRUCT) -> Table:
    """One row per task: the constant answer, its headline metric on `records`, and the samples scored
    (`tasks`: the table the records' tasks are rows of)."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_task[record["task"]].append(record)
    rows = []
    for task, group in by_task.items():
        row = tasks.task(task)
        answer = _constant(row.family, [r["gold"][0] for r in group if r.get("gold")])
        if answer is None:
            continue
        response = f"<{row.answer_tag}> {answer} </{row.answer_tag}>" if row.answer_tag else answer
        scored = [{**r, "predictions": [response], "skipped": False} for r in group]
        metrics = per_sample_statistics(scored, tasks)[task].metrics()
        rows.append([task, answer, row.headline, metrics.get(row.headline), len(group)])
    return Table(["task", "constant answer", "metric", "value", "samples"], rows,
                 title="The best constant answer on the same samples (chosen with the golds in view)")
