"""Your own data as a table: a CSV, TSV or JSONL file of `input`/`output` rows, or a folder of one per split.

    assay.csv                      input,output[,split][,task]     one file; `split` says where each row goes
    assay/train.csv, assay/validation.csv, assay/test.csv           (or .tsv/.jsonl; `dev`/`valid` name validation)

Each row is one sample of a task: the `task` column names it; without one, the file holds the declared task
it is named for (`logp.csv`, `logp/train.csv`: task logp), or the one task `data.new_tasks` declares. The task's declaration says how a row becomes a sample (`llasmol.core.tasks`):
`query` wraps the input (`<INPUT>`, tagged as `input_kind` says), or the input is the whole query; `response`
wraps the answer in the task's answer tag (`<OUTPUT>`; by default the tagged answer alone), so that the
answer is read back and scored as SMolInstruct's are. `data.columns` maps other column names (`smiles`,
`label`) to these roles. Without a split column or files, rows are split by their input: the hash of its
canonical SMILES (of the text, for other inputs) puts every row of one molecule in one split
(`data.split_fractions`), as the paper keeps a molecule in one split.

A table is read whole at start (a million short rows take some 300 MB) and every row is checked then: a
yes/no answer must read as one (yes/no, true/false, 1/0), a number must be one, nothing may be empty; the
first bad row stops the command with its file and line. Text is read as text: nothing in a file runs.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional

import numpy as np

from llasmol.core.errors import UserError
from llasmol.core.smiles import MAX_SMILES_CHARS
from llasmol.core.files import json_lines, unreadable
from llasmol.core.schema import TABLE_COLUMNS
from llasmol.core.tasks import MAX_POOLED_GOLDS, SMOLINSTRUCT, Task, TaskTable, tag_pair, too_many_golds

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")
SPLIT_NAMES = {"train": "train", "validation": "validation", "valid": "validation", "val": "validation",
               "dev": "validation", "test": "test"}
_YES_NO = {"yes": "Yes", "no": "No", "true": "Yes", "false": "No", "1": "Yes", "0": "No", "y": "Yes", "n": "No",
           "1.0": "Yes", "0.0": "No"}
MAX_FIELD_CHARS = 1 << 20  # one cell of a megabyte is no molecule or answer: a broken quote, read as data


def is_table(path: str | Path) -> bool:
    """Whether `path` is table data: a CSV/TSV/JSONL file, or a folder of them named for splits (and no
    SMolInstruct layout, which has core_tag/)."""
    path = Path(path)
    if path.suffix.lower() in TABLE_SUFFIXES:
        return True
    return path.is_dir() and not (path / "core_tag").is_dir() and bool(_split_files(path))


def _split_files(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for file in sorted(folder.iterdir()):
        split = SPLIT_NAMES.get(file.stem.lower())
        if split and file.suffix.lower() in TABLE_SUFFIXES and file.is_file():
            if split in found:
                raise UserError(f"{folder} holds two files of the {split} split ({found[split].name} and {file.name}): "
                                "keep one")
            found[split] = file
    return found


@dataclass(frozen=True)
class Row:
    task: str
    split: str
    input: str
    output: str
    number: int  # its line in the file (1 = the first data row after a CSV header: line 2)


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, {column: text}) of every row of a CSV/TSV/JSONL file."""
    problem = unreadable(path)
    if problem:
        raise UserError(f"the data file {path} {problem}: check data.path")
    suffix = path.suffix.lower()
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            if suffix == ".jsonl":
                for number, record in json_lines(path, "fix the line", object_pairs_hook=_no_twice):
                    if not isinstance(record, dict):
                        raise UserError(f"{path} line {number} is a JSON {type(record).__name__}, not an object of "
                                        "columns: write one object per line, {\"input\": ..., \"output\": ...}")
                    yield number, record
                return
            csv.field_size_limit(MAX_FIELD_CHARS)
            # strict: a quote never closed is an error, not the rest of the file read as one cell
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",", strict=True)
            if not reader.fieldnames:
                raise UserError(f"{path} is empty: a header line (input,output,...) and rows are needed")
            twice = [name for name in reader.fieldnames if reader.fieldnames.count(name) > 1]
            if twice:
                raise UserError(f"{path}'s header names the column {twice[0]!r} twice: rename one")
            while True:
                start = reader.line_num + 1  # where the next row begins (a quoted cell may span lines)
                try:
                    record = next(reader)
                except StopIteration:
                    return
                except csv.Error as err:
                    if "unexpected end of data" in str(err):
                        raise UserError(f"{path} line {start}: a quote opened in this row is never closed, so the "
                                        "rest of the file would be one cell: close it (a quote inside a quoted cell "
                                        'is written twice, "")') from None
                    raise UserError(f"{path} line {start} is not a readable CSV row ({err}): quote a cell that holds "
                                    'the delimiter or a quote, and write a quote inside it twice ("")') from None
                if None in record:  # more cells than the header names
                    raise UserError(f"{path} line {reader.line_num} has more cells than its header "
                                    f"({', '.join(reader.fieldnames)}): quote cells that hold the delimiter")
                if any(v is not None and v.strip() for v in record.values()):
                    yield reader.line_num, record
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text: save it as UTF-8") from None
    except csv.Error as err:
        raise UserError(f"{path} is not a readable CSV ({err}): fix the file") from None


class _TwiceError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.why = f"names {key!r} twice (keep one)"  # what `json_lines` says of the line


def _no_twice(pairs: list) -> dict:
    """A JSON object that names each key once (`json.loads` would keep the last of two silently)."""
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise _TwiceError(key)
        seen[key] = value
    return seen


# How a file of data.also gets column names of its own, said where a mapping does not fit a file.
_OWN_MAPPING = "a file of data.also can have its own: data.also=[{path: <file>, columns: {input: <column>, ...}}]"


def _check_columns(file: Path, seen: set[str], names: Mapping[str, str], given: Mapping[str, str],
                   where: str = "data.columns", header: bool = False) -> None:
    """Every column the config names is in `file` (`seen`: its columns): a split or task column spelt otherwise
    would be passed over without a word, and test rows would train. `header`: `seen` is a CSV's header, which
    every row shares, so an input or output column it lacks is said here, with what the header is instead."""
    missing = [role for role in TABLE_COLUMNS if names[role] not in seen]
    if missing and any("\ufeff" in column for column in seen):
        raise UserError(f"{file}'s header starts with a second byte-order mark (U+FEFF), read as part of the "
                        f"column {next(c for c in seen if chr(0xFEFF) in c)!r}: save the file as UTF-8 once")
    if missing and file.suffix.lower() == ".tsv" and len(seen) == 1 and "," in next(iter(seen)):
        raise UserError(f"{file} is read at tabs (.tsv) and its header has none, only commas: name it .csv")
    for role in missing:
        name = names[role]
        alike = next((c for c in seen if c.strip().casefold() == name.casefold()), None)
        if alike is not None:
            raise UserError(f"{file} has a column {alike!r}, not {name!r}: set {where}.{role}={alike}")
        if role in given or (header and role in ("input", "output")):
            applied = f" ({where}.{role} applied)" if role in given else f" (set {where}.{role}=<your column>)"
            raise UserError(f"{file} has no column {name!r}{applied}; its columns are {', '.join(sorted(seen))}; "
                            f"{_OWN_MAPPING}")


def _cell(record: dict, column: str, path: Path, number: int, required: bool = True,
          where: str = "data.columns") -> Optional[str]:
    value = record.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise UserError(f"{path} line {number} has no {column}: every row needs an input and an output "
                            f"({where} maps your column names; {_OWN_MAPPING})")
        return None
    if isinstance(value, bool):
        value = "Yes" if value else "No"
    if isinstance(value, (int, float)):
        value = repr(value) if isinstance(value, float) else str(value)
    if not isinstance(value, str):
        raise UserError(f"{path} line {number}: {column} is a JSON {type(value).__name__}, not text or a number")
    if "\x00" in value:  # no molecule, name or answer holds one; a tokenizer or RDKit may cut the text there
        raise UserError(f"{path} line {number}: {column} holds a NUL byte (at character {value.index(chr(0))}): "
                        "mend the row (a binary file, or text written with a broken encoding)")
    return value.strip()


def _answer(task: Task, text: str, path: Path, number: int) -> str:
    """The gold answer as its family reads it: Yes/No for yes/no tasks, a number for number tasks."""
    if task.family == "boolean":
        label = _YES_NO.get(text.lower())
        if label is None:
            raise UserError(f"{path} line {number}: output {text[:40]!r} of yes/no task {task.name} is not yes/no, "
                            "true/false or 1/0")
        return label
    if task.family == "number":
        try:
            ok = math.isfinite(float(text))
        except ValueError:
            ok = False
        if not ok:
            raise UserError(f"{path} line {number}: output {text[:40]!r} of number task {task.name} is not a finite "
                            "number")
    return text


def _split_key(task: Task, text: str) -> str:
    """What the held-out split is drawn on: the molecule (one SMILES spelt two ways is one input), else the text."""
    if task.input_kind == "smiles":
        from rdkit import Chem, RDLogger

        RDLogger.DisableLog("rdApp.*")
        try:  # RDKit's canonical SMILES: one read and write (the scorer's official form costs 20 times more)
            mol = Chem.MolFromSmiles(text)
            return Chem.MolToSmiles(mol) if mol is not None else text
        except Exception:  # RDKit may raise on odd text: then the text itself is the key
            return text
    return text


def _hashed_split(text: str, fractions: Mapping[str, float]) -> str:
    u = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64
    validation, test = fractions.get("validation", 0.0), fractions.get("test", 0.0)
    return "validation" if u < validation else "test" if u < validation + test else "train"


def read_table(path: str | Path, columns: Optional[Mapping[str, str]] = None,
               fractions: Optional[Mapping[str, float]] = None, table: TaskTable = SMOLINSTRUCT,
               where: str = "data.columns") -> list[Row]:
    """Every row of table data `path` (`is_table`), checked, with its task and split (`columns`: role -> column
    name, `data.columns` or a place of data.also's own, named by `where`; `fractions`: what a table without splits
    holds out, `data.split_fractions`; `table`: the run's tasks, whose declared ones the rows may be)."""
    path = Path(path)
    given = {role: name for role, name in (columns or {}).items() if name != role}
    names = {**{role: role for role in TABLE_COLUMNS}, **(columns or {})}
    fractions = fractions or {}
    files = {None: path} if path.is_file() or path.suffix.lower() in TABLE_SUFFIXES else _split_files(path)
    own = list(table.declared)
    # A file without a task column: the declared task it (or its folder of splits) is named for, or the only one.
    stem = path.stem if path.suffix.lower() in TABLE_SUFFIXES else path.name
    named = stem if stem in own else own[0] if len(own) == 1 else None
    rows: list[Row] = []
    pools: dict[tuple, set] = defaultdict(set)  # a pooled task's different golds per input and split, bounded
    for split_of_file, file in files.items():
        jsonl, seen = file.suffix.lower() == ".jsonl", set()  # the columns seen: a CSV's header, a JSONL's keys
        for number, record in _records(file):
            if jsonl:
                seen.update(record)
            elif not seen:
                seen = set(record)
                _check_columns(file, seen, names, given, where, header=True)
            task_name = _cell(record, names["task"], file, number, required=False) or named
            if task_name is None:
                raise UserError(f"{file} line {number} names no task: give the file a {names['task']} column, name "
                                "the file (or its folder) for a declared task, or declare one task, "
                                "+data.new_tasks.<name>.family=<smiles, formula, iupac, number, boolean or caption> "
                                f"(declared: {', '.join(own) or 'none'})")
            task = table.task(task_name, f"the {names['task']} column of {file} line {number}")
            if task.in_smolinstruct:
                raise UserError(f"{file} line {number} is a sample of SMolInstruct's {task.name}, whose queries and "
                                "tags its own files hold: give your rows a task of your own (data.new_tasks, e.g. "
                                f"+data.new_tasks.my_{task.name.rsplit('-', 1)[-1]}.family={task.family})")
            core_in = _cell(record, names["input"], file, number, where=where)
            core_out = _answer(task, _cell(record, names["output"], file, number, where=where), file, number)
            for role, text, kind in (("input", core_in, task.input_kind), ("output", core_out, task.family)):
                if kind == "smiles" and len(text) > MAX_SMILES_CHARS:  # RDKit would stall or crash on it
                    raise UserError(f"{file} line {number}: the {role} of task {task.name} is a SMILES of "
                                    f"{len(text):,} characters, past the {MAX_SMILES_CHARS:,} any molecule is read "
                                    "with here: leave the row out (no SMolInstruct molecule comes close)")
            split = split_of_file
            marked = _cell(record, names["split"], file, number, required=False)
            if marked is not None:
                if split is not None:
                    raise UserError(f"{file} is named for the {split} split and has a {names['split']} column: keep one")
                split = SPLIT_NAMES.get(marked.lower())
                if split is None:
                    raise UserError(f"{file} line {number}: split {marked[:40]!r} is none of train, validation (dev, "
                                    "valid) or test")
            if split is None:
                split = _hashed_split(_split_key(task, core_in), fractions) if any(fractions.values()) else "train"
            if task.pooled:
                pool = pools[task.name, split, core_in]
                pool.add(core_out)
                if len(pool) > MAX_POOLED_GOLDS:
                    raise too_many_golds(task, core_in, f"{file} line {number}")
            rows.append(Row(task.name, split, core_in, core_out, number))
        if jsonl and seen:  # a JSONL names its keys line by line: checked once all are seen
            _check_columns(file, seen, names, given)
    if not rows:
        raise UserError(f"{path} holds no rows: a header line (input,output,...) and rows are needed")
    return rows


def _texts(value, default: Optional[str]) -> list[Optional[str]]:
    if value is None:
        return [default]
    return list(value) if isinstance(value, list) else [value]


class TableSplit:
    """One split of table data, with the access `SMolInstructSplit` gives (samples task after task)."""

    def __init__(self, rows: list[Row], split: str, tasks: list[str], insert_core_tags: bool = True,
                 max_samples_per_task: Optional[int] = None, table: TaskTable = SMOLINSTRUCT) -> None:
        self.split = split
        by_task: dict[str, list[Row]] = {}
        for row in rows:
            if row.split == split:
                by_task.setdefault(row.task, []).append(row)
        self.tasks = [t for t in tasks if t in by_task]
        self.skipped: dict[str, int] = {}
        self.insert_core_tags = insert_core_tags
        kept = [by_task[t][:max_samples_per_task] if max_samples_per_task else by_task[t] for t in self.tasks]
        self._rows: list[Row] = [row for mine in kept for row in mine]
        self._ends = np.cumsum([len(mine) for mine in kept])
        self.table = table
        self._task_rows = {t: table.task(t) for t in self.tasks}
        decl = table.declared
        self._templates = {t: (_texts(decl.get(t, {}).get("query"), None),
                               _texts(decl.get(t, {}).get("response"), "<OUTPUT>")) for t in self.tasks}

    def __len__(self) -> int:
        return len(self._rows)

    def task_index(self, i: int) -> int:
        return int(np.searchsorted(self._ends, i, side="right"))

    def task_row(self, i: int) -> Task:
        return self._task_rows[self.tasks[self.task_index(i)]]

    def counts(self) -> dict[str, int]:
        starts = [0, *self._ends[:-1]]
        return {t: int(end - start) for t, start, end in zip(self.tasks, starts, self._ends)}

    def length_hints(self) -> np.ndarray:
        return np.asarray([len(r.input) + len(r.output) for r in self._rows], dtype=np.int32)

    def _wrap(self, text: str, tag: Optional[str]) -> str:
        opening, closing = tag_pair(tag)
        return f"{opening} {text} {closing}" if self.insert_core_tags and opening else text

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        row = self._rows[i]
        task = self._task_rows[row.task]
        queries, responses = self._templates[row.task]
        query, response = queries[row.number % len(queries)], responses[row.number % len(responses)]
        answer = f"<{task.answer_tag}> {row.output} </{task.answer_tag}>" if task.answer_tag else row.output
        return {
            "task": row.task,
            "input": row.input if query is None else query.replace("<INPUT>", self._wrap(row.input, task.input_tag)),
            "output": response.replace("<OUTPUT>", answer),
            "raw_input": row.input,
            "raw_output": row.output,
            "target": None,
        }

    def core_samples(self, task: str) -> Iterator[tuple[str, str, None]]:
        for row in self._rows:
            if row.task == task:
                yield row.input, row.output, None

    def close(self) -> None:
        """Nothing stays open: the rows were read at start."""


class MixedSplit:
    """Splits of several sources served as one, each source's tasks after the previous source's."""

    def __init__(self, parts: list) -> None:
        self.parts = [p for p in parts if len(p.tasks)]
        self.table = parts[0].table  # one source's parts share its task table
        self.tasks = [t for p in self.parts for t in p.tasks]
        self.skipped = {k: v for p in self.parts for k, v in p.skipped.items()}
        self._ends = np.cumsum([len(p) for p in self.parts])
        self._task_ends = np.cumsum([len(p.tasks) for p in self.parts])

    def _part(self, i: int) -> tuple[int, int]:
        k = int(np.searchsorted(self._ends, i, side="right"))
        return k, i - (int(self._ends[k - 1]) if k else 0)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        k, j = self._part(i)
        return self.parts[k][j]

    def task_index(self, i: int) -> int:
        k, j = self._part(i)
        return (int(self._task_ends[k - 1]) if k else 0) + self.parts[k].task_index(j)

    def task_row(self, i: int) -> Task:
        k, j = self._part(i)
        return self.parts[k].task_row(j)

    def counts(self) -> dict[str, int]:
        return {t: n for p in self.parts for t, n in p.counts().items()}

    def length_hints(self) -> np.ndarray:
        return np.concatenate([p.length_hints() for p in self.parts]) if self.parts else np.zeros(0, np.int32)

    def core_samples(self, task: str):
        return next(p for p in self.parts if task in p.tasks).core_samples(task)

    def close(self) -> None:
        for part in self.parts:
            part.close()
