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


def monitor_problem(monitor: Optional[str], objective: str, tasks: TaskTable, trained: list[str],
                    generates: bool = True) -> Optional[str]:
    """Why `callbacks.model_checkpoint.monitor` is no metric a run of `objective` training the tasks `trained` logs
    (`generates`: its validation generates answers, so it logs metrics beside val/loss); None when it is one, or
    null (no best checkpoint). Lightning keeps no best checkpoint for a metric it never sees, and `evaluate` and
    `init_from` would then take the last adapter without a word."""
    if monitor is None or monitor in ("val/loss", "train/loss"):
        return None
    grpo, parts = objective == "grpo", str(monitor).split("/")
    if generates and grpo and (parts[:2] == ["val", "reward"] and (len(parts) == 2 or parts[2] in trained)
                               or monitor in ("val/reward_lo", "val/reward_hi")):
        return None
    if generates and len(parts) == 3 and parts[0] == "val" and parts[1] in trained:
        name = parts[2].removesuffix("_lo").removesuffix("_hi")
        if name in FAMILIES[tasks.task(parts[1]).family].metric_names or name in ("num_samples", "num_no_answer"):
            return None
    if not generates:
        return (f"callbacks.model_checkpoint.monitor={monitor}: callbacks.generation_evaluator.samples_per_task=0 "
                "generates no answer at validation, so only val/loss is logged there: give it samples, or "
                "callbacks.model_checkpoint.monitor=val/loss callbacks.model_checkpoint.mode=min")
    example = f"val/{trained[0]}/{tasks.task(trained[0]).headline}" if trained else "val/<task>/<metric>"
    return (f"callbacks.model_checkpoint.monitor={monitor} is no metric this run logs, so no best checkpoint would be "
            f"kept (evaluate and init_from would take the last adapter): give val/loss"
            + (", val/reward" if grpo else "") + f" or a trained task's metric such as {example}")
