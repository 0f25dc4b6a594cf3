"""Random access to one split of SMolInstruct in the official archive layout, without loading it whole.

Layout (the archive on the Hub, a local copy of it, and our bundled sample all share it):

    raw/<split>/<task>.jsonl                              {"input", "output", ...} per line
    raw_selfies/<split>/<task>.jsonl                      optional, the same in SELFIES
    sample/<group>/<split>/<task>.json                    {"template_name", "samples": [{idx, template_id, target}]}
    sample/<group>/test_subset/<task>.json                v1.2.0+: at most 200 test samples a task, indexing raw/test
    template/<template_name>/<task>.json                  [{"input": "...<INPUT>...", "output": "...<OUTPUT>..."}]
    core_tag/<task>.json                                  {"input": [left, right], "output": [left, right]}

Only small per-sample integer arrays and byte offsets into the raw files stay in memory; each sample's
raw record is read on demand, so a worker process touches only the lines it is given.
"""

from __future__ import annotations

import json
import logging
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import ijson
import numpy as np
from ijson.common import ObjectBuilder

from llasmol.core.errors import UserError
from llasmol.core.files import json_lines, json_problem, read_json, unreadable
from llasmol.core.tasks import SMOLINSTRUCT, Task, TaskTable

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
    raw_identity: tuple[int, int, int, int]  # the raw file as indexed (`_identity`)


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    """Which file, how long, when last written: samples are read at the byte offsets indexed at start-up, so a
    raw file replaced or rewritten since then would hand out other lines (or halves of them)."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def _read_json(path: Path, kind: Optional[type], what: str) -> Any:
    return read_json(path, _REEXTRACT, kind, what)


def _parse_raw_line(line: bytes) -> tuple[Optional[dict], Optional[str]]:
    """A raw line's record, or None and why it is not one: the one rule for a raw line, whether it is
    indexed at start-up (`_line_offsets`), streamed (`read_raw_records`) or read for a batch (`raw_record`)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError too
        return None, json_problem(err)
    why = _not_a_record(record)
    return (None, why) if why else (record, None)


def _not_a_record(record: Any) -> Optional[str]:
    if isinstance(record, dict) and "input" in record and "output" in record:
        return None
    return f"is not a JSON object with input and output (it is {type(record).__name__})"


_FIX_LINE = "fix the line, or set data.skip_bad_lines=true to skip and count such lines"
_REEXTRACT = "re-extract it (is data.path the root of a SMolInstruct copy?)"  # a file of the layout that is broken


def _line_offsets(path: Path) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """Byte offset and length of every non-empty line, and for those that are not a JSON object with
    `input` and `output` (by index among the non-empty lines) where they are in the file and why:
    "line 4 is not valid JSON (Expecting value)".

    Every line is parsed once here (about 3 s per million lines) so that a malformed line stops the run
    at start-up, not when a batch first reads it hours later. Offsets go into compact arrays (12 bytes
    a line), so memory stays flat for raw files of any size.
    """
    offsets, lengths, bad = array("q"), array("i"), {}
    pos = 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                _, why = _parse_raw_line(line)
                if why is not None:
                    bad[len(offsets)] = f"line {number} {why}"
                offsets.append(pos)
                lengths.append(len(line))
            pos += len(line)
    return np.frombuffer(offsets, dtype=np.int64).copy(), np.frombuffer(lengths, dtype=np.int32).copy(), bad


def _read_sample_list(path: Path, task: str, limit: Optional[int]) -> tuple[dict, np.ndarray, np.ndarray, Optional[list]]:
    """(header, idx, template_id, targets or None) of a sample list, `limit` samples at most.

    Read event by event (ijson) straight into integer arrays: `json.load` would hold the file's text and a dict
    per sample (200,000 per task in the full dataset, ~250 bytes each) at once.
    """
    fix = _REEXTRACT
    problem = unreadable(path)
    if problem:
        raise UserError(f"the sample list of task {task}, {path}, {problem}: is data.path the root of a SMolInstruct "
                        "copy?")
    try:
        return _parse_sample_list(path, limit, fix, ijson.parse)
    except ijson.JSONError:
        pass
    try:  # yajl stops at integers past 64 bits, which are JSON: Python's parser reads them (and names them)
        return _parse_sample_list(path, limit, fix, ijson.get_backend("python").parse)
    except ijson.JSONError:
        read_json(path, fix, kind=None)  # names json's own reason and line
        raise UserError(f"{path} is not valid JSON: {fix}") from None


def _parse_sample_list(path: Path, limit: Optional[int], fix: str, parse: Callable):
    header: dict[str, ObjectBuilder] = {}
    idx, template_id = array("q"), array("i")
    targets: Optional[list] = None
    n, has_samples, sample = 0, False, None
    with path.open("rb") as fh:
        for prefix, event, value in parse(fh, use_float=True):
            if not prefix:  # the top level: an object, one of whose keys is "samples"
                if event not in ("start_map", "map_key", "end_map"):
                    raise UserError(f"{path} holds a JSON {event.replace('start_', '')}, not an object with a "
                                    f"\"samples\" list: {fix}")
                has_samples |= event == "map_key" and value == "samples"
            elif prefix == "samples":
                if event not in ("start_array", "end_array"):
                    raise UserError(f"{path}: \"samples\" is no list: {fix}")
            elif prefix.startswith("samples.item"):
                sample = sample or ObjectBuilder()
                sample.event(event, value)
                if prefix == "samples.item" and event not in ("start_map", "start_array", "map_key"):
                    if limit is None or n < limit:
                        targets = _add_sample(sample.value, n, path, idx, template_id, targets)
                    n, sample = n + 1, None
            else:  # another key of the header, kept whole
                header.setdefault(prefix.split(".")[0], ObjectBuilder()).event(event, value)
    if not has_samples:
        raise UserError(f"{path} has no \"samples\" list: re-extract the sample lists")
    header_values = {key: builder.value for key, builder in header.items()}
    return header_values, np.frombuffer(idx, np.int64).copy(), np.frombuffer(template_id, np.int32).copy(), targets


def _add_sample(sample: Any, n: int, path: Path, idx: array, template_id: array, targets: Optional[list]):
    """Sample `n` of a sample list appended to the arrays; the targets (a list once one sample names one)."""
    if not isinstance(sample, dict) or "idx" not in sample or "template_id" not in sample:
        raise UserError(f"sample {n} of {path} lacks idx or template_id: re-extract the sample lists")
    # `true` would be read as line 1, "3" and 1.5 are no line numbers; a negative or too large one is named
    # with the raw file or the templates it misses, by the caller
    for key, bits in (("idx", 63), ("template_id", 31)):
        value = sample[key]
        if isinstance(value, bool) or not isinstance(value, int) or not -2 ** bits <= value < 2 ** bits:
            raise UserError(f"sample {n} of {path}: {key}={json.dumps(value)[:40]} must be a whole number: "
                            "re-extract the sample lists")
    idx.append(sample["idx"])
    template_id.append(sample["template_id"])
    target = sample.get("target")
    if target is not None and targets is None:
        targets = [None] * (len(idx) - 1)  # only multi-target tasks keep a list
    if targets is not None:
        targets.append(target)
    return targets


def raw_split(split: str) -> str:
    """The raw folder a split's sample lists index: a subset's is its full split's (`test_subset` reads
    `raw/test`, as the official loader's `use_test_subset` does: SMolInstruct.py, `real_split`)."""
    return split[: -len("_subset")] if split.endswith("_subset") else split


def raw_path(root: str | os.PathLike, split: str, task: str, raw_dir: str = "raw") -> Path:
    """The raw JSONL file of `task` that split folder `split` indexes; UserError when it is missing."""
    path = Path(root) / raw_dir / raw_split(split) / f"{task}.jsonl"
    problem = unreadable(path)
    if problem:
        raise UserError(f"the raw data file of task {task}, {path}, {problem}: is data.path complete?")
    return path


def read_raw_records(path: Path, on_bad: Optional[Callable[[int, str], None]] = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of every non-empty line of a raw file, one line in memory at a time.

    A line that is not a JSON object with `input` and `output` stops with its file and line, or, with
    `on_bad`, is passed to it (line number, why: "is not valid JSON (...)") and left out (data.skip_bad_lines).
    """
    for number, record in json_lines(path, _FIX_LINE, on_bad):
        why = _not_a_record(record)
        if why is None:
            yield number, record
        elif on_bad is not None:
            on_bad(number, why)
        else:
            raise UserError(f"{path} line {number} {why}: {_FIX_LINE}")


def read_core_tags(root: str | os.PathLike, task: str) -> dict:
    """`core_tag/<task>.json`: the tags around the core input and output, e.g. {"input": ["<SMILES>", "</SMILES>"], ...}."""
    tags = _read_json(Path(root) / "core_tag" / f"{task}.json", dict, f"the core tags of {task}")
    if not all(
            isinstance(tags.get(side), list) and len(tags[side]) == 2
            and all(tag is None or isinstance(tag, str) for tag in tags[side]) for side in ("input", "output")):
        raise UserError(f"core_tag/{task}.json is not {{\"input\": [open, close], \"output\": [open, close]}} "
                        "(tags as strings or null): re-extract the core tags")
    return tags


def count_samples(root: str | os.PathLike, sample_group: str, split: str, task: str) -> int:
    """How many samples the sample list of `task` in split folder `split` holds (read piece by piece)."""
    path = Path(root) / "sample" / sample_group / split / f"{task}.json"
    return len(_read_sample_list(path, task, None)[1])


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
        table: TaskTable = SMOLINSTRUCT,
    ) -> None:
        if representation not in ("smiles", "selfies"):
            raise UserError(f"unknown data.representation {representation!r}: use smiles or selfies")
        self.root = Path(root)
        self.split = split
        self.tasks = list(tasks)
        self.table = table  # the run's tasks: a folder of one's own in this layout holds declared tasks
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
            hint = "; subsets came with SMolInstruct v1.2.0 (data.revision)" if self.split.endswith("_subset") else ""
            raise UserError(
                f"split {self.split!r} not found: {split_dir} does not exist (check data.path and data.splits{hint})"
            )
        header, idx, template_id, targets = _read_sample_list(split_dir / f"{task}.json", task, limit)
        raw_file = raw_path(self.root, self.split, task, self._raw_dir)
        identity = _identity(raw_file.stat())  # before indexing: a change while it is read shows at the first read
        offsets, line_bytes, bad_lines = _line_offsets(raw_file)
        used_bad = np.isin(idx, np.fromiter(bad_lines, dtype=np.int64)) if bad_lines else None
        if used_bad is not None and used_bad.any() and not self.skip_bad_lines:
            where = bad_lines[int(idx[used_bad].min())]
            raise UserError(f"{raw_file} {where}: {_FIX_LINE}")
        if used_bad is not None and used_bad.any():
            # data.skip_bad_lines: drop the samples of malformed raw lines, and say how many.
            keep = ~used_bad
            lines_used = len(np.unique(idx[used_bad]))
            self.skipped[task] = int((~keep).sum())
            idx, template_id = idx[keep], template_id[keep]
            targets = [t for t, k in zip(targets, keep) if k] if targets is not None else None
            log.warning("%s: skipped %d sample(s) on %d malformed line(s)", raw_file, self.skipped[task], lines_used)
        if len(idx) and (idx.max() >= len(offsets) or idx.min() < 0):
            bad = int(idx[(idx >= len(offsets)) | (idx < 0)][0])
            raise UserError(
                f"sample index {bad} in {split_dir / (task + '.json')} is beyond {raw_file} "
                f"({len(offsets)} lines): the sample list and raw file come from different versions"
            )
        idx = idx.astype(np.int32)  # checked above: a line number of the raw file (4 bytes a sample, not 8)
        template_name = header.get("template_name", sample_group)
        templates = _read_json(self.root / "template" / template_name / f"{task}.json", None, f"the templates of {task}")
        template_file = f"template/{template_name}/{task}.json"
        if not isinstance(templates, list) or not templates or not all(
                isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)
                for t in templates):
            raise UserError(f"{template_file} is not a list of {{\"input\": ..., \"output\": ...}} strings: "
                            "re-extract the templates")
        for i, tpl in enumerate(templates):
            if "<INPUT>" not in tpl.get("input", "") or "<OUTPUT>" not in tpl.get("output", ""):
                raise UserError(
                    f"template {i} of {task} in template/{template_name}/{task}.json lacks <INPUT> or <OUTPUT>: "
                    "every query needs <INPUT> and every response <OUTPUT>"
                )
        if len(template_id) and template_id.max() >= len(templates):
            raise UserError(f"template_id {int(template_id.max())} of {task} has no template ({len(templates)} exist)")
        if len(template_id) and template_id.min() < 0:  # Python would read -1 as the last template
            raise UserError(f"template_id {int(template_id.min())} of {task} has no template (ids start at 0)")
        template_id = template_id.astype(np.int16)  # a handful of templates per task
        tags = read_core_tags(self.root, task)
        if self.selfies:
            templates = [{k: v.replace("SMILES", "SELFIES") for k, v in t.items()} for t in templates]
        return _TaskTable(
            task=task,
            raw_path=raw_file,
            line_offsets=offsets,
            line_bytes=line_bytes,
            sample_idx=idx,
            template_id=template_id,
            targets=targets,
            templates=templates,
            input_tags=self._tags(tags["input"]),
            output_tags=self._tags(tags["output"]),
            raw_identity=identity,
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

    def task_row(self, i: int) -> Task:
        """The task-table row of global sample `i`."""
        return self.table.task(self.tasks[self.task_index(i)])

    def length_hints(self) -> np.ndarray:
        """Approximate size of every sample from its raw line's bytes and its templates' characters, without
        reading a single raw record: enough to batch samples of similar length together. Template prose
        packs more characters per token than SMILES, hence its half weight (rank correlation with token
        counts on the bundled sample: 0.91)."""
        hints = []
        for t in self._tables:
            template_chars = np.asarray([len(x["input"]) + len(x["output"]) for x in t.templates], dtype=np.int32)
            hints.append(2 * t.line_bytes[t.sample_idx] + template_chars[t.template_id])
        return np.concatenate(hints) if hints else np.zeros(0, dtype=np.int32)

    def counts(self) -> dict[str, int]:
        return {t.task: len(t.sample_idx) for t in self._tables}

    def _handle(self, k: int):
        # File handles are per process: a DataLoader worker must not share the parent's file position.
        if self._pid != os.getpid():
            self._handles, self._pid = {}, os.getpid()
        if k not in self._handles:
            self._handles[k] = self._tables[k].raw_path.open("rb")
        return self._handles[k]

    def close(self) -> None:
        """Close the raw files this process opened (a later read opens them again)."""
        handles, self._handles = self._handles, {}
        if self._pid == os.getpid():  # a forked worker's copies are its parent's to close
            for fh in handles.values():
                fh.close()

    def raw_record(self, k: int, line: int) -> dict:
        table = self._tables[k]
        fh = self._handle(k)
        if _identity(os.fstat(fh.fileno())) != table.raw_identity:  # one fstat a sample: under a microsecond
            raise UserError(f"{table.raw_path} changed while this run was reading it (it was replaced or rewritten "
                            "after the run indexed its lines): put the file back as it was and continue the run "
                            "(ckpt_path=last), or start a new run on the new file")
        fh.seek(int(table.line_offsets[line]))
        record, why = _parse_raw_line(fh.readline())
        if why is not None:
            raise UserError(f"{table.raw_path} line {line + 1} {why}: the file changed since the run started; "
                            f"{_FIX_LINE}")
        return record

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = self.task_index(i)
        table = self._tables[k]
        j = i - (int(self._ends[k - 1]) if k else 0)
        core_in, core_out, target = self._core(table, j, self.raw_record(k, int(table.sample_idx[j])))
        template = table.templates[int(table.template_id[j])]
        return {
            "task": table.task,
            "input": template["input"].replace("<INPUT>", self._wrap(core_in, table.input_tags)),
            "output": template["output"].replace("<OUTPUT>", self._wrap(core_out, table.output_tags)),
            "raw_input": core_in,
            "raw_output": core_out,
            "target": target,
        }

    def core_samples(self, task: str) -> Iterator[tuple[Any, Any, Optional[str]]]:
        """(core input, core output, target) of every sample of `task`, in the order of their raw lines: a
        whole training split for a method that learns from it, without a template or a seek back per sample."""
        k = self.tasks.index(task)
        table = self._tables[k]
        order = np.argsort(table.sample_idx, kind="stable")
        last, record = -1, None
        for j in order:
            line = int(table.sample_idx[j])
            if line != last:
                record, last = self.raw_record(k, line), line
            yield self._core(table, j, record)

    def _core(self, table, j: int, record: dict) -> tuple[Any, Any, Optional[str]]:
        """(core input, core output, target) of sample `j` of `table`, read from its raw `record`: the one
        place both a templated sample and a core sample come from."""
        core_in, core_out = record["input"], record["output"]
        target = None
        if isinstance(core_out, dict):  # multi-target tasks: the sample list says which target
            target = table.targets[j]
            core_out = core_out[target]
        if self._encode_selfies:
            if table.input_tags[0] == "<SELFIES>":
                core_in = _smiles_to_selfies(core_in)
            if table.output_tags[0] == "<SELFIES>":
                core_out = _smiles_to_selfies(core_out)
        return core_in, core_out, target

    def _wrap(self, text: str, tags: tuple[Optional[str], Optional[str]]) -> str:
        if self.insert_core_tags and tags[0] is not None:
            return f"{tags[0]} {text} {tags[1]}"
        return text

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state
