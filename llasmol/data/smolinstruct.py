"""Random access to one split of SMolInstruct in the official archive layout, without loading it whole.

Layout (the archive on the Hub, a local copy of it, and our bundled sample all share it):

    raw/<split>/<task>.jsonl                              {"input", "output", ...} per line
    raw_selfies/<split>/<task>.jsonl                      optional, the same in SELFIES
    sample/<group>/<split>/<task>.json                    {"template_name", "samples": [{idx, template_id, target}]}
    template/<template_name>/<task>.json                  [{"input": "...<INPUT>...", "output": "...<OUTPUT>..."}]
    core_tag/<task>.json                                  {"input": [left, right], "output": [left, right]}

Only small per-sample integer arrays and byte offsets into the raw files stay in memory; each sample's
raw record is read on demand, so a worker process touches only the lines it is given.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from llasmol.errors import UserError

log = logging.getLogger(__name__)


@dataclass
class _TaskTable:
    task: str
    raw_path: Path
    line_offsets: np.ndarray  # byte offset of every raw line
    line_bytes: np.ndarray  # byte length of every raw line (a free proxy for the sample's length)
    sample_idx: np.ndarray  # raw line of each sample
    template_id: np.ndarray
    targets: Optional[list]  # for multi-target raw outputs (SIDER): which key each sample answers
    templates: list[dict]
    input_tags: tuple[Optional[str], Optional[str]]
    output_tags: tuple[Optional[str], Optional[str]]


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise UserError(f"missing {what} file {path}: is data.path the root of a SMolInstruct copy?")
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}): fix or re-extract it") from None


def _line_offsets(path: Path, check_json: bool = False) -> tuple[np.ndarray, np.ndarray, set[int]]:
    """Byte offset and length of every non-empty line; with `check_json`, also which lines do not parse."""
    offsets, lengths, bad = [], [], set()
    pos = 0
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                if check_json:
                    try:
                        json.loads(line)
                    except ValueError:
                        bad.add(len(offsets))
                offsets.append(pos)
                lengths.append(len(line))
            pos += len(line)
    return np.asarray(offsets, dtype=np.int64), np.asarray(lengths, dtype=np.int32), bad


def _smiles_to_selfies(smiles: str) -> str:
    import selfies

    return selfies.encoder(smiles)


class SMolInstructSplit:
    """One split (e.g. `train`) of the chosen tasks, indexed 0..len-1 task after task."""

    def __init__(
        self,
        root: str | os.PathLike,
        split: str,
        tasks: list[str],
        sample_group: str = "instruction_tuning",
        insert_core_tags: bool = True,
        representation: str = "smiles",
        max_samples_per_task: Optional[int] = None,
        skip_bad_lines: bool = False,
    ) -> None:
        if representation not in ("smiles", "selfies"):
            raise UserError(f"unknown data.representation {representation!r}: use smiles or selfies")
        self.root = Path(root)
        self.split = split
        self.tasks = list(tasks)
        self.insert_core_tags = insert_core_tags
        self.selfies = representation == "selfies"
        # SELFIES comes from the archive's raw_selfies/ when present, else is encoded on the fly.
        self._raw_dir = "raw_selfies" if self.selfies and (self.root / "raw_selfies").is_dir() else "raw"
        self._encode_selfies = self.selfies and self._raw_dir == "raw"
        self.skip_bad_lines = skip_bad_lines
        self.skipped: dict[str, int] = {}
        self._tables = [self._load_task(t, sample_group, max_samples_per_task) for t in self.tasks]
        self._ends = np.cumsum([len(t.sample_idx) for t in self._tables])
        self._handles: dict[int, Any] = {}
        self._pid = os.getpid()

    # -- loading -------------------------------------------------------------------------------
    def _load_task(self, task: str, sample_group: str, limit: Optional[int]) -> _TaskTable:
        split_dir = self.root / "sample" / sample_group / self.split
        if not split_dir.is_dir():
            raise UserError(
                f"split {self.split!r} not found: {split_dir} does not exist (check data.path and data.splits)"
            )
        record = _read_json(split_dir / f"{task}.json", f"sample list for task {task}")
        samples = record["samples"][:limit] if limit else record["samples"]
        raw_path = self.root / self._raw_dir / self.split / f"{task}.jsonl"
        if not raw_path.is_file():
            raise UserError(f"missing raw data file {raw_path} for task {task}: is data.path complete?")
        offsets, line_bytes, bad_lines = _line_offsets(raw_path, check_json=self.skip_bad_lines)
        if bad_lines:
            # data.skip_bad_lines: drop the samples of malformed raw lines, and say how many.
            kept = [s for s in samples if s["idx"] not in bad_lines]
            self.skipped[task], samples = len(samples) - len(kept), kept
            log.warning("%s: skipped %d sample(s) on %d malformed line(s)", raw_path, self.skipped[task], len(bad_lines))
        idx = np.fromiter((s["idx"] for s in samples), dtype=np.int64, count=len(samples))
        if len(idx) and (idx.max() >= len(offsets) or idx.min() < 0):
            bad = int(idx[(idx >= len(offsets)) | (idx < 0)][0])
            raise UserError(
                f"sample index {bad} in {split_dir / (task + '.json')} is beyond {raw_path} "
                f"({len(offsets)} lines): the sample list and raw file come from different versions"
            )
        template_name = record.get("template_name", sample_group)
        templates = _read_json(self.root / "template" / template_name / f"{task}.json", f"templates of {task}")
        for i, tpl in enumerate(templates):
            if "<INPUT>" not in tpl.get("input", "") or "<OUTPUT>" not in tpl.get("output", ""):
                raise UserError(
                    f"template {i} of {task} in template/{template_name}/{task}.json lacks <INPUT> or <OUTPUT>: "
                    "every query needs <INPUT> and every response <OUTPUT>"
                )
        template_id = np.fromiter((s["template_id"] for s in samples), dtype=np.int32, count=len(samples))
        if len(template_id) and template_id.max() >= len(templates):
            raise UserError(f"template_id {int(template_id.max())} of {task} has no template ({len(templates)} exist)")
        targets = [s.get("target") for s in samples]
        tags = _read_json(self.root / "core_tag" / f"{task}.json", f"core tags of {task}")
        if self.selfies:
            templates = [{k: v.replace("SMILES", "SELFIES") for k, v in t.items()} for t in templates]
        return _TaskTable(
            task=task,
            raw_path=raw_path,
            line_offsets=offsets,
            line_bytes=line_bytes,
            sample_idx=idx,
            template_id=template_id,
            targets=targets if any(t is not None for t in targets) else None,
            templates=templates,
            input_tags=self._tags(tags["input"]),
            output_tags=self._tags(tags["output"]),
        )

    def _tags(self, pair: list) -> tuple[Optional[str], Optional[str]]:
        left, right = pair
        if self.selfies and left == "<SMILES>":
            return "<SELFIES>", "</SELFIES>"
        return left, right

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def task_index(self, i: int) -> int:
        """Index into `self.tasks` of global sample `i`."""
        return int(np.searchsorted(self._ends, i, side="right"))

    def length_hints(self) -> np.ndarray:
        """Approximate size of every sample from its raw line's bytes and its templates' characters, without
        reading a single raw record: enough to batch samples of similar length together. Template prose
        packs more characters per token than SMILES, hence its half weight (rank correlation with token
        counts on the bundled sample: 0.91)."""
        hints = []
        for t in self._tables:
            template_chars = np.asarray([len(x["input"]) + len(x["output"]) for x in t.templates], dtype=np.int64)
            hints.append(2 * t.line_bytes[t.sample_idx].astype(np.int64) + template_chars[t.template_id])
        return np.concatenate(hints) if hints else np.zeros(0, dtype=np.int64)

    def counts(self) -> dict[str, int]:
        return {t.task: len(t.sample_idx) for t in self._tables}

    def _handle(self, k: int):
        # File handles are per process: a DataLoader worker must not share the parent's file position.
        if self._pid != os.getpid():
            self._handles, self._pid = {}, os.getpid()
        if k not in self._handles:
            self._handles[k] = self._tables[k].raw_path.open("rb")
        return self._handles[k]

    def raw_record(self, k: int, line: int) -> dict:
        table = self._tables[k]
        fh = self._handle(k)
        fh.seek(int(table.line_offsets[line]))
        text = fh.readline()
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise UserError(
                f"{table.raw_path} line {line + 1} is not valid JSON ({err.msg}): fix the line, or set "
                "data.skip_bad_lines=true to skip and count such lines"
            ) from None

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = self.task_index(i)
        table = self._tables[k]
        j = i - (int(self._ends[k - 1]) if k else 0)
        record = self.raw_record(k, int(table.sample_idx[j]))
        core_in, core_out = record["input"], record["output"]
        if isinstance(core_out, dict):  # multi-target tasks: the sample list says which target
            core_out = core_out[table.targets[j]]
        if self._encode_selfies:
            if table.input_tags[0] == "<SELFIES>":
                core_in = _smiles_to_selfies(core_in)
            if table.output_tags[0] == "<SELFIES>":
                core_out = _smiles_to_selfies(core_out)
        template = table.templates[int(table.template_id[j])]
        return {
            "task": table.task,
            "input": template["input"].replace("<INPUT>", self._wrap(core_in, table.input_tags)),
            "output": template["output"].replace("<OUTPUT>", self._wrap(core_out, table.output_tags)),
            "raw_input": core_in,
            "raw_output": core_out,
        }

    def _wrap(self, text: str, tags: tuple[Optional[str], Optional[str]]) -> str:
        if self.insert_core_tags and tags[0] is not None:
            return f"{tags[0]} {text} {tags[1]}"
        return text

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state
