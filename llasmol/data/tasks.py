"""The 14 SMolInstruct tasks, named as in the official archive."""

from __future__ import annotations

from typing import Iterable

from llasmol.errors import UserError

TASKS: tuple[str, ...] = (
    "forward_synthesis",
    "retrosynthesis",
    "molecule_captioning",
    "molecule_generation",
    "name_conversion-i2f",
    "name_conversion-i2s",
    "name_conversion-s2f",
    "name_conversion-s2i",
    "property_prediction-esol",
    "property_prediction-lipo",
    "property_prediction-bbbp",
    "property_prediction-clintox",
    "property_prediction-hiv",
    "property_prediction-sider",
)


def check_tasks(tasks: Iterable[str]) -> list[str]:
    """Return `tasks` as a list, or fail on the first name that is not a SMolInstruct task."""
    tasks = list(tasks)
    if not tasks:
        raise UserError("data.tasks is empty: name at least one of " + ", ".join(TASKS))
    for task in tasks:
        if task not in TASKS:
            raise UserError(f"unknown task {task!r} in data.tasks: choose from " + ", ".join(TASKS))
    if len(set(tasks)) != len(tasks):
        raise UserError(f"data.tasks lists a task twice: {tasks}")
    return tasks
