"""The result of a leakage audit (`llasmol.leakage.checks.audit`) as Markdown and as console lines."""

from __future__ import annotations

from typing import Optional

from llasmol.analysis.tables import Table

_WHAT = {
    "identical_input": "the same input in two splits of a task",
    "shared_reaction": "one reaction in two splits of FS and RS",
    "shared_molecule": "one molecule in two splits of related tasks",
    "shared_name": "one IUPAC name in two splits of related tasks",
    "duplicate": "the same input and output twice in one split",
}

BUNDLED_COUNTS = ("the bundled data is a small excerpt (a few hundred samples a task, 11 of the 14 tasks: "
                  "llasmol/data/bundled/PROVENANCE.md), not the full SMolInstruct of Table 1")

IDENTITY = ("Molecules are compared by structure (standard InChI of each '.'-separated part, as exact-match "
            "scoring compares answers), names and text by their words (white space collapsed).")


def _between(finding: dict) -> str:
    a, b = finding["between"]
    if a == b:
        return f"{a['task']} / {a['split']}"
    if a["task"] == b["task"]:
        return f"{a['task']}: {a['split']} ↔ {b['split']}"
    return f"{a['task']} / {a['split']} ↔ {b['task']} / {b['split']}"


def _line(example: Optional[dict]) -> str:
    if not example:
        return "(line not found)"
    return f"`{example['file']}:{example['line']}` {example['input']} → {example['output']}"


def _cell(value: Optional[int]) -> str:
    return "-" if value is None else f"{value:,}"


def to_markdown(result: dict) -> str:
    summary = result["summary"]
    verdict = "**Passed**: no leakage." if summary["passed"] else (
        f"**Failed**: {summary['failing_findings']} finding(s) break the split rules.")
    lines = [
        f"# Leakage audit of `{result['data']}`",
        "",
        f"{verdict} {summary['records']:,} raw records of {len(result['tasks'])} tasks, splits "
        + ", ".join(f"{name} (`raw/{folder}`)" for name, folder in result["splits"].items())
        + f", read in {summary['seconds']} s. Held out (an overlap with these fails): {', '.join(result['held_out'])}.",
        "",
        IDENTITY,
        "",
        "## Findings",
        "",
    ]
    if result["findings"]:
        table = Table(["check", "between", "count", "fails", "what"], [
            [f["check"], _between(f), f["count"], "yes" if f["fails"] else "no", _WHAT[f["check"]]]
            for f in result["findings"]])
        lines += [table.to_markdown(max_chars=None),
                  "Counts are held-out samples (the later split of the pair) found in the other split; for "
                  "duplicates, the repeated lines.", ""]
        for f in result["findings"]:
            lines.append(f"- {f['check']}, {_between(f)}:")
            lines += [f"  - {_line(x)}\n    {_line(y)}" for x, y in f["examples"]]
        lines.append("")
    else:
        lines += ["None.", ""]
    if result.get("corpus"):
        lines += ["## Pretraining corpus", "", "Molecules (by structure) and IUPAC names between the corpus' tags, "
                  "against every molecule and name of the held-out splits.", "",
                  *(line.strip() for line in corpus_lines(result["corpus"])), ""]
    lines += ["## Invalid SMILES", ""]
    if result["invalid_smiles"]:
        table = Table(["task", "split", "field", "problem", "count", "first"], [
            [e["task"], e["split"], e["field"], e["problem"], e["count"], _line((e["examples"] or [None])[0])]
            for e in result["invalid_smiles"]])
        lines += [table.to_markdown(max_chars=None)]
    else:
        lines += ["None: every SMILES input and gold parses within the scorer's bounds.", ""]
    lines += ["## Samples against the paper's Table 1", "",
              "Samples in each split's sample list (raw records in brackets where they differ), and the paper's count."
              + (f" {BUNDLED_COUNTS}." if result.get("bundled") else ""), ""]
    by_task: dict[str, dict] = {}
    for c in result["counts"]:
        ours = _cell(c["samples"]) + ("" if c["records"] == c["samples"] else f" [{_cell(c['records'])}]")
        if not c["audited"]:
            ours = "absent"
        by_task.setdefault(c["task"], {})[c["split"]] = f"{ours} / {_cell(c['paper'])}"
    splits = list(result["splits"])
    lines += [Table(["task", *(f"{s}: ours / paper" for s in splits)],
                    [[task, *(row.get(s, "-") for s in splits)] for task, row in by_task.items()]).to_markdown(max_chars=None)]
    skipped = result["skipped_lines"]
    if skipped["count"]:
        lines += ["", f"{skipped['count']} malformed raw line(s) skipped (data.skip_bad_lines), e.g. "
                  + "; ".join(f"`{s['file']}:{s['line']}` ({s['why']})" for s in skipped["examples"]) + "."]
    return "\n".join(lines) + "\n"


def summary_lines(result: dict) -> list[str]:
    """What the command prints: the verdict, counts per check, and each failing finding."""
    s = result["summary"]
    lines = [f"audited {result['data']}: {len(result['tasks'])} tasks, {s['records']:,} raw records in {s['seconds']} s"]
    totals: dict[str, int] = {}
    for f in result["findings"]:
        totals[f["check"]] = totals.get(f["check"], 0) + f["count"]
    lines += [f"  {check:<16} {totals.get(check, 0)}" for check in _WHAT]
    lines.append(f"  invalid SMILES   {s['invalid_smiles']}")
    audited = [c for c in result["counts"] if c["audited"]]
    differ = sum(1 for c in audited if c["samples"] != c["paper"])
    if result.get("bundled"):
        lines.append(f"  sample counts: {sum(c['samples'] for c in audited):,} samples in {len(audited)} task "
                     f"splits, as expected: {BUNDLED_COUNTS}")
    else:
        lines.append(f"  sample counts differ from the paper's Table 1 in {differ} of {len(audited)} task splits")
    for f in result["findings"]:
        if f["fails"]:
            lines.append(f"LEAK {f['check']}: {_between(f)}: {f['count']}")
    corpus = result.get("corpus")
    if corpus:
        lines += corpus_lines(corpus)
    failing = s["failing_findings"] + (0 if not corpus or corpus["passed"] else 1)
    lines.append("passed: no leakage" if s["passed"] else f"failed: {failing} finding(s)")
    return lines


def corpus_lines(corpus: dict) -> list[str]:
    """The corpus check in words: what it holds, what it shares with the held-out splits, examples of that."""
    lines = [f"  corpus {corpus['file']}: {corpus['documents']:,} documents, {corpus['molecules']:,} molecules, "
             f"{corpus['names']:,} names; shared with {'/'.join(corpus['held_out'])}: {corpus['shared_molecules']} "
             f"molecules, {corpus['shared_names']} names"]
    if not corpus["passed"]:
        lines.append(f"LEAK corpus: {corpus['shared_molecules'] + corpus['shared_names']} molecule(s) or name(s) of "
                     "the held-out splits are in the corpus")
        lines += [f"    corpus line {e['line']}: {e['corpus']} = {e['held_out']}" for e in corpus["examples"]]
    return lines
