"""The 14 SMolInstruct tasks and what each one is: one row per task, the only place these facts live.

A task's row says its name (as in the official archive), its metric family (`llasmol.metrics.families`), the tag its answer sits in, whether golds are pooled over samples
that share an input, and the metric the paper's main tables report first. Adding a task is one row here,
plus its beam settings in `conf/generation/paper.yaml`.

Pooling follows the official scorer (LLM4Chem config.py `TASKS_WITH_READING_GOLD_FROM_DATASET`): for the
generation tasks any gold of the samples with the same core input (and target) is right; property tasks
are scored against each sample's own label (pooling SIDER would let one answer count for another side
effect of the same molecule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from llasmol.core.errors import UserError


@dataclass(frozen=True)
class Task:
    name: str
    family: str  # smiles | formula | iupac | number | boolean | caption
    answer_tag: Optional[str]  # the response wraps its answer in <TAG> ... </TAG>; None: the whole response
    pooled: bool
    headline: str


TASKS: tuple[Task, ...] = (
    Task("forward_synthesis", "smiles", "SMILES", True, "exact_match"),
    Task("retrosynthesis", "smiles", "SMILES", True, "exact_match"),
    Task("molecule_captioning", "caption", None, True, "meteor"),
    Task("molecule_generation", "smiles", "SMILES", True, "exact_match"),
    Task("name_conversion-i2f", "formula", "MOLFORMULA", True, "exact_match"),
    Task("name_conversion-i2s", "smiles", "SMILES", True, "exact_match"),
    Task("name_conversion-s2f", "formula", "MOLFORMULA", True, "exact_match"),
    Task("name_conversion-s2i", "iupac", "IUPAC", True, "exact_match"),
    Task("property_prediction-esol", "number", "NUMBER", False, "rmse"),
    Task("property_prediction-lipo", "number", "NUMBER", False, "rmse"),
    Task("property_prediction-bbbp", "boolean", "BOOLEAN", False, "accuracy"),
    Task("property_prediction-clintox", "boolean", "BOOLEAN", False, "accuracy"),
    Task("property_prediction-hiv", "boolean", "BOOLEAN", False, "accuracy"),
    Task("property_prediction-sider", "boolean", "BOOLEAN", False, "accuracy"),
)

TASK_NAMES: tuple[str, ...] = tuple(t.name for t in TASKS)
_BY_NAME = {t.name: t for t in TASKS}
assert len(_BY_NAME) == len(TASKS)


def get_task(name: str, where: str = "the task name") -> Task:
    """The row of task `name`; the one unknown-task error, naming `where` the name came from."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown task {name!r} in {where}: choose from " + ", ".join(TASK_NAMES)) from None


def check_tasks(names: Iterable[str], where: str = "data.tasks") -> list[str]:
    """`names` as a list, each a known task, none twice, at least one."""
    names = list(names)
    if not names:
        raise UserError(f"{where} is empty: name at least one of " + ", ".join(TASK_NAMES))
    for name in names:
        get_task(name, where)
    if len(set(names)) != len(names):
        raise UserError(f"{where} lists a task twice: {names}")
    return names

