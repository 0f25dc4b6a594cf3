"""What one split of the data is to everything that reads it: the one interface the data's kinds implement.

A split is the samples of its tasks, task after task (indices 0..len-1), each a dict with ``task``, ``input``
(the query), ``output`` (the response), ``raw_input``, ``raw_output`` and ``target`` (SIDER's side effect, else
None). Three kinds implement it, siblings with no kind asked about by their readers:
`llasmol.data.smolinstruct.SMolInstructSplit` (a copy in SMolInstruct's layout), `llasmol.data.custom.TableSplit`
(a table of one's own) and `llasmol.data.custom.MixedSplit` (several places served as one). The training loader,
the sampler, the evaluation pipeline and the baselines read splits through this interface alone.
"""

from __future__ import annotations

from typing import Iterator, Optional, Protocol, runtime_checkable

import numpy as np

from llasmol.core.tasks import Task, TaskTable


@runtime_checkable
class Split(Protocol):
    tasks: list[str]  # the tasks it holds, in the order their samples come
    table: TaskTable  # the run's task table, whose rows its tasks are
    skipped: dict[str, int]  # lines left out by task (data.skip_bad_lines), said by the loader

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> dict:
        """Sample `i` (see the module's docstring); IndexError outside 0..len-1."""

    def task_index(self, i: int) -> int:
        """The position in `tasks` of sample `i`'s task."""

    def task_row(self, i: int) -> Task:
        """The task table's row of sample `i`'s task."""

    def counts(self) -> dict[str, int]:
        """Samples per task, in `tasks` order (their index ranges follow one another)."""

    def length_hints(self) -> np.ndarray:
        """A cheap length per sample (characters), for grouping samples of like length into batches."""

    def core_samples(self, task: str) -> Iterator[tuple[str, str, Optional[str]]]:
        """(core input, core answer, target) of each sample of `task`: what a non-LLM baseline learns from."""

    def close(self) -> None:
        """Release open files (a split read again reopens them)."""
