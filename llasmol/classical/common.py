"""What every baseline method is: which tasks it answers, what it learns from the train split, its answers.

A method answers with *core* answers (a SMILES, a formula, ``Yes``...), best first; the runner
(`llasmol.classical.runner`) wraps them in the task's answer tags, as a model's response carries them, so the
one extraction and the one scorer read a baseline exactly as they read a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from llasmol.core.tasks import SMOLINSTRUCT, TASKS, Task, TaskTable


@dataclass
class Examples:
    """The core inputs, answers and targets (SIDER's side effect; None elsewhere) of one task's samples."""

    inputs: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    targets: list[Optional[str]] = field(default_factory=list)

    def add(self, core_input: str, answer: str, target: Optional[str]) -> None:
        self.inputs.append(core_input)
        self.answers.append(answer)
        self.targets.append(target)

    def __len__(self) -> int:
        return len(self.inputs)

    def groups(self) -> dict[Optional[str], list[int]]:
        """Sample positions by target, first-seen order: one model or index per side effect."""
        out: dict[Optional[str], list[int]] = {}
        for i, target in enumerate(self.targets):
            out.setdefault(target, []).append(i)
        return out


class Baseline:
    """A non-LLM method. Subclasses set `name`, say which tasks they answer (`why_not`), and answer."""

    name: str = ""
    needs_training: bool = False
    # Config blocks besides the method's own that its settings take (e.g. "morgan", the shared fingerprint).
    shared_settings: tuple[str, ...] = ()

    def __init__(self, settings: Optional[Mapping[str, Any]] = None, seed: int = 0, n_jobs: int = 1,
                 tasks: TaskTable = SMOLINSTRUCT) -> None:
        self.settings = dict(settings or {})
        self.seed = seed
        self.n_jobs = max(1, int(n_jobs))
        self.tasks = tasks  # the run's task table: the rows of the tasks it is asked to answer

    def why_not(self, task: Task) -> Optional[str]:
        """Why this method cannot answer `task` (one phrase), or None when it can."""
        raise NotImplementedError

    def answerable(self) -> list[str]:
        """The names of the tasks this method answers, in table order."""
        return [t.name for t in TASKS if self.why_not(t) is None]

    def fit(self, task: str, train: Examples) -> None:
        """Learn `task` from its training samples (methods with `needs_training`)."""

    def forget(self, task: str) -> None:
        """Drop what was learnt for `task` (it has answered): memory holds one task's model at a time."""

    def predict(self, task: str, test: Examples, k: int) -> list[list[str]]:
        """Up to `k` core answers per sample of `test` (its `answers` are empty), best first; [] for none."""
        raise NotImplementedError
