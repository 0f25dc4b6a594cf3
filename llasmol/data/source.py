"""Where SMolInstruct is and how one split of it opens, without Lightning or a tokenizer.

The part of a `data=` config that training (`SMolInstructDataModule`) and the commands that read one split
(`evaluate`) share: `SMolInstructSource.from_config(data_cfg).split("test")` is all a command needs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional

from llasmol.core.errors import UserError
from llasmol.core.tasks import TASK_NAMES, check_tasks
from llasmol.data.hub import fetch_smolinstruct
from llasmol.data.smolinstruct import SMolInstructSplit, count_samples, raw_path, raw_split

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

    def __post_init__(self) -> None:
        self.splits = dict(self.splits or DEFAULT_SPLITS)
        self.max_samples_per_task = dict(self.max_samples_per_task or {})
        if self.tasks is not None:
            self.tasks = check_tasks(self.tasks)
        self._opened: dict[str, SMolInstructSplit] = {}

    @classmethod
    def from_config(cls, data_cfg: Mapping[str, Any], **overrides: Any) -> "SMolInstructSource":
        """The source a `data=` config describes (a run directory's or the command's); keys that are not
        about the source (batch sizes, max_length, ...) are left to those that use them."""
        # Only the source's own keys are read: the others may interpolate what a command lacks (a model).
        own = {f.name: data_cfg[f.name] for f in fields(cls) if not f.name.startswith("_") and f.name in data_cfg}
        return cls(**{**own, **overrides})

    def root(self) -> str:
        """The local folder of the copy; fetches the Hub archive on first use when `path` is null."""
        if not self.path:
            self.path = str(fetch_smolinstruct(self.hub_id, self.revision))
        return self.path

    def is_bundled(self) -> bool:
        """Whether this is the excerpt bundled with the package (`data=bundled`)."""
        return bool(self.path) and Path(self.path).resolve() == BUNDLED_DATA.resolve()

    def task_names(self) -> list[str]:
        """The tasks read: `tasks`, or every task of the table whose files the copy has (table order)."""
        if self.tasks is None:
            found = [t for t in TASK_NAMES if (Path(self.root()) / "core_tag" / f"{t}.json").is_file()]
            if not found:
                raise UserError(f"{self.root()} holds no SMolInstruct task (no core_tag/<task>.json): "
                                "is data.path the root of a SMolInstruct copy?")
            missing = [t for t in TASK_NAMES if t not in found]
            # Said, so that a copy that lost a task's files does not train on fewer unnoticed. The bundled
            # excerpt lacks 3 tasks by design (its PROVENANCE.md): the report says so once, not every command.
            if missing and not self.is_bundled():
                log.warning("data: %d of %d tasks in %s (none of %s); data.tasks=[...] names them",
                            len(found), len(TASK_NAMES), self.root(), ", ".join(missing))
            self.tasks = found
        return self.tasks

    def split(self, name: str) -> SMolInstructSplit:
        """Split `name` (train, validation or test), opened on first use."""
        if name not in self._opened:
            self._opened[name] = self._open(self._folder(name), self.max_samples_per_task.get(name))
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
        folder = self.splits[name]
        if raw_split(folder) == folder and not self.max_samples_per_task.get(name):
            return self.split(name)
        key = f"{name} (pooled)"  # kept with the splits, so that `close` closes its files too
        if key not in self._opened:
            self._opened[key] = self._open(raw_split(folder), None)
        return self._opened[key]

    def close(self) -> None:
        """Close the raw files of every split opened here (a split read again reopens them)."""
        for split in self._opened.values():
            split.close()

    def _open(self, folder: str, limit: Optional[int]) -> SMolInstructSplit:
        return SMolInstructSplit(
            self.root(), folder, self.task_names(), sample_group=self.sample_group,
            insert_core_tags=self.insert_core_tags, representation=self.representation,
            max_samples_per_task=limit, skip_bad_lines=self.skip_bad_lines,
        )
