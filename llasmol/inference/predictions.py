"""Predictions files (JSONL, one record per line): the record type of a line (`Prediction`), the one
builder of our records (`make_record`: validation, evaluate and the baselines) and the one reader
(`read_predictions`: `evaluate predictions=`, the run directories' `predictions/*.jsonl` read by
`llasmol.analysis`, and any other system's output).

Each line needs ``task``, ``input``, ``gold`` and ``predictions`` (strings, or lists of strings; numbers are
read as their text; ``predictions`` null means the prompt was skipped). Records come back with ``gold``
and ``predictions`` as lists of strings and ``skipped`` as a boolean; other fields are kept as they are.

The official LLM4Chem code's output is read as it is: `generate_on_dataset.py` writes one `<task>.jsonl`
per task into a folder, each line with ``input`` (the core input, e.g. a SMILES), ``gold`` (that sample's
own answer), ``output`` (the generated texts, best first, or null) and ``input_text`` (the prompt). Given
that folder (or one of its files), ``output`` is read as ``predictions``, ``input`` as ``raw_input`` and
``input_text`` as ``input``; golds are pooled across samples of one input by the same rule as ours
(`llasmol.metrics.scoring.record_golds`), so the file scores as the paper's `compute_metrics.py` does.
Its outputs were decoded with the special tokens kept (generation.py:106, ``skip_special_tokens=False``),
so they end in ``</s>`` and padding's ``<unk>``. They are kept as they are: the scorer's `extract_answer`
reads every prediction as the official `extract_prediction.py` reads them, whichever file they come from.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from llasmol.core.errors import UserError
from llasmol.core.files import json_lines, unreadable
from llasmol.core.run_dir import PREDICTIONS, read_tasks
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.metrics.extract import extract_answer
from llasmol.metrics.families import parse_boolean
from llasmol.metrics.scoring import GoldPool, is_skipped


class Responses(list):
    """One query's responses, best first, and whether each ended (its end of sequence came within its token bound):
    what a generator hands `make_record`, which writes the flags as the record's `ended`."""

    def __init__(self, texts: list[str], ended: list[bool]) -> None:
        super().__init__(texts)
        self.ended = ended


@dataclass
class Prediction:
    """One line of a predictions file, its fields in the order they are written. ``target`` (SIDER's side
    effect) is left out when None; ``extra`` holds the fields other writers add (a base-model protocol's
    ``query`` and ``extraction``; LLM4Chem's ``input_text``), written after the others."""

    task: str
    index: Optional[int]  # the sample's index in its split (None: another system's file)
    input: str  # the query as asked
    raw_input: Optional[str]  # the core input (a SMILES, a name): what golds pool by
    target: Optional[str]
    gold: list[str]  # every gold answer the task's pooling rule gives
    predictions: Optional[list[str]]  # raw responses, best first; None: not generated (skipped)
    answers: Optional[list[Optional[str]]]  # the answer extracted from each prediction
    skipped: bool
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The line as written (`json.dumps` of it)."""
        line = {f.name: getattr(self, f.name) for f in FIELDS if f.name != "extra"}
        if line["target"] is None:
            del line["target"]
        return {**line, **self.extra}

    @classmethod
    def from_dict(cls, line: dict) -> "Prediction":
        """A line read back: the fields it lacks are None (``skipped``: whether it has no predictions)."""
        known = {f.name: line.get(f.name) for f in FIELDS if f.name not in ("extra", "skipped")}
        return cls(**known, skipped=is_skipped(line), extra={k: v for k, v in line.items() if k not in NAMES})


FIELDS = dataclasses.fields(Prediction)
NAMES = frozenset(f.name for f in FIELDS) - {"extra"}
REQUIRED = ("task", "input", "gold", "predictions")  # what a line of any system's file must have
TEXT_OR_NULL = ("raw_input", "target")


def make_record(index: int, sample: dict, golds: GoldPool, predictions: Optional[list[str]]) -> dict:
    """The predictions-file record of sample `index` of a split answered with `predictions` (raw responses,
    best first; None: not generated). Every writer of predictions files (validation, evaluate, the
    baselines) builds its records here, so they carry the same fields; generated responses also say whether
    each ended (`ended`: its end of sequence came within its token bound), which a GRPO validation's reward reads."""
    task = sample["task"]
    ended = getattr(predictions, "ended", None)
    return Prediction(
        task=task, index=index, input=sample["input"], raw_input=sample["raw_input"], target=sample.get("target"),
        gold=golds.golds(sample, sample["raw_output"]), predictions=None if predictions is None else list(predictions),
        answers=None if predictions is None else [extract_answer(task, p, golds.tasks) for p in predictions],
        skipped=predictions is None, extra={} if ended is None else {"ended": list(ended)},
    ).to_dict()


def _texts(value, what: str, where: str, allow_none: bool = False) -> list[str]:
    """A gold or predictions field as a list of strings; numbers become their JSON text."""
    if value is None and allow_none:
        return []
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise UserError(f"{where}: {what} must be a string or a list of strings, not {json.dumps(item)[:60]}")
        out.append(item if isinstance(item, str) else json.dumps(item))
    return out


def _files(path: Path) -> list[Path]:
    """The file itself, or a folder's `*.jsonl` files (LLM4Chem writes one per task)."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise UserError(f"predictions folder {path} holds no .jsonl files: pass predictions=<file.jsonl> or a "
                            "folder of them (one per task, as LLM4Chem's generate_on_dataset.py writes)")
        return files
    _checked_path(path)
    return [path]


def _from_llm4chem(record: dict) -> dict:
    """An LLM4Chem `generate_on_dataset.py` line in our field names (see the module's docstring)."""
    record = dict(record)
    record["predictions"] = record.pop("output")
    if "raw_input" not in record:
        record["raw_input"] = record["input"]
        if isinstance(record.get("input_text"), str):
            record["input"] = record["input_text"]
    return record


def _checked_path(path: Path) -> None:
    problem = unreadable(path)
    if problem:
        raise UserError(f"predictions file {path} {problem}: pass predictions=<file.jsonl> (or a folder of them)")


def _field_types(record: dict, where: str) -> None:
    """The fields other code reads beside gold and predictions: text where text is expected."""
    if not isinstance(record["input"], str):
        raise UserError(f"{where}: input must be a string, not {type(record['input']).__name__}")
    for key in TEXT_OR_NULL:
        if record.get(key) is not None and not isinstance(record[key], str):
            raise UserError(f"{where}: {key} must be a string or null, not {type(record[key]).__name__}")
    if "skipped" in record and not isinstance(record["skipped"], bool):
        raise UserError(f"{where}: skipped must be true or false, not {json.dumps(record['skipped'])[:40]}")


def predictions_tasks(path: str | Path, beside: TaskTable = SMOLINSTRUCT) -> TaskTable:
    """`beside` and the tasks of the run whose `predictions/` holds `path` (its `tasks.json`): the table a
    predictions file's tasks are read and scored by."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    return read_tasks(folder.parent, beside) if folder.name == PREDICTIONS else beside


def read_predictions(path: str | Path, allow_empty: bool = False, tasks: Optional[TaskTable] = None) -> list[dict]:
    """Records of a predictions JSONL file (or a folder of them), checked line by line, each task one of `tasks`
    (`predictions_tasks(path)` when not given). An empty file is an error unless `allow_empty`: a run's
    validation may have had nothing to generate."""
    tasks = predictions_tasks(path) if tasks is None else tasks
    records, pool = [], GoldPool(tasks)  # the golds pooled as the scorer pools them: an input past its bound is named
    for file in _files(Path(path)):
        records += _read_file(file, tasks, pool)
    if not records and not allow_empty:
        raise UserError(f"predictions file {path} is empty: it needs one JSON object per line")
    return records


def _encodable(value, where: str, key: str = "") -> None:
    """JSON may escape a lone surrogate (`"\\ud800"`), which is no text: every later write or print of it would
    fail. Named here, with its field, as the reader's other refusals are."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            char = value[err.start]
            raise UserError(f"{where}: {key or 'a string'} holds {ascii(char)}, half of a UTF-16 pair and not text: "
                            "write the file's strings as UTF-8 text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _encodable(k, where, f"a key of {key}" if key else "a key")
            _encodable(v, where, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _encodable(v, where, f"{key}[{i}]")


def _read_file(path: Path, tasks: TaskTable, pool: GoldPool) -> list[dict]:
    records = []
    for lineno, record in json_lines(path, "fix the line (the file is read as UTF-8 JSON, one object a line)"):
        where = f"{path} line {lineno}"
        _encodable(record, where)
        official = isinstance(record, dict) and "output" in record and "predictions" not in record
        if official:
            record = _from_llm4chem(record)
        missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
        if missing:
            raise UserError(
                f"{where} lacks {', '.join(missing)}: each line needs " + ", ".join(REQUIRED)
                + " (or output for predictions, as LLM4Chem's generate_on_dataset.py writes)"
            )
        if not isinstance(record["task"], str):
            raise UserError(f"{where}: task must be a task name, not {json.dumps(record['task'])[:40]}")
        task = tasks.task(record["task"], where)
        _field_types(record, where)
        record["skipped"] = is_skipped(record)
        record["gold"] = _texts(record["gold"], "gold", where)
        if not record["gold"]:  # nothing to score against: not a wrong answer
            raise UserError(f"{where}: gold is an empty list: each line needs the answer it is scored against")
        not_yes_no = [g for g in record["gold"] if task.family == "boolean" and parse_boolean(g) is None]
        if not_yes_no:  # it would count against accuracy and stay out of F1 and MCC (the official code: a No)
            raise UserError(f"{where}: gold {not_yes_no[0][:40]!r} of yes/no task {task.name} is not Yes or No: "
                            "write each gold of a yes/no task as Yes or No")
        record["predictions"] = _texts(record["predictions"], "predictions", where, allow_none=True)
        pool.add(record, record["gold"], where)
        records.append(record)
    return records
