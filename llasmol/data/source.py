"""Where the data is and how one split of it opens, without Lightning or a tokenizer.

The part of a `data=` config that training (`SMolInstructDataModule`) and the commands that read one split
(`evaluate`) share: `SMolInstructSource.from_config(data_cfg).split("test")` is all a command needs.

The data is `path` (SMolInstruct's layout, or a table of your own: `llasmol.data.custom`) and the folders or
files of `also`, read the same way; a split of several is their splits served one after another (each
task from the one source that holds it).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from llasmol.core.errors import UserError
from llasmol.core.files import unreadable
from llasmol.core.schema import checked_tasks
from llasmol.core.tasks import TASK_NAMES, TaskTable
from llasmol.data.hub import check_fetchable, fetch_smolinstruct
from llasmol.data.smolinstruct import SMolInstructSplit, count_samples, raw_path, raw_split
from llasmol.data.custom import MixedSplit, Row, TableSplit, is_table, read_table
from llasmol.data.split import Split

DEFAULT_SPLITS = {"train": "train", "validation": "dev", "test": "test"}
BUNDLED_DATA = Path(__file__).resolve().parent / "bundled"  # conf/data/bundled.yaml's path

log = logging.getLogger(__name__)


@dataclass
class SMolInstructSource:
    """A copy of SMolInstruct in the official layout: `path`, or the archive of `hub_id` at `revision`
    (fetched once into the cache when `path` is null); `splits` maps our split names (train, validation,
    test) to the archive's folders; `tasks` null means every task the copy has."""

    path: Optional[str] = None
    hub_id: str = "osunlp/SMolInstruct"
    revision: str = "main"
    tasks: Optional[list[str]] = None
    splits: dict = field(default_factory=lambda: dict(DEFAULT_SPLITS))
    sample_group: str = "instruction_tuning"
    insert_core_tags: bool = True
    representation: str = "smiles"
    max_samples_per_task: dict = field(default_factory=dict)  # split name -> samples per task at most
    skip_bad_lines: bool = False
    new_tasks: Optional[dict] = None  # the tasks of your own this data holds (`llasmol.core.tasks.TaskTable`)
    also: Optional[list] = None  # more data beside `path`: SMolInstruct copies or tables
    columns: Optional[dict] = None  # a table's column names for input, output, split, task
    split_fractions: Optional[dict] = None  # a table without splits: the inputs to validation and test
    # The run's task table: SMolInstruct's and `new_tasks`' when not handed one (a run read back: its tasks.json).
    table: Optional[TaskTable] = None

    def __post_init__(self) -> None:
        self.splits = dict(self.splits or DEFAULT_SPLITS)
        self.max_samples_per_task = dict(self.max_samples_per_task or {})
        if self.table is None:  # the tasks `new_tasks` declares, unless a command hands the table it holds
            self.table = checked_tasks(self.new_tasks)
        if self.tasks is not None:
            self.tasks = self.table.check(self.tasks)
        self._opened: dict[str, Split] = {}
        self._places: dict[str, Place] = {}  # each place of the data, read once
        self._holders: Optional[dict[str, str]] = None  # task -> the place of the data that holds it
        self.from_hub = not self.path  # `path` null: the Hub's archive, fetched on first use

    @classmethod
    def from_config(cls, data_cfg: Mapping[str, Any], **overrides: Any) -> "SMolInstructSource":
        """The source a `data=` config describes (a run directory's or the command's); keys that are not
        about the source (batch sizes, max_length, ...) are left to those that use them."""
        # Only the source's own keys are read: the others may interpolate what a command lacks (a model).
        own = {f.name: data_cfg[f.name] for f in fields(cls) if not f.name.startswith("_") and f.name in data_cfg}
        return cls(**{**own, **overrides})

    def root(self) -> str:
        """The local folder of the copy (or `path`'s table); fetches the Hub archive on first use when `path` is
        null."""
        if not self.path:
            self.path = str(fetch_smolinstruct(self.hub_id, self.revision))
        return self.path

    def check_reachable(self) -> None:
        """For the Hub's archive (`path` null): the one line its fetch would give, now, if it is neither on this
        machine nor reachable (a run says it before its base loads)."""
        if not self.path:
            check_fetchable(self.hub_id, self.revision)

    def places(self) -> list[str]:
        """Where the data is: `path` (its SMolInstruct copy fetched if null), then each of `also` (a path, or
        {path, columns, split_fractions}: a table read with its own column names)."""
        also = []
        for i, place in enumerate(self.also or []):
            path = place.get("path") if isinstance(place, Mapping) else place
            if not isinstance(path, str) or not path or not Path(path).exists():
                # a link that leads nowhere (a loop, a removed target) is said as such, not as a missing path
                why = unreadable(path) if isinstance(path, str) and path and os.path.islink(path) else "does not exist"
                raise UserError(f"data.also[{i}]={path!r} {why}: give folders (SMolInstruct's layout, or "
                                "train/validation/test tables) or CSV/JSONL files")
            also.append(path)
        return [self.root(), *also]

    def reading(self, path: str) -> tuple[Optional[dict], Optional[dict], str]:
        """How the table at place `path` is read: (its columns, its split fractions, the setting that gave the
        columns). A place of `also` given as a mapping brings its own (each it leaves out is data.path's)."""
        for i, place in enumerate(self.also or []):
            if isinstance(place, Mapping) and place.get("path") == path:
                own = place.get("columns") is not None
                return (dict(place["columns"]) if own else self.columns,
                        dict(place["split_fractions"]) if place.get("split_fractions") is not None
                        else self.split_fractions, f"data.also[{i}].columns" if own else "data.columns")
        return self.columns, self.split_fractions, "data.columns"

    def copy(self) -> Optional["CopyPlace"]:
        """The SMolInstruct copy when the data is one copy alone (what the leakage audit reads: raw files, sample
        lists, split groups), else None (tables of one's own, or several places)."""
        places = self.places()
        place = self._place(places[0])
        return place if len(places) == 1 and isinstance(place, CopyPlace) else None

    def describe(self) -> str:
        """The data in words, place by place, as a model card says it."""
        return ", ".join(self._place(place).describe() for place in self.places())

    def _place(self, path: str) -> "Place":
        """The place at `path`, a copy in SMolInstruct's layout or a table of one's own (the one place that
        tells the two apart), made once."""
        if path not in self._places:
            self._places[path] = (TablePlace if is_table(path) else CopyPlace)(path, self)
        return self._places[path]

    def holders(self) -> dict[str, str]:
        """Each task read -> the place that holds it (`places`), in the order the places and tasks come."""
        if self._holders is None:
            holders: dict[str, str] = {}
            for place in self.places():
                for task in self._place(place).task_names():  # a place without any is refused by its kind
                    if task in holders:
                        raise UserError(f"task {task} is in both {holders[task]} and {place}: one task comes from one "
                                        "place; give your own samples a task name of their own (data.new_tasks)")
                    holders[task] = place
            if self.tasks is not None:
                absent = [t for t in self.tasks if t not in holders]
                if absent:
                    raise UserError(f"data.tasks names {absent[0]}, which none of the data holds "
                                    f"({', '.join(self.places())}): it holds {', '.join(holders) or 'no task'}")
                holders = {t: holders[t] for t in self.tasks}
            self._holders = holders
        return self._holders

    def is_bundled(self) -> bool:
        """Whether this is the excerpt bundled with the package (`data=bundled`)."""
        copy = self.copy() if self.path else None  # no path: the Hub's archive, never the excerpt (nothing fetched)
        return copy is not None and copy.is_bundled()

    def task_names(self) -> list[str]:
        """The tasks read: `tasks`, or every task the data holds (in the order of its places, a copy's in table
        order)."""
        return list(self.holders())

    def split(self, name: str) -> Split:
        """Split `name` (train, validation or test), opened on first use: a `SMolInstructSplit`, or for
        tables or several places a `TableSplit` or `MixedSplit` with the same access."""
        if name not in self._opened:
            self._opened[name] = self._open(self._folder(name), self.max_samples_per_task.get(name), name)
        return self._opened[name]

    def raw_file(self, name: str, task: str) -> Path:
        """The raw JSONL file of `task` behind split `name`, to stream (`smolinstruct.read_raw_records`)."""
        return raw_path(self.root(), self._folder(name), task)

    def sample_count(self, name: str, task: str) -> int:
        """The samples of `task` in split `name`'s sample list, without opening the split."""
        return count_samples(self.root(), self.sample_group, self._folder(name), task)

    def _folder(self, name: str) -> str:
        if name not in self.splits:
            raise UserError(f"unknown split {name!r}: data.splits defines {sorted(self.splits)}")
        return self.splits[name]

    def pooling_split(self, name: str) -> SMolInstructSplit:
        """The samples whose golds pool for split `name`: its own, or for a subset (`test_subset`) its full
        split, as the official scorer reads golds from the whole test split (compute_metrics.py
        `read_result`), whichever samples were generated."""
        folder = self._folder(name)
        if raw_split(folder) == folder and not self.max_samples_per_task.get(name):
            return self.split(name)
        key = f"{name} (pooled)"  # kept with the splits, so that `close` closes its files too
        if key not in self._opened:
            self._opened[key] = self._open(raw_split(folder), None, name)
        return self._opened[key]

    def close(self) -> None:
        """Close the raw files of every split opened here (a split read again reopens them)."""
        for split in self._opened.values():
            split.close()

    def _open(self, folder: str, limit: Optional[int], name: str) -> Split:
        tasks_of = {place: [t for t, holder in self.holders().items() if holder == place] for place in self.places()}
        parts = [self._place(place).open(name, folder, tasks, limit) for place, tasks in tasks_of.items() if tasks]
        return parts[0] if len(parts) == 1 else MixedSplit(parts)


class CopyPlace:
    """A folder in SMolInstruct's layout (core_tag/, raw/, sample lists), whose splits are `SMolInstructSplit`s."""

    def __init__(self, root: str, source: SMolInstructSource) -> None:
        self.root, self.source = root, source

    def task_names(self) -> list[str]:
        """The tasks of the source's table that this copy has files for, in table order; said when SMolInstruct's
        are not all there and `data.tasks` names none."""
        found = [t for t in self.source.table if (Path(self.root) / "core_tag" / f"{t}.json").is_file()]
        if not found:
            raise UserError(f"{self.root} holds no SMolInstruct task (no core_tag/<task>.json): is it the root of a "
                            "SMolInstruct copy, or a CSV/JSONL file (or a folder of train, validation and test files) "
                            "of your own? A task of your own in this layout is declared in data.new_tasks")
        missing = [t for t in TASK_NAMES if t not in found]
        # Said, so that a copy that lost a task's files does not train on fewer unnoticed. The bundled excerpt
        # lacks 3 tasks by design (its PROVENANCE.md): the report says so once, not every command.
        if missing and self.source.tasks is None and not self.is_bundled():
            log.warning("data: %d of %d tasks in %s (none of %s); data.tasks=[...] names them",
                        len(found), len(TASK_NAMES), self.root, ", ".join(missing))
        return found

    def is_bundled(self) -> bool:
        return Path(self.root).resolve() == BUNDLED_DATA.resolve()

    def describe(self) -> str:
        source = self.source
        if self.is_bundled():  # not this machine's path: the card travels
            return "SMolInstruct, the excerpt bundled with llasmol (a few hundred samples a task)"
        if source.from_hub and self.root == source.path:
            return f"SMolInstruct, {source.hub_id} at revision {source.revision}"
        # The folder's name, not this machine's path: a card travels (to the Hub, to colleagues).
        return f"SMolInstruct, a local copy ({Path(self.root).name})"

    def open(self, name: str, folder: str, tasks: list[str], limit: Optional[int]) -> SMolInstructSplit:
        source = self.source
        return SMolInstructSplit(
            self.root, folder, tasks, sample_group=source.sample_group,
            insert_core_tags=source.insert_core_tags, representation=source.representation,
            max_samples_per_task=limit, skip_bad_lines=source.skip_bad_lines, table=source.table,
        )


class TablePlace:
    """Table data of one's own (`llasmol.data.custom`: a CSV/TSV/JSONL file, or a folder of split files), read
    once, whose splits are `TableSplit`s."""

    def __init__(self, path: str, source: SMolInstructSource) -> None:
        self.path, self.source = path, source
        self._rows: Optional[list[Row]] = None

    def rows(self) -> list[Row]:
        source = self.source
        if self._rows is None:
            if source.representation != "smiles":
                raise UserError(f"data.representation={source.representation} reads SMolInstruct's raw_selfies; the "
                                f"table {self.path} is read as written: convert it, or use data.representation=smiles")
            columns, fractions, where = source.reading(self.path)
            self._rows = read_table(self.path, columns, fractions, source.table, where=where)
        return self._rows

    def task_names(self) -> list[str]:
        """The tasks the rows name, in the order they first come."""
        return list(dict.fromkeys(row.task for row in self.rows()))

    def describe(self) -> str:
        return f"{Path(self.path).name}, a table of its own"  # the file's name: a card travels

    def open(self, name: str, folder: str, tasks: list[str], limit: Optional[int]) -> TableSplit:
        if name not in ("train", "validation", "test"):
            raise UserError(f"unknown split {name!r}: a table has train, validation and test")
        return TableSplit(self.rows(), name, tasks, self.source.insert_core_tags, limit, self.source.table)


Place = Union[CopyPlace, TablePlace]  # where data is: each makes the `Split`s of its tasks
