"""A pretraining corpus checked against the held-out splits (`python -m llasmol.audit corpus=<file>`).

The demo base's corpus (scripts/pretrain_demo_base.py --corpus-out) holds SMILES and IUPAC names between
SMolInstruct's tags; every molecule (each '.'-separated part of a `<SMILES>` span) and every name (`<IUPAC>`) in
it is keyed as the audit keys a split's (`sample_keys`: a molecule by its standard InChI, so spellings do not
matter and stereo does; a name by its words), and each one that is also a molecule or name of a held-out split
(any task, input or gold) is a finding that fails the audit.

A corpus file is JSON lines, each an object with a string `text` (the script's form), or plain text, one
document a line; it is read as data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Iterator

from llasmol.core.errors import UserError
from llasmol.core.files import unreadable
from llasmol.data.smolinstruct import read_core_tags, read_raw_records
from llasmol.data.source import SMolInstructSource
from llasmol.leakage.sample_keys import NAME, SMILES, _part, kind_of_tag, text_field

_SPANS = re.compile(r"<(SMILES|IUPAC)>\s*(.*?)\s*</\1>", re.S)


def _documents(path: Path) -> Iterator[tuple[int, str]]:
    problem = unreadable(path)
    if problem:
        raise UserError(f"corpus={path} {problem}: give the file a corpus was written to (--corpus-out)")
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            text = line.rstrip("\n")
            if text.startswith("{"):
                try:
                    record = json.loads(text)
                except ValueError:
                    raise UserError(f"corpus={path} line {number} starts a JSON object that does not parse: write "
                                    "one {\"text\": ...} object a line, or plain text") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise UserError(f"corpus={path} line {number} is JSON without a string \"text\": write one "
                                    "{\"text\": ...} object a line")
                text = record["text"]
            yield number, text


def _keys(kind: str, value: str) -> Iterable[int]:
    """The keys of one field: each readable molecule of a SMILES field, or a name's words."""
    if kind == SMILES:
        for part in value.replace(";", ".").split("."):
            key, _ = _part(part.strip()) if part.strip() else (None, None)
            if key is not None:
                yield key
    elif kind == NAME:
        yield text_field(value).key


def held_out_keys(source: SMolInstructSource, splits: Iterable[str]) -> dict[int, str]:
    """Key -> where it is (`task/split: text`), for every molecule and name of the held-out `splits`."""
    root, found = Path(source.root()), {}
    for split in splits:
        for task in source.task_names():
            tags = read_core_tags(root, task)
            kinds = (kind_of_tag(tags["input"][0]), kind_of_tag(tags["output"][0]))
            for _, record in read_raw_records(source.raw_file(split, task), None):
                for value, kind in zip((record.get("input"), record.get("output")), kinds):
                    if isinstance(value, str):
                        for key in _keys(kind, value):
                            found.setdefault(key, f"{task} ({split}): {value[:120]}")
    return found


def corpus_overlap(source: SMolInstructSource, corpus: Path, held_out: list[str], examples: int = 3) -> dict:
    """What of `corpus` is also in a held-out split: counts, examples, and whether it passed (nothing shared)."""
    index = held_out_keys(source, held_out)
    seen, shared, found = {SMILES: set(), NAME: set()}, {SMILES: set(), NAME: set()}, []
    documents = 0
    for number, text in _documents(Path(corpus)):
        documents += 1
        for tag, value in _SPANS.findall(text):
            kind = kind_of_tag(f"<{tag}>")
            for key in _keys(kind, value):
                seen[kind].add(key)
                if key in index and key not in shared[kind]:
                    shared[kind].add(key)
                    if len(found) < examples:
                        found.append({"line": number, "corpus": value[:120], "held_out": index[key]})
    return {"file": str(corpus), "documents": documents, "molecules": len(seen[SMILES]), "names": len(seen[NAME]),
            "shared_molecules": len(shared[SMILES]), "shared_names": len(shared[NAME]), "examples": found,
            "held_out": list(held_out), "passed": not shared[SMILES] and not shared[NAME]}
