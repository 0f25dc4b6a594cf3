"""How many answers a metric's value stands on, and when that is too few to compare with another value.

An RMSE is taken over the answers that parse as numbers, F1 and MCC over the yes/no answers, fingerprint
similarity over the valid molecules, caption scores over the non-empty captions (`Family.basis`): an ESOL
RMSE of 0.63 from 1 valid answer of 30 is not the paper's 0.63. Every place a metric is shown says
``n=<basis> of <samples>`` when the basis is not every sample, and ``too few`` when it is under
`FEWEST_TO_COMPARE`.
"""

from __future__ import annotations

import math
from typing import Optional

from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.metrics.families import FAMILIES

# Under 10 samples one answer more or less moves a share by more than 0.1, more than most differences the
# paper's tables draw, and a percentile bootstrap interval of so few is narrower than the truth.
FEWEST_TO_COMPARE = 10


def support(task: str, metric: str, values: dict, tasks: TaskTable = SMOLINSTRUCT) -> Optional[tuple[int, int]]:
    """(samples `metric`'s value stands on, samples scored) from a task's metric `values`; None for a count,
    a task `tasks` lacks, an unknown metric, or values without their counts."""
    row = tasks.get(task)
    family = FAMILIES[row.family] if row is not None else None
    total = values.get("num_samples")
    if family is None or total is None:
        return None
    basis = family.basis(metric, values)
    if basis is None or not math.isfinite(basis) or not math.isfinite(total):
        return None
    return int(basis), int(total)


def support_note(task: str, metric: str, values: dict, tasks: TaskTable = SMOLINSTRUCT) -> str:
    """``n=1 of 30, too few``, ``n=12 of 30``, ``n=4, too few``; '' for a value on enough samples, all of them."""
    return note_of(support(task, metric, values, tasks))


def note_of(counted: Optional[tuple[int, int]]) -> str:
    """`support_note` of a `support` already taken."""
    if counted is None:
        return ""
    n, total = counted
    parts = [f"n={n}" + (f" of {total}" if n != total else "")]
    if n < FEWEST_TO_COMPARE:
        parts.append("too few")
    return ", ".join(parts) if len(parts) > 1 or n != total else ""


class Counted(float):
    """A metric value that remembers its `support_note`: a float everywhere (sums, CSV, JSON, charts), shown
    with its note where tables and lines print it (`shown`)."""

    note: str

    def __new__(cls, value: float, note: str = "") -> "Counted":
        made = super().__new__(cls, value)
        made.note = note
        return made

    def __reduce__(self):  # copies and pickles (a notebook's deepcopy, multiprocessing) keep the note
        return (Counted, (float(self), self.note))


def with_support(task: str, values: dict, tasks: TaskTable = SMOLINSTRUCT) -> dict:
    """`values` with each metric whose `support_note` is not empty as a `Counted` (None stays None)."""
    out = {}
    for name, value in values.items():
        note = support_note(task, name, values, tasks) if isinstance(value, float) else ""
        out[name] = Counted(value, note) if note else value
    return out


def shown(text: str, value) -> str:
    """`text` (a value as printed) followed by its count where it is a `Counted`: ``0.630 (n=1 of 30, too few)``."""
    note = getattr(value, "note", "")
    return f"{text} ({note})" if note else text
