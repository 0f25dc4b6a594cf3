"""Per-sample additive statistics and the metrics made from their sums (LlaSMol, Appendix A.4).

Every metric is a function of *sums* of per-sample statistics, so statistics can be summed across batches
and processes (DDP) and still give exactly the corpus-level metric. What each family computes is in
`llasmol.metrics.families`; which family a task has, in the task table (`llasmol.core.tasks`).

- `STATS[task]`: the names of a SMolInstruct task's statistics, in a fixed order; `stat_names(task, tasks)`
  for any task of a run's table.

Every function that reads a task's row takes the run's task table (`tasks`, `llasmol.core.tasks.TaskTable`;
SMolInstruct's 14 when not given): a declared task is scored by its row in the table it is handed.
- `sample_stats(task, predictions, golds, skipped, answers)`: statistics of one sample; `predictions` are its
  raw generated texts, best first (answers are extracted inside, unless a base model's rule already read
  them: `answers`, `given_answers`); `golds` its gold answers (`GoldPool`); `record_stats(record)` for a record.
- `finalize(task, stats)`: metric values from summed statistics; every task reports ``num_samples``,
  ``num_no_answer`` (top-1 prediction with no extractable answer) and ``num_skipped`` (not generated: the
  prompt was over the token limit; also counted as no answer).
- `per_sample_statistics(records)`: every record's statistics, by task (`TaskSample`), computed once: the
  metrics are their sums (`task_metrics`), the bootstrap intervals (`llasmol.metrics.intervals`) resample them.
- `score_records(records)`: the metrics of a whole file of prediction records, by that one route.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from llasmol.core.tasks import MAX_POOLED_GOLDS, SMOLINSTRUCT, TaskTable, too_many_golds
from llasmol.metrics.answer_rules import RULES
from llasmol.metrics.extract import extract_answer
from llasmol.metrics.families import COMMON_STATS, Family, families

def family(task: str, tasks: TaskTable = SMOLINSTRUCT) -> Family:
    """The family that scores `task`, reading answers as `tasks.scoring` says."""
    return families(tasks.scoring)[tasks.task(task).family]


def stat_names(task: str, tasks: TaskTable = SMOLINSTRUCT) -> tuple[str, ...]:
    """The names of `task`'s additive statistics, in their fixed order."""
    return family(task, tasks).all_stats()


STATS: dict[str, tuple[str, ...]] = {task: stat_names(task) for task in SMOLINSTRUCT}  # SMolInstruct's


def as_list(value) -> list:
    """None -> [], a string -> [it], any other iterable -> a list (golds and predictions come in all three)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def sample_stats(task: str, predictions, golds, skipped: bool = False, answers=None,
                 tasks: TaskTable = SMOLINSTRUCT) -> dict[str, float]:
    """Additive statistics (every name in ``STATS[task]``) of one sample. Model output never raises.

    `answers`: what an extraction rule already read from each prediction (`given_answers`), scored as
    they are; without them each prediction's answer is the text between its tags (`extract_answer`)."""
    fam = family(task, tasks)
    if answers is None:
        answers = [extract_answer(task, p, tasks) for p in as_list(predictions)]
    answers = [None if not isinstance(a, str) or fam.no_answer(a) else a for a in answers]
    golds = [g.strip() for g in as_list(golds) if isinstance(g, str)]
    stats = dict.fromkeys(fam.all_stats(), 0.0)
    stats["num_samples"] = 1.0
    stats["num_skipped"] = 1.0 if skipped else 0.0
    if not answers or answers[0] is None:
        stats["num_no_answer"] = 1.0
    fam.fill(answers, golds, stats)
    return stats


def given_answers(record: dict) -> Optional[list]:
    """The answers a base model's extraction rule read (`record["extraction"]` names the rule set,
    `llasmol.metrics.answer_rules`), which are scored exactly as the rule gave them, as the official
    scorer scores them; None for a record whose answers are read from between its predictions' tags."""
    answers = record.get("answers")
    if record.get("extraction") in RULES and isinstance(answers, list):
        return answers
    return None


def record_answers(record: dict, tasks: TaskTable = SMOLINSTRUCT) -> list[Optional[str]]:
    """What is scored of a record: its rule's answers (`given_answers`), else each prediction's tagged answer."""
    given = given_answers(record)
    return given if given is not None else [extract_answer(record["task"], p, tasks)
                                            for p in as_list(record.get("predictions"))]


def record_stats(record: dict, golds=None, tasks: TaskTable = SMOLINSTRUCT) -> dict[str, float]:
    """`sample_stats` of one prediction record (its own `gold` unless `golds` is given)."""
    return sample_stats(record["task"], record.get("predictions"), record["gold"] if golds is None else golds,
                        is_skipped(record), given_answers(record), tasks)


def is_skipped(record: dict) -> bool:
    """Whether a prediction record was not generated (its prompt was over the limit): said so, or no predictions."""
    return bool(record.get("skipped")) or record.get("predictions") is None


def add_stats(total: dict[str, float], stats: dict[str, float]) -> dict[str, float]:
    """Add `stats` into `total` in place and return it."""
    for key, value in stats.items():
        total[key] = total.get(key, 0.0) + float(value)
    return total


def finalize(task: str, stats: dict[str, float], tasks: TaskTable = SMOLINSTRUCT) -> dict[str, float]:
    """Metric values (floats) of `task` from summed `sample_stats`."""
    fam = family(task, tasks)
    stats = {name: float(stats.get(name, 0.0)) for name in fam.all_stats()}
    return {**{name: stats[name] for name in COMMON_STATS}, **fam.metrics(stats)}


def judge(task: str, predictions, golds, skipped: bool = False, answers=None,
          tasks: TaskTable = SMOLINSTRUCT) -> tuple[str, Optional[float]]:
    """The outcome category of one sample's top-1 answer (`families.CATEGORIES`) and its per-sample score
    where one exists: Morgan similarity to the closest gold (SMILES), absolute error (ESOL/Lipo), METEOR
    (captions). Judged from the sample's own statistics, so the counts agree with the metrics."""
    if skipped:
        return "skipped", None
    stats = sample_stats(task, predictions, golds, answers=answers, tasks=tasks)
    if stats["num_no_answer"]:
        return "no_answer", None
    return family(task, tasks).judge(stats)


# --------------------------------------------------------------------------- gold pooling


def gold_key(record: dict) -> tuple:
    """What makes two samples "the same input": task, core input and (SIDER) target."""
    return (record["task"], record.get("raw_input", record.get("input")), record.get("target"))


class GoldPool:
    """Gold answers pooled by `gold_key` for the tasks whose row says `pooled` (first-seen order, no
    repeats); other tasks keep each sample's own gold. Fed by a split's samples (`add(sample,
    sample["raw_output"])`) or by prediction records (their `gold` field): one rule for both."""

    def __init__(self, tasks: TaskTable = SMOLINSTRUCT) -> None:
        self.tasks = tasks
        # dicts as ordered sets: a pool of thousands of golds is built in linear time
        self._golds: dict[tuple, dict[str, None]] = defaultdict(dict)

    def add(self, record: dict, golds, where: str = "the golds") -> None:
        """Pool `record`'s `golds`; an input past `MAX_POOLED_GOLDS` is refused, named by `where`."""
        task = self.tasks.task(record["task"])
        if task.pooled:
            pool = self._golds[gold_key(record)]
            pool.update(dict.fromkeys(as_list(golds)))
            if len(pool) > MAX_POOLED_GOLDS:
                raise too_many_golds(task, gold_key(record)[1], where)

    def golds(self, record: dict, own) -> list[str]:
        """`record`'s golds: for pooled tasks its own golds first, then the rest of its key's pool (the
        order no metric depends on, but a bounded caption scorer keeps the first references), else `own`."""
        own = as_list(own)
        if self.tasks.task(record["task"]).pooled:
            return list(dict.fromkeys([*own, *self._golds.get(gold_key(record), ())]))
        return own


def record_golds(records: Iterable[dict], tasks: TaskTable = SMOLINSTRUCT) -> list[list[str]]:
    """Each prediction record's golds, in record order, pooled over the records as `GoldPool` says."""
    records = list(records)
    pool = GoldPool(tasks)
    for record in records:
        pool.add(record, record["gold"])
    return [pool.golds(r, r["gold"]) for r in records]


# --------------------------------------------------------------------------- per-sample statistics


@dataclass
class TaskSample:
    """One task's per-sample statistics (rows in `STATS[task]` order) and each row's resampling unit."""

    task: str
    stats: np.ndarray  # (samples, statistics)
    units: np.ndarray  # (samples,) unit index of each row, 0..n_units-1
    tasks: TaskTable = SMOLINSTRUCT  # the table `task` is a task of

    @property
    def n_units(self) -> int:
        return int(self.units.max()) + 1 if len(self.units) else 0

    def metrics(self) -> dict[str, float]:
        """The task's metrics from all rows, the sums added in record order (the order `add_stats` would add
        them in, and so the same floats)."""
        total = functools.reduce(np.add, self.stats, np.zeros(self.stats.shape[1]))
        return finalize(self.task, dict(zip(stat_names(self.task, self.tasks), total.tolist())), self.tasks)


def per_sample_statistics(records: Iterable[dict], tasks: TaskTable = SMOLINSTRUCT) -> dict[str, TaskSample]:
    """The statistics of every record (golds pooled over the records, `record_golds`), grouped by task, with
    their resampling units: the input for tasks whose golds pool (its samples share one gold list), else the
    sample."""
    records = list(records)
    rows: dict[str, list] = defaultdict(list)
    keys: dict[str, list] = defaultdict(list)
    for record, golds in zip(records, record_golds(records, tasks)):
        task = record["task"]
        stats = record_stats(record, golds, tasks)
        rows[task].append([stats[name] for name in stat_names(task, tasks)])
        keys[task].append(gold_key(record) if tasks.task(task).pooled else len(keys[task]))
    out = {}
    for task in rows:
        index: dict = {}
        units = np.array([index.setdefault(k, len(index)) for k in keys[task]], dtype=np.int64)
        out[task] = TaskSample(task, np.asarray(rows[task], dtype=np.float64), units, tasks)
    return out


def task_metrics(samples: dict[str, TaskSample]) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from per-sample statistics."""
    return {task: sample.metrics() for task, sample in samples.items()}


def score_records(records: Iterable[dict], tasks: TaskTable = SMOLINSTRUCT) -> dict[str, dict[str, float]]:
    """Metrics of a whole file: ``{task: {metric: value}}`` for every task in `records`.

    Each record has ``task``, ``input``, ``gold`` (a string or a list of strings) and ``predictions``
    (raw texts, best first, or None when skipped); ``raw_input``, ``target`` and ``skipped`` when present.
    """
    return task_metrics(per_sample_statistics(records, tasks))
