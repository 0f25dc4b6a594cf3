#!/usr/bin/env python
"""Read the LlaSMol paper's result tables from its chunked text, as a second transcription of the numbers
in `llasmol/analysis/paper.py` (tests/test_paper_transcription.py compares every cell).

Usage::

    python scripts/transcribe_paper_tables.py ../shared/paper/llasmol-paper-excerpts.txt \
        --out tests/data/paper_tables.json

The text is a series of overlapping chunks, each prefixed with its section heading. Chunks of one section
are joined where one starts inside the text of the one before, so a table cut between chunks is read
whole where its pieces overlap. Two forms of table occur:

- plain rows (Tables 3-8, 10, 11, 13): a system's name, then one number (or ``-``) per column;
- piped cells (Tables 2 and 9): every character group in its own ``| … |`` cell, a number printed as
  ``97 | . | 9``; only the leading cells of each row survive the chunking.

Only a row whose name is followed by exactly its table's number of cells is kept: a row cut by a chunk's
edge is never read as a shorter one. Values are kept as printed (percentages stay percentages).
Nothing here reads `paper.py`: the names are the paper's own, as printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

# The systems as the paper prints them in its tables; longer names first, so "GPT-4 (0-shot)" is never
# read as "GPT-4" and "LlaSMolLlama 2" never as "Llama 2".
SYSTEMS = sorted([
    "SoTA", "STOUT+RDKit", "STOUT", "RDKit", "Uni-Mol", "MolT5", "Molecular Transformer", "RSMILES",
    "GPT-4", "GPT-4 (zero-shot)", "GPT-4 (0-shot)", "GPT-4 (1-shot)", "GPT-4 (3-shot)", "GPT-4 (5-shot)",
    "Galactica", "Llama 2", "Lama 2", "Code Llama", "Mistral", "Molinst (instruction-tuned)", "Molinst",
    "LlaSMolGalactica", "LlaSMolLlama 2", "LlaSMolCode Llama", "LlaSMolMistral",
    "LlaSMol Galactica", "LlaSMol Llama 2", "LlaSMol Code Llama", "LlaSMol Mistral",
], key=len, reverse=True)

SMILES_COLUMNS = ["em_top1", "em_top3", "em_top5", "fts_maccs", "fts_rdk", "fts_morgan", "validity"]
BOOLEAN_COLUMNS = [f"{task}_{m}" for task in ("bbbp", "clintox", "hiv", "sider") for m in ("f1", "mcc", "acc")]

# Each plain-row table: the section its text is in, the header that opens it, which occurrence of that
# header in the section (Tables 4 and 6 share one), and its columns.
PLAIN_TABLES = {
    "4": ("B.1.1. Name Conversion", "Model EM Validity Top 1 Top 3", 0, ["em_top1", "em_top3", "validity"]),
    "5": ("B.1.1. Name Conversion", "Model Exact Match FTS Validity Top 1 Top 3 Top 5 MACCS RDK Morgan", 0,
          SMILES_COLUMNS),
    "6": ("B.1.1. Name Conversion", "Model EM Validity Top 1 Top 3", 1, ["em_top1", "em_top3", "validity"]),
    "7": ("B.1.1. Name Conversion", "Model EM Top 1 Top 3 Top 5", 0, ["em_top1", "em_top3", "em_top5"]),
    "8": ("B.1.2. Molecule Description", "Model Exact Match FTS Validity Top 1 Top 3 Top 5 MACCS RDK Morgan", 0,
          SMILES_COLUMNS),
    "10": ("B.1.4. Property Prediction", "Model Exact Match FTS Validity Top 1 Top 3 Top 5 MACCS RDK Morgan", 0,
           SMILES_COLUMNS),
    "11": ("B.1.4. Property Prediction", "Model Exact Match FTS Validity Top 1 Top 3 Top 5 MACCS RDK Morgan", 1,
           SMILES_COLUMNS),
    "13": ("B.1.4. Property Prediction", "Model PP-BBBP PP-ClinTox PP-HIV PP-SIDER F1 MCC Acc F1 MCC Acc F1 MCC "
           "Acc F1 MCC Acc", 0, BOOLEAN_COLUMNS),
    # Table 3's header and first rows are not in the text: its rows start inside the section of 5.4.
    "3": ("5.4. Influence Of Lora Modules And Trainable Parameters", None, 0,
          ["mc_meteor", "mg_em", "mg_fts", "mg_validity", "fs_em", "fs_fts", "fs_validity", "rs_em", "rs_fts",
           "rs_validity"]),
}
# The piped tables: section, and the leading columns that survive in every row.
PIPED_TABLES = {
    "2": ("5.3. Main Results", ["i2f_em", "i2s_em", "i2s_validity"]),
    "9": ("B.1.2. Molecule Description", ["bleu2", "bleu4"]),
}

CELL = r"(?:−?-?\d+\.\d+|-)"


def chunks(text: str) -> list[tuple[str, str]]:
    """(section heading, chunk text) of every chunk, in file order."""
    out = []
    for line in text.splitlines():
        if line.startswith("# ") and " ## " in line:
            body = line.split(" ## ", 1)[1]
            out.append(body)
    return [(_heading(body), body) for body in out]


def _heading(body: str) -> str:
    for heading in {v[0] for v in [*PLAIN_TABLES.values(), *PIPED_TABLES.values()]}:
        if body.startswith(heading):
            return heading
    return ""


def join(previous: str, chunk: str, least: int = 24) -> str | None:
    """`previous` continued by `chunk` where `chunk` starts inside it (and agrees with it from there), else
    None."""
    probe = chunk[:least]
    start = previous.find(probe)
    while start != -1:
        overlap = previous[start:]
        if chunk.startswith(overlap) or overlap.startswith(chunk):
            return previous[:start] + chunk if len(chunk) > len(overlap) else previous
        start = previous.find(probe, start + 1)
    return None


def sections(text: str) -> dict[str, list[str]]:
    """Each table section's text: its chunks joined where they overlap (a list: pieces that do not)."""
    out: dict[str, list[str]] = {}
    for heading, body in chunks(text):
        if not heading:
            continue
        body = body[len(heading):].strip()
        pieces = out.setdefault(heading, [])
        joined = join(pieces[-1], body) if pieces else None
        if joined is None:
            pieces.append(body)
        else:
            pieces[-1] = joined
    return out


def _number(cell: str) -> float | None:
    return None if cell == "-" else float(cell.replace("−", "-"))


def plain_rows(text: str, width: int) -> dict[str, list[float | None]]:
    """Every ``<system> <width cells>`` row of `text` whose cells are followed by a name or the end of a
    table (not by another number: that would be a row of another width)."""
    names = "|".join(re.escape(n) for n in SYSTEMS)
    row = re.compile(rf"(?<![\w(])({names})((?:\s+{CELL}){{{width}}})(?=\s+(?!{CELL}\b)|$)")
    rows = {}
    for match in row.finditer(text):
        cells = [_number(c) for c in match.group(2).split()]
        rows.setdefault(match.group(1), cells)
    return rows


def plain_table(pieces: list[str], header: str | None, occurrence: int, width: int) -> dict:
    """One plain table's rows: from its header (the `occurrence`-th in the section) to the next header."""
    rows: dict = {}
    for piece in pieces:
        if header is None:
            rows.update({k: v for k, v in plain_rows(piece, width).items() if k not in rows})
            continue
        starts = [m.start() for m in re.finditer(re.escape(header), piece)]
        if len(starts) <= occurrence:
            continue
        start = starts[occurrence] + len(header)
        end = piece.find("Model ", start)
        for name, cells in plain_rows(piece[start:end if end != -1 else None], width).items():
            rows.setdefault(name, cells)
    return rows


def piped_table(pieces: list[str], width: int) -> dict:
    """The leading `width` numbers of each row of a piped table (each printed over three cells)."""
    names = "|".join(re.escape(n) for n in SYSTEMS)
    number = r"\|\s*(\d+)\s*\|\s*\.\s*\|\s*(\d+)\s*"
    row = re.compile(rf"\|\s*({names})\s*(?:\|\s*)+" + "".join([number] * width) + r"\|")
    rows: dict = {}
    for piece in pieces:
        # The LlaSMol rows print their name over two cells: "LlaSMol | | … | Galactica".
        piece = re.sub(r"\|\s*LlaSMol\s*(?:\|\s*)+(Galactica|Llama 2|Code Llama|Mistral)\s*", r"| LlaSMol\1 ", piece)
        for match in row.finditer(piece):
            groups = match.groups()[1:]
            cells = [float(f"{groups[i]}.{groups[i + 1]}") for i in range(0, 2 * width, 2)]
            rows.setdefault(match.group(1), cells)
    return rows


def transcribe(text: str) -> dict:
    """Every table this script reads: ``{table: {"columns": [...], "rows": {system: [cells]}}}``."""
    found = sections(text)
    tables = {}
    for table, (heading, header, occurrence, columns) in PLAIN_TABLES.items():
        tables[table] = {"columns": columns,
                         "rows": plain_table(found.get(heading, []), header, occurrence, len(columns))}
    for table, (heading, columns) in PIPED_TABLES.items():
        tables[table] = {"columns": columns, "rows": piped_table(found.get(heading, []), len(columns))}
    return dict(sorted(tables.items(), key=lambda item: int(item[0])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("excerpts", type=Path, help="the paper's chunked text")
    parser.add_argument("--out", type=Path, default=Path("tests/data/paper_tables.json"))
    args = parser.parse_args()
    raw = args.excerpts.read_bytes()
    result = {"source": args.excerpts.name, "sha256": hashlib.sha256(raw).hexdigest(),
              "tables": transcribe(raw.decode("utf-8"))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{args.out}: " + ", ".join(f"Table {t} {len(v['rows'])} rows" for t, v in result["tables"].items()))


if __name__ == "__main__":
    main()
