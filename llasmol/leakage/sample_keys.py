"""What a raw SMolInstruct field is, as 8-byte keys: molecules by structure, names and text by their words.

A SMILES field's key is the set of its molecules' structures: each '.'-separated part is identified as the
scorer identifies an answer (`llasmol.metrics.molecules.parse_molecule`: standard InChI, so Kekulé and
aromatic spellings, fragment order and repeated fragments do not matter; stereo does), within the same
bounds (`MAX_SMILES_CHARS`, `MAX_ATOMS`, `MAX_RING_CLOSURES`), so a pathological line cannot stall an
audit. A part RDKit cannot read, or one past the bounds, makes the field `invalid` or `too_complex`; such a
field is then keyed by its spelling, so two copies of it still match. Names (`<IUPAC>`) and other text are
keyed by their words (runs of white space count as one space; case is kept: it is meaningful in IUPAC names).

Keys are 64-bit BLAKE2b digests, so the audit holds integers rather than strings: two different
structures share a key with probability about n²/2⁶⁵ for n distinct keys (under 10⁻⁵ for 10 million).
RDKit's InChI is most of an audit's time; `keyed_records` can spread it over worker processes.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import deque
from concurrent.futures import Executor
from typing import Any, Iterable, Iterator, NamedTuple, Optional

from llasmol.metrics.molecules import parse_molecule, too_complex

SMILES, NAME, TEXT = "smiles", "name", "text"
_KIND_OF_TAG = {"<SMILES>": SMILES, "<IUPAC>": NAME}


def kind_of_tag(tag: Optional[str]) -> str:
    """What a field wrapped in core tag `tag` holds: SMILES, a name, or other text (formulas, numbers, prose)."""
    return _KIND_OF_TAG.get(tag or "", TEXT)


def digest(text: str) -> int:
    """A 64-bit key of `text`."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class Field(NamedTuple):
    """One field of a record: its key, the keys of its molecules (SMILES fields that parse), and what is
    wrong with it (None, "invalid", "too_complex")."""

    key: int
    parts: Optional[frozenset[int]]
    problem: Optional[str]


# The parts cache is bounded: reagents and solvents repeat across millions of reactions, but an unbounded
# cache would grow with the dataset (about 200 bytes an entry).
@functools.lru_cache(maxsize=1 << 16)
def _part(part: str) -> tuple[Optional[int], Optional[str]]:
    molecule = parse_molecule(part)
    if molecule is None:
        return None, "too_complex" if too_complex(part) else "invalid"
    (identity,) = molecule.keys
    return digest(identity), None


def _set_key(parts: frozenset[int]) -> int:
    return digest("mol:" + ",".join(map(str, sorted(parts))))


def text_field(text: str) -> Field:
    return Field(digest("text:" + " ".join(text.split())), None, None)


def smiles_field(text: str) -> Field:
    """The molecules of a SMILES field; a field with any unreadable part is keyed by its spelling."""
    keys = []
    # ';' separates molecules as '.' does, as the scorer reads it (`parse_molecule`); a part holding one
    # would be two molecules where one key is expected.
    for part in text.strip().replace(";", ".").split("."):
        key, problem = _part(part.strip()) if part.strip() else (None, "invalid")
        if key is None:
            return text_field(text)._replace(problem=problem)
        keys.append(key)
    parts = frozenset(keys)
    return Field(_set_key(parts), parts, None)


def field(value: Any, kind: str) -> Field:
    """The key of a raw record's `input` or `output`. A multi-target output (SIDER's dict of side effects)
    is keyed by its whole content, in key order."""
    if not isinstance(value, str):
        return text_field(json.dumps(value, sort_keys=True, ensure_ascii=False))
    return smiles_field(value) if kind == SMILES else text_field(value)


def pair_key(a: Field, b: Field) -> int:
    """One key for an (input, output) pair: a sample's identity when looking for duplicates."""
    return digest(f"pair:{a.key}:{b.key}")


_CHUNK = 500  # records a worker keys at a time


def _fields(values: list, kinds: tuple[str, str]) -> list[tuple[Field, Field]]:
    """The keys of a chunk of (input, output) values: what a worker process computes."""
    return [(field(i, kinds[0]), field(o, kinds[1])) for i, o in values]


def keyed_records(records: Iterable[tuple[int, dict]], kinds: tuple[str, str], pool: Optional[Executor],
                  workers: int) -> Iterator[tuple[int, Field, Field]]:
    """(line, input Field, output Field) of each raw record, in file order. With `pool`, the workers key
    chunks of records; at most two chunks per worker are waiting, so memory stays flat for any file size."""

    def values() -> Iterator[tuple[int, Any, Any]]:
        # `read_raw_records` passes only objects with both fields (the rule training checks at start-up).
        for line, record in records:
            yield line, record["input"], record["output"]

    if pool is None:
        for line, i, o in values():
            yield line, field(i, kinds[0]), field(o, kinds[1])
        return
    pending: deque = deque()  # (lines, future of their fields), oldest first

    def submit(chunk: list) -> None:
        pending.append(([line for line, _, _ in chunk], pool.submit(_fields, [(i, o) for _, i, o in chunk], kinds)))

    def oldest() -> Iterator[tuple[int, Field, Field]]:
        lines, future = pending.popleft()
        for line, (i, o) in zip(lines, future.result()):
            yield line, i, o

    chunk: list = []
    for item in values():
        chunk.append(item)
        if len(chunk) == _CHUNK:
            submit(chunk)
            chunk = []
            if len(pending) >= 2 * workers:
                yield from oldest()
    if chunk:
        submit(chunk)
    while pending:
        yield from oldest()
