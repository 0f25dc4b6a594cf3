"""The one reader of a predictions file (JSONL, one record per line): `evaluate predictions=`, the run
directories' `predictions/*.jsonl` read by `llasmol.analysis`, and any other system's output.

Each line needs ``task``, ``input``, ``gold`` and ``predictions`` (strings, or lists of strings; numbers are
read as their text; ``predictions`` null means the prompt was skipped). Records come back with ``gold``
and ``predictions`` as lists of strings and ``skipped`` as a boolean; other fields are kept as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from llasmol.core.errors import UserError
from llasmol.core.tasks import get_task
from llasmol.metrics.scoring import is_skipped

REQUIRED = ("task", "input", "gold", "predictions")


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


def read_predictions(path: str | Path, allow_empty: bool = False) -> list[dict]:
    """Records of a predictions JSONL file, checked line by line (an empty file is an error unless
    `allow_empty`: a run's validation may have had nothing to generate)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"predictions file {path} does not exist: pass predictions=<file.jsonl>")
    records = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{path} line {lineno} is not valid JSON ({err.msg})") from None
            missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
            if missing:
                raise UserError(
                    f"{path} line {lineno} lacks {', '.join(missing)}: each line needs " + ", ".join(REQUIRED)
                )
            where = f"{path} line {lineno}"
            get_task(record["task"], where)
            record["skipped"] = is_skipped(record)
            record["gold"] = _texts(record["gold"], "gold", where)
            record["predictions"] = _texts(record["predictions"], "predictions", where, allow_none=True)
            records.append(record)
    if not records and not allow_empty:
        raise UserError(f"predictions file {path} is empty: it needs one JSON object per line")
    return records


