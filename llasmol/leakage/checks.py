"""A data-leakage audit of a SMolInstruct copy, streamed from its raw files (`python -m llasmol.audit`).

What is checked, after the paper's Section 4.2 (quality control and data splitting):

- `identical_input`: a task's input (compared by structure for SMILES, by words otherwise) in two splits;
  the paper keeps samples with identical inputs together ("either in or outside of the test set").
- `shared_reaction`: one reaction in two splits of FS and RS. Two samples are one reaction when the
  output of one is the input of the other (the product) and the other side's molecules are among this
  one's (RS's reactants among FS's reactants and reagents).
- `shared_molecule`, `shared_name`: one molecule (by structure) or IUPAC name in two splits of two tasks of
  a split group (MC and MG; the four NC tasks): the paper places matched samples together.
- `duplicate`: the same (input, output) twice in one split (the paper removes duplicates).
- Invalid SMILES in inputs and golds (and those past the scorer's bounds), counted with examples.
- Samples per task and split beside the paper's Table 1 (`llasmol.core.tasks`).

Memory: the held-out splits (validation, test) are read first and indexed by key; the training split is
then streamed and only looked up, so the index grows with the held-out splits (about 54,000 samples in the
full dataset, a few hundred bytes each) and not with the training data. Duplicates are found per file by
sorting its 8-byte keys (about 30 bytes per line of the largest raw file while it is sorted). Line numbers
are 1-based lines of the raw files.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import time
from array import array
from collections import defaultdict
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from llasmol.inference.progress import generation_progress
from llasmol.leakage.sample_keys import SMILES, TEXT, Field, keyed_records, kind_of_tag, pair_key
from llasmol.core.errors import UserError
from llasmol.core.threads import usable_cores
from llasmol.core.tasks import REACTION, TASKS
from llasmol.data.smolinstruct import raw_split, read_core_tags, read_raw_records
from llasmol.data.source import SMolInstructSource

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
_RANK = {name: i for i, name in enumerate(SPLITS)}  # the later split of a pair is the held-out side
CHECKS = ("identical_input", "shared_reaction", "shared_molecule", "shared_name", "duplicate")
_SHOWN_CHARS = 160

Side = tuple[str, str]  # (task, split)

# Worker processes key files above this size (about 20,000 records); smaller ones are keyed in-process,
# where starting the workers would cost more than it saves.
_POOL_BYTES = 4 << 20


@dataclass
class _Finding:
    check: str
    a: Side
    b: Side  # the held-out side (the later split); for duplicates the same as `a`
    count: int = 0
    hits: set = dc_field(default_factory=set)  # lines of `b` found leaking (held-out samples, counted once)
    examples: list = dc_field(default_factory=list)  # (line on a, line on b)


class _Audit:
    def __init__(self, source: SMolInstructSource, examples: int, workers: int = 1) -> None:
        self.source, self.examples, self.workers = source, examples, workers
        self.pool: Optional[Executor] = None
        self.findings: dict[tuple, _Finding] = {}
        self.invalid: dict[tuple, dict] = {}
        self.skipped: dict = {"count": 0, "examples": []}
        self.records: dict[Side, int] = {}
        # Held-out index: key -> where it was seen (first line per task and split).
        self.inputs: dict[tuple, dict] = {}
        self.entities: dict[tuple, dict] = {}
        self.by_input: dict[tuple, list] = defaultdict(list)
        self.by_output: dict[tuple, list] = defaultdict(list)

    # -- recording --------------------------------------------------------------------------------
    def match(self, check: str, x: Side, line_x: int, y: Side, line_y: int) -> None:
        (a, la), (b, lb) = sorted(((x, line_x), (y, line_y)), key=lambda s: _RANK[s[0][1]])
        finding = self.findings.setdefault((check, a, b), _Finding(check, a, b))
        finding.hits.add(lb)
        finding.count = len(finding.hits)
        if len(finding.examples) < self.examples and (la, lb) not in finding.examples:
            finding.examples.append((la, lb))

    def problem(self, side: Side, role: str, value: Field, line: int) -> None:
        entry = self.invalid.setdefault((*side, role, value.problem), {"count": 0, "lines": []})
        entry["count"] += 1
        if len(entry["lines"]) < self.examples:
            entry["lines"].append(line)

    # -- one raw file -----------------------------------------------------------------------------
    def scan(self, task: str, split: str, kinds: tuple[str, str]) -> None:
        path = self.source.raw_file(split, task)
        side, indexed, group = (task, split), split != "train", self.source.table.task(task).split_group
        keys, lines = array("Q"), array("I")

        def bad(line: int, why: str) -> None:
            self.skipped["count"] += 1
            if len(self.skipped["examples"]) < self.examples:
                self.skipped["examples"].append({"file": self._rel(path), "line": line, "why": why})

        on_bad = bad if self.source.skip_bad_lines else None
        started = time.perf_counter()
        pool = self._pool() if self.workers > 1 and path.stat().st_size > _POOL_BYTES else None
        for line, inp, out in keyed_records(read_raw_records(path, on_bad), kinds, pool, self.workers):
            for role, value, kind in (("input", inp, kinds[0]), ("gold", out, kinds[1])):
                if value.problem:
                    self.problem(side, role, value, line)
            keys.append(pair_key(inp, out))
            lines.append(line)
            self.check_input(side, line, inp, indexed)
            if group == REACTION:
                self.check_reaction(group, side, line, inp, out, indexed)
            elif group:
                for value, kind in ((inp, kinds[0]), (out, kinds[1])):
                    if kind != TEXT:
                        self.check_entity((group, kind, value.key), side, line, indexed)
        self.records[side] = len(lines)
        self.duplicates(side, keys, lines)
        seconds = time.perf_counter() - started
        # Progress for the files one waits for (the full training split takes minutes per task).
        log.log(logging.INFO if seconds > 5 else logging.DEBUG, "audit: %s: %d records in %.1f s",
                self._rel(path), len(lines), seconds)

    def check_input(self, side: Side, line: int, inp: Field, indexed: bool) -> None:
        key = (side[0], inp.key)
        for split, first in self.inputs.get(key, {}).items():
            if split != side[1]:
                self.match("identical_input", (side[0], split), first, side, line)
        if indexed:
            self.inputs.setdefault(key, {}).setdefault(side[1], line)

    def check_entity(self, key: tuple, side: Side, line: int, indexed: bool) -> None:
        check = "shared_molecule" if key[1] == SMILES else "shared_name"
        for other, first in self.entities.get(key, {}).items():
            if other[0] != side[0] and other[1] != side[1]:
                self.match(check, other, first, side, line)
        if indexed:
            self.entities.setdefault(key, {}).setdefault(side, line)

    def check_reaction(self, group: str, side: Side, line: int, inp: Field, out: Field, indexed: bool) -> None:
        if inp.parts is None or out.parts is None:
            return  # no structure to compare: an invalid SMILES is counted, not matched
        # Another sample whose input is this output (FS's product is RS's input) and whose output's
        # molecules are among this input's (RS's reactants among FS's reactants and reagents), or the reverse.
        candidates = [(o, o[3] <= inp.parts) for o in self.by_input.get((group, out.key), ())]
        candidates += [(o, out.parts <= o[3]) for o in self.by_output.get((group, inp.key), ())]
        for (task, split, first, _), same in candidates:
            if same and task != side[0] and split != side[1]:
                self.match("shared_reaction", (task, split), first, side, line)
        if indexed:
            self.by_input[(group, inp.key)].append((*side, line, out.parts))
            self.by_output[(group, out.key)].append((*side, line, inp.parts))

    def duplicates(self, side: Side, keys: array, lines: array) -> None:
        """Lines whose (input, output) key an earlier line of the same file has: sort the file's keys."""
        if len(keys) < 2:
            return
        values = np.frombuffer(keys, dtype=np.uint64)
        order = np.argsort(values, kind="stable")  # equal keys keep file order: the first is the original
        ordered = values[order]
        repeats = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1
        if not len(repeats):
            return
        finding = self.findings.setdefault(("duplicate", side, side), _Finding("duplicate", side, side))
        finding.count = len(repeats)
        for j in repeats[: self.examples]:
            first = int(np.searchsorted(ordered, ordered[j]))
            finding.examples.append((lines[int(order[first])], lines[int(order[j])]))

    def _pool(self) -> Executor:
        if self.pool is None:  # started once, for the first large file; "spawn": no state is inherited
            self.pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        return self.pool

    def _rel(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.source.root()))
        except ValueError:
            return str(path)

    # -- examples ---------------------------------------------------------------------------------
    def read_lines(self, wanted: dict[Side, set]) -> dict[tuple, dict]:
        """The raw text of the example lines, one pass over each file that has any."""
        found: dict[tuple, dict] = {}
        for (task, split), numbers in wanted.items():
            path = self.source.raw_file(split, task)
            left = set(numbers)
            for line, record in read_raw_records(path, lambda *_: None):
                if line in left:
                    found[(task, split, line)] = {
                        "file": self._rel(path), "line": line,
                        "input": _shorten(record.get("input")), "output": _shorten(record.get("output")),
                    }
                    left.discard(line)
                    if not left:
                        break
        return found


def _shorten(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def _split_names(source: SMolInstructSource) -> list[str]:
    """Our split names the copy defines, checked to read different raw folders."""
    names = [name for name in SPLITS if name in source.splits]
    folders = [raw_split(source.splits[name]) for name in names]
    for name, folder in zip(names, folders):
        if folders.count(folder) > 1:
            raise UserError(f"data.splits maps {name} and another split to raw/{folder}: an audit compares "
                            "different splits; give each its own folder")
    return names


def audit(source: SMolInstructSource, held_out: Iterable[str] = ("validation", "test"), examples: int = 3,
          fail_on_duplicates: bool = True, workers: Optional[int] = 1) -> dict:
    """Audit the copy `source` describes; the result is what `audit.json` holds (see the module docstring).

    A cross-split finding fails the audit when one of its splits is in `held_out`; duplicates fail it when
    `fail_on_duplicates`. `summary.passed` says whether it passed. `workers` processes compute the
    molecules' keys of large files (None: one per available CPU, at most 8); 1 keeps everything in this process.
    """
    # Each worker holds its own RDKit and key cache (about 120 MB): the default stops at 8.
    workers = min(usable_cores(), 8) if workers is None else int(workers)
    if workers < 1:
        raise UserError(f"workers={workers}: give at least 1 (or null for one per CPU)")
    held_out = list(held_out)
    for name in held_out:
        if name not in SPLITS:
            raise UserError(f"held_out lists {name!r}: choose among {', '.join(SPLITS)}")
    root = Path(source.root())
    if not root.is_dir():
        raise UserError(f"data.path={root} is not a folder: point it at the root of a SMolInstruct copy")
    started = time.perf_counter()
    tasks, names = source.task_names(), _split_names(source)
    kinds = {}
    for task in tasks:
        tags = read_core_tags(root, task)
        kinds[task] = (kind_of_tag(tags["input"][0]), kind_of_tag(tags["output"][0]))
    run = _Audit(source, examples, workers)
    try:
        # Held-out splits first: they build the index; the training split, last, is only looked up. A bar on a
        # terminal, by the MiB read (the training files, last, are most of them: a count of files would promise
        # too soon an end); off one, the line of each file that took more than 5 s (`_Audit.scan`).
        order = [(split, task) for split in sorted(names, key=lambda n: (n == "train", _RANK[n])) for task in tasks]
        sizes = [max(1, math.ceil(path.stat().st_size / 2**20)) if (path := source.raw_file(split, task)).is_file()
                 else 1 for split, task in order]  # a missing file is said by its scan
        with generation_progress("Auditing", sum(sizes), unit="MiB") as advance:
            for (split, task), size in zip(order, sizes):
                run.scan(task, split, kinds[task])
                advance(size)
    finally:
        if run.pool is not None:
            run.pool.shutdown(cancel_futures=True)
    return _result(run, root, tasks, names, held_out, fail_on_duplicates, time.perf_counter() - started)


def _result(run: _Audit, root: Path, tasks: list[str], names: list[str], held_out: list[str],
            fail_on_duplicates: bool, seconds: float) -> dict:
    wanted: dict[Side, set] = defaultdict(set)
    for f in run.findings.values():
        for la, lb in f.examples:
            wanted[f.a].add(la)
            wanted[f.b].add(lb)
    for (task, split, _, _), entry in run.invalid.items():
        wanted[(task, split)].update(entry["lines"])
    text = run.read_lines(wanted)

    def fails(f: _Finding) -> bool:
        if f.check == "duplicate":
            return fail_on_duplicates
        return f.a[1] in held_out or f.b[1] in held_out

    order = {c: i for i, c in enumerate(CHECKS)}
    findings = [
        {
            "check": f.check, "between": [{"task": f.a[0], "split": f.a[1]}, {"task": f.b[0], "split": f.b[1]}],
            "count": f.count, "fails": fails(f),
            "examples": [[text.get((*f.a, la)), text.get((*f.b, lb))] for la, lb in f.examples],
        }
        for f in sorted(run.findings.values(), key=lambda f: (order[f.check], f.a, f.b))
    ]
    invalid = [
        {"task": task, "split": split, "field": role, "problem": problem, "count": entry["count"],
         "examples": [text.get((task, split, line)) for line in entry["lines"]]}
        for (task, split, role, problem), entry in sorted(run.invalid.items())
    ]
    # Every task of Table 1, those the copy lacks (or data.tasks leaves out) with no counts of ours.
    counts = [
        {"task": t.name, "split": split, "audited": t.name in tasks, "records": run.records.get((t.name, split)),
         "samples": run.source.sample_count(split, t.name) if t.name in tasks else None,
         "paper": t.paper_counts[_RANK[split]]}
        for t in TASKS for split in names
    ]
    failing = [f for f in findings if f["fails"]]
    return {
        "data": str(root),
        "bundled": run.source.is_bundled(),  # the package's excerpt: its counts are an excerpt's by design
        "splits": {name: run.source.splits[name] for name in names},
        "tasks": tasks,
        "held_out": held_out,
        "findings": findings,
        "invalid_smiles": invalid,
        "skipped_lines": run.skipped,
        "counts": counts,
        "summary": {
            "records": sum(run.records.values()),
            "leaked_samples": sum(f["count"] for f in failing if f["check"] != "duplicate"),
            "duplicates": sum(f["count"] for f in findings if f["check"] == "duplicate"),
            "invalid_smiles": sum(e["count"] for e in invalid),
            "failing_findings": len(failing),
            "passed": not failing,
            "seconds": round(seconds, 1),
            "workers": run.workers,
        },
    }
