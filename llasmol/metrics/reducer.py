"""`ChemistryMetrics`: the additive statistics of `llasmol.metrics.scoring` as torchmetrics states, the
reducer of a validation under DDP (every other score goes through `scoring.per_sample_statistics`).

Every state is a float64 scalar with ``dist_reduce_fx="sum"``, one per (task, statistic), so
under DDP each rank updates with its own samples, torchmetrics' sync sums the states, and
`compute` gives the same numbers as one process scoring everything.  (float64 keeps counts
exact well past 2**24 samples; run it on CPU or CUDA, not MPS, which has no float64.)
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torchmetrics import Metric

from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.metrics.scoring import finalize, record_stats, stat_names


def state_name(task: str, stat: str) -> str:
    """The attribute name of one state: ``<task with '-' as '_'>__<stat>``."""
    return f"{task.replace('-', '_')}__{stat}"


class ChemistryMetrics(Metric):
    """Sums per-sample statistics of the given tasks; `compute` returns ``{task: {metric: value}}``."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = None

    def __init__(self, tasks: list[str], table: TaskTable = SMOLINSTRUCT, **kwargs) -> None:
        super().__init__(**kwargs)
        tasks = table.check(tasks, "ChemistryMetrics(tasks)")
        self.tasks, self.table = tasks, table
        self.stat_names = {task: stat_names(task, table) for task in tasks}
        for task in tasks:
            for stat in self.stat_names[task]:
                self.add_state(
                    state_name(task, stat),
                    default=torch.tensor(0.0, dtype=torch.float64),
                    dist_reduce_fx="sum",
                )

    def update(self, tasks: list[str], stats: list[dict[str, float]]) -> None:
        """Add the per-sample `stats` (from `sample_stats`) of samples of the given `tasks`."""
        if len(tasks) != len(stats):
            raise ValueError(f"{len(tasks)} tasks but {len(stats)} stats")
        sums: dict[str, float] = defaultdict(float)
        for task, sample in zip(tasks, stats):
            if task not in self.tasks:
                raise ValueError(f"task {task!r} is not one of this metric's tasks {self.tasks}")
            allowed = self.stat_names[task]
            for stat, value in sample.items():
                if stat not in allowed:
                    raise ValueError(f"{stat!r} is not a statistic of {task!r}: {allowed}")
                sums[state_name(task, stat)] += float(value)
        for name, value in sums.items():
            state = getattr(self, name)
            setattr(self, name, state + torch.tensor(value, dtype=torch.float64, device=state.device))

    def summed_stats(self) -> dict[str, dict[str, float]]:
        """The current (local, unsynced) sums: ``{task: {stat: value}}``."""
        return {task: {stat: float(getattr(self, state_name(task, stat))) for stat in self.stat_names[task]}
                for task in self.tasks}

    def compute(self) -> dict[str, dict[str, float]]:
        """Metrics of every task that saw at least one sample (states already synced)."""
        results = {}
        for task, stats in self.summed_stats().items():
            if stats["num_samples"] > 0:
                results[task] = finalize(task, stats, self.table)
        return results


def reduced_metrics(records: list[dict], tasks: list[str], device,
                    table: TaskTable = SMOLINSTRUCT) -> dict[str, dict[str, float]]:
    """The metrics of every rank's `records` together, summed across ranks (every rank must call it); each
    record's `gold` is taken as it is (already pooled over the split); `table`: the run's tasks."""
    metric = ChemistryMetrics(tasks, table).to(device)
    for record in records:
        stats = record_stats(record, tasks=table)
        metric.update([record["task"]], [stats])
    return metric.compute()
