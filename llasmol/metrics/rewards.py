"""Verifiable rewards for the RL stage, read from the scorer's own per-sample statistics: never a second copy of it.

A completion is scored as one prediction of its sample (`scoring.sample_stats`, with the run's task table and
its scoring settings: the same answer extraction, parsers and cost bounds as the paper's metrics), and each
reward term is one of those statistics, or the family's own per-sample score:

- format: an answer between the task's tags (the statistic `num_no_answer` is 0);
- validity: a molecule RDKit reads, a formula that parses, a finite number, a yes/no (smiles, formula, number,
  boolean);
- exact: the same molecule, formula or name as a gold (`hit_top1`: the paper's exact match);
- similarity: Morgan Tanimoto of a valid molecule to its closest gold (the paper's FTS);
- label: a yes/no equal to the gold's (what accuracy counts);
- error: 1 / (1 + |answer - gold|) for a valid number, else 0;
- meteor: the caption's METEOR.

Weights are conf/reward/default.yaml's: by family, and per task where a task needs its own.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from llasmol.core.errors import UserError
from llasmol.core.schema import check_config
from llasmol.core.tasks import TaskTable
from llasmol.metrics.scoring import family, sample_stats

# family -> term -> its value in [0, 1] from one completion's statistics and its family's judgement
_Term = Callable[[dict, tuple], float]
_FORMAT: _Term = lambda s, j: 1.0 - s["num_no_answer"]
_ANSWERED_VALID: _Term = lambda s, j: (1.0 - s["num_no_answer"]) * (1.0 - s["num_invalid"])
TERMS: dict[str, dict[str, _Term]] = {
    "smiles": {"format": _FORMAT, "validity": lambda s, j: s["num_valid"], "similarity": lambda s, j: s["fts_morgan_sum"],
               "exact": lambda s, j: s["hit_top1"]},
    "formula": {"format": _FORMAT, "validity": _ANSWERED_VALID, "exact": lambda s, j: s["hit_top1"]},
    "iupac": {"format": _FORMAT, "exact": lambda s, j: s["hit_top1"]},
    "number": {"format": _FORMAT, "validity": lambda s, j: s["num_valid"],
               "error": lambda s, j: 1.0 / (1.0 + j[1]) if s["num_valid"] and j[1] is not None else 0.0},
    "boolean": {"format": _FORMAT, "validity": _ANSWERED_VALID, "label": lambda s, j: s["tp"] + s["tn"]},
    "caption": {"format": _FORMAT, "meteor": lambda s, j: s["meteor_sum"]},
}


def _check_terms(kind: str, weights, where: str, whose: str) -> None:
    for term in dict(weights or {}):
        if term not in TERMS[kind]:
            raise UserError(f"{where}.{term}: {term} is no reward term of the {whose}: its terms are "
                            f"{', '.join(TERMS[kind])}")


class Rewards:
    """The reward of a completion for its task: the weighted sum of its family's terms (`weights`: conf/reward/'s
    `families` and per-task `tasks`, numbers from 0 up as the config check has found them); each family, task and
    term they name is checked here, against the run's task table."""

    def __init__(self, weights: Mapping[str, Any], tasks: TaskTable, trained: Optional[list[str]] = None) -> None:
        self.tasks = tasks
        families, by_task = dict(weights.get("families") or {}), dict(weights.get("tasks") or {})
        for name, own in families.items():
            if name not in TERMS:
                raise UserError(f"reward.families.{name} is no metric family: the families are {', '.join(TERMS)}")
            _check_terms(name, own, f"reward.families.{name}", f"{name} family")
        for name, own in by_task.items():  # a task this run does not train is checked too: a typo is a typo
            kind = tasks.task(name, f"reward.tasks.{name}").family
            _check_terms(kind, own, f"reward.tasks.{name}", f"{kind} family ({name})")
        self.weights: dict[str, dict[str, float]] = {}
        for task in trained if trained is not None else list(tasks):
            kind = tasks.task(task).family
            own = {**dict(families.get(kind) or {}), **dict(by_task.get(task) or {})}
            if not any(own.values()):
                raise UserError(f"every reward weight of task {task} ({kind} family) is 0 or unset: GRPO would learn "
                                f"nothing from it; give one, e.g. reward.families.{kind}.format=0.1")
            self.weights[task] = {term: float(w) for term, w in own.items() if w}

    def terms(self, task: str, completion: str, golds) -> dict[str, float]:
        """Each weighted term's value, in [0, 1], for `completion` (the generated response) of a `task` sample."""
        stats = sample_stats(task, [completion], golds, tasks=self.tasks)
        judged = family(task, self.tasks).judge(stats) if stats["num_no_answer"] == 0 else ("no_answer", None)
        kind = TERMS[self.tasks.task(task).family]
        return {term: float(kind[term](stats, judged)) for term in self.weights[task]}

    def __call__(self, task: str, completion: str, golds) -> tuple[float, dict[str, float]]:
        """The reward of `completion` and each term's value."""
        values = self.terms(task, completion, golds)
        return sum(self.weights[task][term] * value for term, value in values.items()), values


def check_rewards(cfg, tasks: Optional[TaskTable] = None) -> None:
    """objective=grpo: every reward weight of every task a training config trains, checked before anything is built
    (`tasks`: the config's task table, read here when not given)."""
    if cfg.objective.name == "grpo":

        Rewards(cfg.reward, tasks if tasks is not None else check_config(cfg).tasks, cfg.data.get("tasks"))
