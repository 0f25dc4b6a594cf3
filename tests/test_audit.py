"""`python -m llasmol.audit`: leaks planted one kind at a time are found (and nothing else), a clean copy and
the bundled sample pass, bad input is one line, and the exit status gates."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import HANG_TIMEOUT, compose_config
from refusals import error_line, refused, refused_cli
from smolinstruct_fixture import MOLECULES, RELATED_TASKS, TASKS, add_record, name_of, split_of, write_smolinstruct

from llasmol.leakage import checks, sample_keys, summary_lines
from llasmol.audit import exit_status, run_audit
from llasmol.audit import main as command
from llasmol.core.config import check_overrides
from llasmol.core.tasks import PAPER_TOTALS
from llasmol.core.tasks import TASKS as TASK_TABLE
from llasmol.core.smiles import canonical_kekule
from llasmol.data.source import SMolInstructSource

ROOT = Path(__file__).resolve().parents[1]
ALL_TASKS = tuple(TASKS) + tuple(RELATED_TASKS)  # 11 tasks: every split group is there
K = 4  # a molecule of the fixture's test split
SALICYLIC = "OC(=O)c1ccccc1O"  # molecule K spelled aromatic; the fixture writes it Kekulé
assert MOLECULES[K] != SALICYLIC and split_of(K) == "test"
assert canonical_kekule(SALICYLIC) == canonical_kekule(MOLECULES[K]) == "O=C(O)C1=CC=CC=C1O"


@pytest.fixture
def copy(tmp_path) -> Path:
    return write_smolinstruct(tmp_path / "smolinstruct", tasks=ALL_TASKS)


def audit(root: Path | None, out: Path, *overrides: str) -> dict:
    data = [f"data.path={root}"] if root is not None else []
    cfg = compose_config([*data, f"paths.output_dir={out}", "workers=1", *overrides], config_name="audit")
    return run_audit(cfg)


def findings(result: dict) -> list[tuple]:
    return [(f["check"], *(f"{s['task']}/{s['split']}" for s in f["between"]), f["count"], f["fails"])
            for f in result["findings"]]


def test_a_clean_copy_passes_and_its_report_is_written(copy, tmp_path):
    result = audit(copy, tmp_path / "out")
    assert result["findings"] == [] and result["invalid_smiles"] == []
    assert result["summary"]["passed"] and exit_status(result) == 0
    assert result["summary"]["records"] == 40 * len(ALL_TASKS)
    counts = {(c["task"], c["split"]): c for c in result["counts"]}
    assert counts[("retrosynthesis", "train")]["samples"] == 24 and counts[("retrosynthesis", "test")]["samples"] == 8
    assert counts[("retrosynthesis", "train")]["paper"] == 941_735
    assert counts[("property_prediction-lipo", "test")] == {  # not in the copy: the paper's count only
        "task": "property_prediction-lipo", "split": "test", "audited": False, "records": None, "samples": None,
        "paper": 420}
    assert json.loads((tmp_path / "out" / "audit.json").read_text()) == result
    assert "  sample counts differ from the paper's Table 1 in 33 of 33 task splits" in summary_lines(result)
    assert summary_lines(result)[-1] == "passed: no leakage"
    markdown = (tmp_path / "out" / "audit.md").read_text()
    assert "bundled data" not in markdown and "**Passed**" in markdown and "| retrosynthesis | 24 / 941,735 | 8 / 2,092 | 8 / 4,156 |" in markdown
    assert ("## Findings\n\nNone.\n\n## Invalid SMILES\n\n"
            "None: every SMILES input and gold parses within the scorer's bounds.\n\n") in markdown
    assert "malformed" not in markdown and "Counts are held-out samples" not in markdown
    assert summary_lines(result)[1:7] == ["  identical_input  0", "  shared_reaction  0", "  shared_molecule  0",
                                          "  shared_name      0", "  duplicate        0", "  invalid SMILES   0"]


def test_a_reaction_in_train_fs_and_test_rs_is_found(copy, tmp_path):
    # FS train: molecule K's reaction with an extra reagent, spelled differently: RS test has it backwards.
    line = add_record(copy, "forward_synthesis", "train", f"{SALICYLIC}.O.CCO", SALICYLIC)
    result = audit(copy, tmp_path / "out")
    assert findings(result) == [("shared_reaction", "forward_synthesis/train", "retrosynthesis/test", 1, True)]
    (train, test), = result["findings"][0]["examples"]
    assert (train["file"], train["line"]) == ("raw/train/forward_synthesis.jsonl", line)
    assert (test["file"], test["line"], test["input"]) == ("raw/test/retrosynthesis.jsonl", 1, "O=C(O)C1=CC=CC=C1O")
    assert exit_status(result) == 1


def test_another_reaction_of_a_test_product_is_not_the_same_reaction(copy, tmp_path):
    # The same product from other reactants: RS test's reactants are not among this input's.
    add_record(copy, "forward_synthesis", "train", "OC(=O)c1ccccc1N.CCO", SALICYLIC)
    assert audit(copy, tmp_path / "out")["findings"] == []


def test_one_molecule_spelled_two_ways_across_mc_and_mg_is_found(copy, tmp_path):
    add_record(copy, "molecule_generation", "train", "A description planted in training.", SALICYLIC)
    result = audit(copy, tmp_path / "out")
    assert findings(result) == [
        ("shared_molecule", "molecule_generation/train", "molecule_captioning/test", 1, True)]


def test_an_input_duplicated_across_splits_is_found(copy, tmp_path):
    add_record(copy, "property_prediction-bbbp", "train", SALICYLIC, "Yes")
    result = audit(copy, tmp_path / "out")
    assert findings(result) == [
        ("identical_input", "property_prediction-bbbp/train", "property_prediction-bbbp/test", 1, True)]


def test_a_name_shared_across_name_conversion_tasks_is_found(copy, tmp_path):
    add_record(copy, "name_conversion-i2f", "train", name_of(K), "C7H6O3")
    result = audit(copy, tmp_path / "out")
    assert findings(result) == [
        ("identical_input", "name_conversion-i2f/train", "name_conversion-i2f/test", 1, True),
        ("shared_name", "name_conversion-i2f/train", "name_conversion-i2s/test", 1, True),
        ("shared_name", "name_conversion-i2f/train", "name_conversion-s2i/test", 1, True),
    ]


def test_a_duplicate_within_a_split_fails_unless_allowed(copy, tmp_path):
    first = (copy / "raw" / "train" / "name_conversion-s2f.jsonl").read_text().splitlines()[2]
    record = json.loads(first)
    line = add_record(copy, "name_conversion-s2f", "train", record["input"], record["output"])
    result = audit(copy, tmp_path / "out")
    assert findings(result) == [("duplicate", "name_conversion-s2f/train", "name_conversion-s2f/train", 1, True)]
    (original, repeat), = result["findings"][0]["examples"]
    assert (original["line"], repeat["line"]) == (3, line)
    assert summary_lines(result)[-1] == "failed: 1 finding(s)"
    relaxed = audit(copy, tmp_path / "relaxed", "fail_on_duplicates=false")
    assert relaxed["summary"]["passed"] and relaxed["summary"]["duplicates"] == 1


def test_a_file_of_two_equal_lines_holds_one_duplicate():
    from array import array

    scan = checks._Audit(None, examples=5)
    side = ("name_conversion-s2f", "train")
    scan.duplicates(side, array("Q", [7, 7]), array("Q", [1, 2]))
    finding = scan.findings[("duplicate", side, side)]
    assert (finding.count, finding.examples) == (1, [(1, 2)])
    scan.duplicates(("forward_synthesis", "train"), array("Q", [7]), array("Q", [1]))  # one line: nothing to find
    assert len(scan.findings) == 1


def test_train_validation_overlap_fails_only_when_validation_is_held_out(copy, tmp_path):
    dev = next(k for k, _ in enumerate(MOLECULES) if split_of(k) == "dev")
    add_record(copy, "property_prediction-esol", "train", MOLECULES[dev], "-1.00")
    strict = audit(copy, tmp_path / "strict")
    assert findings(strict) == [("identical_input", "property_prediction-esol/train",
                                 "property_prediction-esol/validation", 1, True)]
    test_only = audit(copy, tmp_path / "test_only", "held_out=[test]")
    assert findings(test_only)[0][-1] is False and test_only["summary"]["passed"]


def test_invalid_and_oversized_smiles_are_counted_not_fatal(copy, tmp_path):
    unclosed = add_record(copy, "name_conversion-s2f", "train", "C1CC", "C3H6")
    add_record(copy, "name_conversion-s2f", "train", "C" * 301, "C301H604")
    add_record(copy, "retrosynthesis", "dev", "CCCCCCCCO", "CC(=O)O.[H]C(")
    result = audit(copy, tmp_path / "out")
    invalid = {(e["task"], e["split"], e["field"], e["problem"]): e["count"] for e in result["invalid_smiles"]}
    assert invalid == {("name_conversion-s2f", "train", "input", "invalid"): 1,
                       ("name_conversion-s2f", "train", "input", "too_complex"): 1,
                       ("retrosynthesis", "validation", "gold", "invalid"): 1}
    first = next(e for e in result["invalid_smiles"] if e["problem"] == "invalid" and e["field"] == "input")
    assert first["examples"][0]["line"] == unclosed
    assert result["summary"]["passed"]  # reported, but not leakage


def test_worker_processes_find_the_same(copy, tmp_path, monkeypatch):
    add_record(copy, "forward_synthesis", "train", f"{SALICYLIC}.O.CCO", SALICYLIC)
    add_record(copy, "property_prediction-bbbp", "train", SALICYLIC, "Yes")
    one = audit(copy, tmp_path / "one")
    monkeypatch.setattr(checks, "_POOL_BYTES", 0)  # every file through the pool,
    monkeypatch.setattr(sample_keys, "_CHUNK", 3)  # in many chunks, more than the workers take at once
    two = audit(copy, tmp_path / "two", "workers=2")
    assert two["summary"]["workers"] == 2
    strip = lambda r: {k: v for k, v in r.items() if k != "summary"}  # noqa: E731
    assert strip(two) == strip(one) and len(one["findings"]) == 2


def test_bad_input_is_one_line(copy, tmp_path):
    with refused(f"data.path={tmp_path / 'nowhere'}", "not a folder"):
        audit(tmp_path / "nowhere", tmp_path / "out")
    raw = copy / "raw" / "test" / "property_prediction-esol.jsonl"
    raw.write_text(raw.read_text() + "[1, 2]\n")
    # The rule training applies at start-up: every raw line is an object with input and output.
    with refused("property_prediction-esol.jsonl line 9", "it is list", "data.skip_bad_lines=true"):
        audit(copy, tmp_path / "out")
    raw.write_text(raw.read_text() + "{not json\n" + json.dumps({"input": "CCO"}) + "\n")
    skipped = audit(copy, tmp_path / "out", "data.skip_bad_lines=true")
    assert skipped["skipped_lines"]["count"] == 3 and skipped["summary"]["passed"]
    assert [(s["line"], s["why"]) for s in skipped["skipped_lines"]["examples"]] == [
        (9, "is not a JSON object with input and output (it is list)"),
        (10, "is not valid JSON (Expecting property name enclosed in double quotes)"),
        (11, "is not a JSON object with input and output (it is dict)")]
    with refused("held_out", "'dev'"):
        audit(copy, tmp_path / "out", "held_out=[dev]")
    with refused("workers=0"):
        audit(copy, tmp_path / "out", "workers=0")
    with refused("held_outt", "llasmol.audit"):
        check_overrides("audit", ["held_outt=[test]"])  # what the command checks before Hydra starts


def test_the_bundled_sample_passes_its_own_audit(tmp_path):
    result = audit(None, tmp_path / "out")
    assert result["data"].endswith("llasmol/data/bundled")
    assert result["findings"] == [] and result["invalid_smiles"] == [] and result["summary"]["passed"]
    assert result["summary"]["records"] == 11 * 360
    # Its counts are an excerpt's by design: said as such, not as 33 differences from the paper.
    said = [line for line in summary_lines(result) if "sample counts" in line]
    assert said == ["  sample counts: 3,960 samples in 33 task splits, as expected: the bundled data is a small "
                    "excerpt (a few hundred samples a task, 11 of the 14 tasks: llasmol/data/bundled/PROVENANCE.md), "
                    "not the full SMolInstruct of Table 1"]
    assert "the bundled data is a small excerpt" in (tmp_path / "out" / "audit.md").read_text()


def test_table_1_rows_add_up_to_its_overall_row():
    assert tuple(sum(t.paper_counts[i] for t in TASK_TABLE) for i in range(3)) == PAPER_TOTALS


@pytest.mark.slow
def test_the_command_exits_1_on_leakage_and_2_on_bad_input(copy, tmp_path):
    add_record(copy, "forward_synthesis", "train", f"{SALICYLIC}.O.CCO", SALICYLIC)
    add_record(copy, "name_conversion-s2f", "train", "C1CC", "C3H6")  # RDKit would complain about it
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *args: subprocess.run([sys.executable, "-m", "llasmol.audit", *args], capture_output=True,  # noqa: E731
                                       text=True, cwd=tmp_path, env=env, timeout=HANG_TIMEOUT)
    leak = run(f"data.path={copy}", f"hydra.run.dir={tmp_path / 'run'}")
    assert leak.returncode == 1, leak.stderr[-2000:]
    assert "LEAK shared_reaction: forward_synthesis / train ↔ retrosynthesis / test: 1" in leak.stdout
    assert "SMILES Parse Error" not in leak.stdout + leak.stderr  # RDKit's log is silenced
    assert (tmp_path / "run" / "audit.md").is_file()
    error_line(run(f"data.path={tmp_path / 'nowhere'}"), f"data.path={tmp_path / 'nowhere'}", "SMolInstruct")


@pytest.mark.parametrize("cpus,expected", [(64, 8), (3, 3)])
def test_workers_null_is_one_per_cpu_up_to_eight(copy, tmp_path, monkeypatch, cpus, expected):
    """Each worker holds its own RDKit and key cache (about 120 MB), so one per CPU stops at 8."""
    monkeypatch.setattr(checks, "usable_cores", lambda: cpus)
    assert audit(copy, tmp_path / "out", "workers=null")["summary"]["workers"] == expected


def test_a_reaction_whose_reactants_are_exactly_the_other_sides_is_found(copy, tmp_path):
    """RS test's reactants (K and water) are all of FS train's, none more: still the same reaction."""
    add_record(copy, "forward_synthesis", "train", f"{SALICYLIC}.O", SALICYLIC)
    result = audit(copy, tmp_path / "out")
    assert ("shared_reaction", "forward_synthesis/train", "retrosynthesis/test", 1, True) in findings(result)


def test_the_command_refuses_a_run_folder_it_cannot_make_before_hydra_starts(tmp_path):
    """A run folder under a regular file cannot be made (even by root): one line, exit 2, nothing written."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder\n")
    refused_cli(["llasmol.audit", f"hydra.run.dir={blocker / 'run'}"], tmp_path, f"{blocker} is not a folder",
                blocker / "run", "hydra.run.dir=", untouched=tmp_path, env={"PYTHONPATH": str(ROOT)})


def test_a_reaction_in_train_rs_whose_reactants_are_exactly_test_fs_ones_is_found(copy, tmp_path):
    """The other direction: RS train has FS test's reaction backwards, its reactants all of FS test's."""
    add_record(copy, "forward_synthesis", "test", "CCO.CC(=O)O", "CCOC(C)=O")
    add_record(copy, "retrosynthesis", "train", "O=C(OCC)C", "OCC.OC(C)=O")  # the same molecules, spelled otherwise
    result = audit(copy, tmp_path / "out")
    assert ("shared_reaction", "retrosynthesis/train", "forward_synthesis/test", 1, True) in findings(result)


# -- what the user reads: the console summary and audit.md, every finding kind at once --------------------


class _Clock:
    """`time` for llasmol.leakage.checks: the audit starts at 1000.0 s and every later reading is 1001.5 s, so
    the audit takes 1.5 s and each file 0.0 s, whatever the machine's load."""

    def __init__(self) -> None:
        self.readings = 0

    def perf_counter(self) -> float:
        self.readings += 1
        return 1000.0 if self.readings == 1 else 1001.5


def test_the_summary_and_report_say_each_finding_with_its_examples(copy, tmp_path, monkeypatch, caplog):
    """One copy with a leak of every shape `_between` writes (one task across splits, two tasks, one split), a
    non-failing overlap (train/validation with held_out=[test]) and two findings of one check."""
    reaction = add_record(copy, "forward_synthesis", "train", f"{SALICYLIC}.O.CCO", SALICYLIC)
    add_record(copy, "property_prediction-bbbp", "train", SALICYLIC, "Yes")
    dev = next(k for k, _ in enumerate(MOLECULES) if split_of(k) == "dev")
    add_record(copy, "property_prediction-esol", "train", MOLECULES[dev], "-1.00")
    # s2f's third training line is benzene (molecule 2), Kekulé in the archive: repeated word for word.
    repeat = add_record(copy, "name_conversion-s2f", "train", "C1=CC=CC=C1", "C6H6")
    monkeypatch.setattr(checks, "time", _Clock())
    with caplog.at_level("DEBUG", logger="llasmol.leakage.checks"):
        result = audit(copy, tmp_path / "out", "held_out=[test]")
    assert findings(result) == [
        ("identical_input", "property_prediction-bbbp/train", "property_prediction-bbbp/test", 1, True),
        ("identical_input", "property_prediction-esol/train", "property_prediction-esol/validation", 1, False),
        ("shared_reaction", "forward_synthesis/train", "retrosynthesis/test", 1, True),
        ("duplicate", "name_conversion-s2f/train", "name_conversion-s2f/train", 1, True),
    ]
    summary = result["summary"]
    # Leaked samples: the failing cross-split findings only (not the validation overlap, not the duplicate).
    assert (summary["leaked_samples"], summary["duplicates"], summary["failing_findings"]) == (2, 1, 3)
    assert (summary["records"], summary["seconds"], summary["passed"]) == (40 * 11 + 4, 1.5, False)
    assert summary_lines(result) == [
        f"audited {copy}: 11 tasks, 444 raw records in 1.5 s",
        "  identical_input  2",
        "  shared_reaction  1",
        "  shared_molecule  0",
        "  shared_name      0",
        "  duplicate        1",
        "  invalid SMILES   0",
        "  sample counts differ from the paper's Table 1 in 33 of 33 task splits",
        "LEAK identical_input: property_prediction-bbbp: train ↔ test: 1",
        "LEAK shared_reaction: forward_synthesis / train ↔ retrosynthesis / test: 1",
        "LEAK duplicate: name_conversion-s2f / train: 1",
        "failed: 3 finding(s)",
    ]
    markdown = (tmp_path / "out" / "audit.md").read_text()
    assert ("**Failed**: 3 finding(s) break the split rules. 444 raw records of 11 tasks, splits train (`raw/train`), "
            "validation (`raw/dev`), test (`raw/test`), read in 1.5 s. Held out (an overlap with these fails): test."
            ) in markdown
    assert "\n".join([
        "| check | between | count | fails | what |",
        "|---|---|---|---|---|",
        "| identical_input | property_prediction-bbbp: train ↔ test | 1 | yes | the same input in two splits of a task |",
        "| identical_input | property_prediction-esol: train ↔ validation | 1 | no | the same input in two splits of a task |",
        "| shared_reaction | forward_synthesis / train ↔ retrosynthesis / test | 1 | yes | one reaction in two splits of FS and RS |",
        "| duplicate | name_conversion-s2f / train | 1 | yes | the same input and output twice in one split |",
    ]) in markdown
    assert ("- shared_reaction, forward_synthesis / train ↔ retrosynthesis / test:\n"
            f"  - `raw/train/forward_synthesis.jsonl:{reaction}` {SALICYLIC}.O.CCO → {SALICYLIC}\n"
            "    `raw/test/retrosynthesis.jsonl:1` O=C(O)C1=CC=CC=C1O → O=C(O)C1=CC=CC=C1O.O\n") in markdown
    assert ("- duplicate, name_conversion-s2f / train:\n"
            "  - `raw/train/name_conversion-s2f.jsonl:3` C1=CC=CC=C1 → C6H6\n"
            f"    `raw/train/name_conversion-s2f.jsonl:{repeat}` C1=CC=CC=C1 → C6H6\n"
            "\n## Invalid SMILES\n\nNone: every SMILES input and gold parses within the scorer's bounds.\n\n"
            "## Samples against the paper's Table 1\n") in markdown
    assert "malformed" not in markdown  # no line was skipped: no sentence about skipped lines
    # Each file's progress line: at DEBUG for a file read in under 5 s (here 0.0 s).
    progress = [r for r in caplog.records if r.getMessage().startswith("audit: raw/")]
    assert len(progress) == 33 and {r.levelno for r in progress} == {logging.DEBUG}
    assert "audit: raw/test/retrosynthesis.jsonl: 8 records in 0.0 s" in [r.getMessage() for r in progress]



def test_examples_stop_at_the_number_asked_and_long_values_are_cut_at_160_characters(copy, tmp_path):
    """Two or more of each kind of thing shown by example, with `examples=1`, the default (3) and 0."""
    test_molecules = [k for k, _ in enumerate(MOLECULES) if split_of(k) == "test"][:4]
    leaks = [add_record(copy, "property_prediction-bbbp", "train", MOLECULES[k], "Yes") for k in test_molecules]
    unreadable = [add_record(copy, "name_conversion-s2f", "train", smiles, "C3H6") for smiles in ("C1CC", "C1CCC")]
    # SIDER's first training record (molecule 0) twice more, its targets in the other order: the same sample.
    first = json.loads((copy / "raw" / "train" / "property_prediction-sider.jsonl").read_text().splitlines()[0])
    assert list(first["output"]) == ["Hepatobiliary disorders", "Eye disorders"]
    repeats = [add_record(copy, "property_prediction-sider", "train", "CCO",
                          {"Eye disorders": "Yes", "Hepatobiliary disorders": "No"}) for _ in range(2)]
    at_limit, past_limit = "C1" + "C" * 158, "C1" + "C" * 159  # 160 and 161 characters, both unclosed rings
    add_record(copy, "retrosynthesis", "dev", at_limit, "CCO")
    add_record(copy, "forward_synthesis", "dev", "CCO.O", past_limit)
    esol = copy / "raw" / "test" / "property_prediction-esol.jsonl"
    esol.write_text(esol.read_text() + "[1, 2]\n{not json\n")  # lines 9 and 10

    one = audit(copy, tmp_path / "one", "examples=1", "data.skip_bad_lines=true")
    by_check = {f["check"]: f for f in one["findings"]}
    assert sorted(by_check) == ["duplicate", "identical_input"]
    leak = by_check["identical_input"]
    assert (leak["count"], [[x["line"], y["line"]] for x, y in leak["examples"]]) == (4, [[leaks[0], 1]])
    dup = by_check["duplicate"]
    assert (dup["count"], [[x["line"], y["line"]] for x, y in dup["examples"]]) == (2, [[1, repeats[0]]])
    # A raw output that is not a string (SIDER's targets) is shown as text.
    assert [x["output"] for x in dup["examples"][0]] == [
        "{'Hepatobiliary disorders': 'No', 'Eye disorders': 'Yes'}",
        "{'Eye disorders': 'Yes', 'Hepatobiliary disorders': 'No'}"]
    invalid = {(e["task"], e["split"], e["field"]): e for e in one["invalid_smiles"]}
    assert invalid[("name_conversion-s2f", "train", "input")]["count"] == 2
    assert [x["line"] for x in invalid[("name_conversion-s2f", "train", "input")]["examples"]] == unreadable[:1]
    assert invalid[("retrosynthesis", "validation", "input")]["examples"][0]["input"] == at_limit  # 160: whole
    cut = invalid[("forward_synthesis", "validation", "gold")]["examples"][0]["output"]
    assert cut == "C1" + "C" * 157 + "…" and len(cut) == 160  # 161: its first 159 characters and an ellipsis
    assert one["skipped_lines"]["count"] == 2 and [s["line"] for s in one["skipped_lines"]["examples"]] == [9]
    skipped = ("\n2 malformed raw line(s) skipped (data.skip_bad_lines), e.g. `raw/test/property_prediction-esol.jsonl:9` "
               "(is not a JSON object with input and output (it is list)).\n")
    assert skipped in (tmp_path / "one" / "audit.md").read_text()

    # The defaults of `audit`: 3 examples, both held-out splits, duplicates fail, one process.
    default = checks.audit(SMolInstructSource(path=str(copy), skip_bad_lines=True))
    by_check = {f["check"]: f for f in default["findings"]}
    assert [[x["line"], y["line"]] for x, y in by_check["identical_input"]["examples"]] == [
        [leaks[0], 1], [leaks[1], 2], [leaks[2], 3]]
    assert len(by_check["duplicate"]["examples"]) == 2 and by_check["duplicate"]["fails"] is True
    assert [s["line"] for s in default["skipped_lines"]["examples"]] == [9, 10]
    assert default["held_out"] == ["validation", "test"] and default["summary"]["workers"] == 1
    with refused("workers=0", "null"):
        checks.audit(SMolInstructSource(path=str(copy)), workers=0)

    # No examples at all: the report says so where it would show the first one.
    audit(copy, tmp_path / "none", "examples=0", "data.skip_bad_lines=true")
    markdown = (tmp_path / "none" / "audit.md").read_text()
    assert "| name_conversion-s2f | train | input | invalid | 2 | (line not found) |" in markdown


def test_overlaps_within_one_split_or_one_task_are_not_leaks_and_validation_can_be_held_out_alone(copy, tmp_path):
    # FS training holds the reverse of an FS test reaction: one task, so not a shared reaction.
    add_record(copy, "forward_synthesis", "train", SALICYLIC, f"{SALICYLIC}.O")
    # A reaction whose SMILES do not parse on one side is counted as invalid, never matched.
    add_record(copy, "retrosynthesis", "test", "CCCCCCCCO", "CC(=O)O.[H]C(")
    add_record(copy, "forward_synthesis", "train", "CC(=O)O.[H]C(", "CCCCCCCCO")
    # Molecule K's input twice in the test split (another answer, so no duplicate): one split, no leak.
    add_record(copy, "property_prediction-bbbp", "test", SALICYLIC, "Yes")
    # The only leak: a validation input in the test split, failing because validation is held out.
    dev = next(k for k, _ in enumerate(MOLECULES) if split_of(k) == "dev")
    add_record(copy, "property_prediction-esol", "test", MOLECULES[dev], "-2.00")
    result = audit(copy, tmp_path / "out", "held_out=[validation]")
    assert findings(result) == [
        ("identical_input", "property_prediction-esol/validation", "property_prediction-esol/test", 1, True)]
    assert {(e["task"], e["split"], e["field"], e["problem"]) for e in result["invalid_smiles"]} == {
        ("retrosynthesis", "test", "gold", "invalid"), ("forward_synthesis", "train", "input", "invalid")}


@pytest.fixture
def esol_copy(tmp_path) -> Path:
    """A copy of one task (ESOL: 24 train, 8 validation, 8 test records)."""
    return write_smolinstruct(tmp_path / "esol", tasks=("property_prediction-esol",))


def _pad_to(path: Path, size: int, smiles: str) -> None:
    """Append one record to `path`, padded with an extra field so that the file is exactly `size` bytes."""
    text = path.read_text()
    bare = len((text + json.dumps({"input": smiles, "output": "-1.00", "pad": ""}) + "\n").encode())
    path.write_text(text + json.dumps({"input": smiles, "output": "-1.00", "pad": "x" * (size - bare)}) + "\n")
    assert path.stat().st_size == size


def test_worker_processes_key_only_files_over_4_mib_and_are_started_once_and_shut_down(esol_copy, tmp_path,
                                                                                        monkeypatch):
    """Starting the workers costs more than it saves on small files: only a file over 4 MiB (4,194,304 bytes)
    goes to them, only with workers > 1; one pool serves every such file and is shut down at the end."""
    raw = esol_copy / "raw"
    _pad_to(raw / "dev" / "property_prediction-esol.jsonl", 4 << 20, "CCCCCCCCCO")  # exactly 4 MiB: in-process
    _pad_to(raw / "test" / "property_prediction-esol.jsonl", (4 << 20) + 1, "CCCCCCCCCCO")
    _pad_to(raw / "train" / "property_prediction-esol.jsonl", (4 << 20) + 1, "CCCCCCCCCCCO")
    pools = []

    def keyed_in_process(records, kinds, pool, workers):  # records which pool each file got; keys here
        pools.append(pool)
        return sample_keys.keyed_records(records, kinds, None, workers)

    monkeypatch.setattr(checks, "keyed_records", keyed_in_process)
    result = audit(esol_copy, tmp_path / "two", "workers=2")  # validation, test, then train
    assert result["summary"]["passed"] and result["summary"]["records"] == 43
    assert pools[0] is None and isinstance(pools[1], ProcessPoolExecutor) and pools[2] is pools[1]
    with pytest.raises(RuntimeError, match="after shutdown"):
        pools[1].submit(int)
    pools.clear()
    audit(esol_copy, tmp_path / "one", "workers=1")
    assert pools == [None, None, None]


def test_a_file_slower_than_5_s_says_its_progress_at_info(esol_copy, monkeypatch, caplog):
    readings = iter([100.0, 105.0, 100.0, 105.5])  # (start, end) of each file: 5.0 s, then 5.5 s
    monkeypatch.setattr(checks, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    run = checks._Audit(SMolInstructSource(path=str(esol_copy)), examples=3)
    with caplog.at_level("DEBUG", logger="llasmol.leakage.checks"):
        run.scan("property_prediction-esol", "test", (sample_keys.SMILES, sample_keys.TEXT))
        run.scan("property_prediction-esol", "validation", (sample_keys.SMILES, sample_keys.TEXT))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "audit: raw/test/property_prediction-esol.jsonl: 8 records in 5.0 s"),
        (logging.INFO, "audit: raw/dev/property_prediction-esol.jsonl: 8 records in 5.5 s")]
    assert run.records == {("property_prediction-esol", "test"): 8, ("property_prediction-esol", "validation"): 8}


def test_two_splits_read_from_one_raw_folder_are_refused(tmp_path):
    with refused("data.splits", "validation", "raw/test"):
        audit(None, tmp_path / "out", "data.splits.validation=test")


def test_a_raw_file_outside_the_copy_is_named_by_its_full_path(tmp_path):
    run = checks._Audit(SMolInstructSource(path=str(tmp_path / "copy")), examples=3)
    assert run._rel(tmp_path / "copy" / "raw" / "test" / "x.jsonl") == "raw/test/x.jsonl"
    assert run._rel(tmp_path / "elsewhere" / "x.jsonl") == str(tmp_path / "elsewhere" / "x.jsonl")


def test_the_command_prints_the_summary_and_exits_1_on_leakage_0_without(esol_copy, tmp_path, capsys):
    """The command's body in this process (Hydra hands a composed config straight through)."""
    cfg = lambda run: compose_config([f"data.path={esol_copy}", f"paths.output_dir={tmp_path / run}",  # noqa: E731
                                      "workers=1"], config_name="audit")
    command(cfg("clean"))  # passed: returns, no exit
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-2:] == ["passed: no leakage",
                            f"report written to {tmp_path / 'clean' / 'audit.md'} (and audit.json)"]
    add_record(esol_copy, "property_prediction-esol", "train", "CCO", "-0.75")  # training line 1 again
    with pytest.raises(SystemExit) as stopped:
        command(cfg("leak"))
    assert stopped.value.code == 1
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0].startswith(f"audited {esol_copy}: 1 tasks, 41 raw records in ")
    assert printed[-3:] == ["LEAK duplicate: property_prediction-esol / train: 1", "failed: 1 finding(s)",
                            f"report written to {tmp_path / 'leak' / 'audit.md'} (and audit.json)"]



def test_python_m_llasmol_audit_runs_the_audit_and_exits_1_on_leakage(esol_copy, tmp_path):
    """`python -m llasmol.audit` past its command-line check (one small task: about a second)."""
    add_record(esol_copy, "property_prediction-esol", "train", "CCO", "-0.75")  # training line 1 again
    proc = subprocess.run([sys.executable, "-m", "llasmol.audit", f"data.path={esol_copy}",
                           f"hydra.run.dir={tmp_path / 'run'}", "workers=1"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=HANG_TIMEOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-3:] == [
        "LEAK duplicate: property_prediction-esol / train: 1", "failed: 1 finding(s)",
        f"report written to {tmp_path / 'run' / 'audit.md'} (and audit.json)"]
    assert json.loads((tmp_path / "run" / "audit.json").read_text())["summary"]["duplicates"] == 1

# -- sample keys: what counts as the same field, and how worker processes are fed ------------------------------


def test_a_smiles_field_is_its_set_of_molecules_and_an_unreadable_one_its_spelling():
    smiles, field = sample_keys.smiles_field, sample_keys.field
    # Fragment order, white space around parts, repeated fragments and spelling do not matter; the set does.
    assert smiles("OCC.O").key == smiles(" O . C(O)C ").key == smiles("CCO.O.O").key != smiles("CCO").key
    assert smiles("OCC.O").parts == smiles("CCO").parts | smiles("O").parts and len(smiles("OCC.O").parts) == 2
    assert smiles("OCC.O").problem is None
    # A part RDKit cannot read, an empty part, or one past the scorer's bounds: keyed by the spelling.
    for text, problem in (("C1CC", "invalid"), ("CCO..O", "invalid"), ("C" * 301, "too_complex")):
        got = smiles(text)
        assert (got.key, got.parts, got.problem) == (sample_keys.text_field(text).key, None, problem)
    assert smiles("C1CC").key != smiles("C1CCC").key
    # Other text by its words (white space collapsed, case kept); a dict (SIDER's targets) in any key order.
    assert field("a  b\tc ", sample_keys.TEXT).key == field("a b c", sample_keys.TEXT).key
    assert field("A b c", sample_keys.TEXT).key != field("a b c", sample_keys.TEXT).key
    assert field({"x": "Yes", "y": "No"}, sample_keys.TEXT).key == field({"y": "No", "x": "Yes"}, sample_keys.TEXT).key
    assert field({"x": "Yes", "y": "No"}, sample_keys.TEXT).key != field({"x": "No", "y": "Yes"}, sample_keys.TEXT).key
    # The kind decides: as SMILES two spellings of ethanol are one, as text two.
    assert field("OCC", sample_keys.SMILES).key == field("CCO", sample_keys.SMILES).key
    assert field("OCC", sample_keys.TEXT).key != field("CCO", sample_keys.TEXT).key
    assert [sample_keys.kind_of_tag(t) for t in ("<SMILES>", "<IUPAC>", "<MOLFORMULA>", "", None)] == [
        "smiles", "name", "text", "text", "text"]
    # A sample is its (input, output) in that order.
    a, b = field("CCO", sample_keys.SMILES), field("ethanol", sample_keys.TEXT)
    same_a, same_b = field("OCC", sample_keys.SMILES), field("ethanol", sample_keys.TEXT)  # built anew, a spelled apart
    assert sample_keys.pair_key(a, b) == sample_keys.pair_key(same_a, same_b) != sample_keys.pair_key(b, a)


def test_a_semicolon_in_a_smiles_field_separates_molecules_as_the_scorer_reads_it():
    """A raw SMILES field with ';' (the scorer reads it as '.') stopped the whole audit with a ValueError."""
    assert sample_keys.smiles_field("CCO;O") == sample_keys.smiles_field("CCO.O")
    assert sample_keys.smiles_field("[Na+];[Cl-]").problem is None

def test_workers_get_chunks_of_500_records_and_at_most_two_chunks_per_worker_wait():
    """A stand-in pool that runs each chunk at once and records the order of submissions, results taken and
    records handed on: 2,501 records, 2 workers."""
    events: list = []

    class Done:
        def __init__(self, value):
            self.value = value

        def result(self):
            events.append("result")
            return self.value

    class Pool:
        def submit(self, fn, values, kinds):
            events.append(("submit", len(values)))
            return Done(fn(values, kinds))

    records = [(n, {"input": "CCO" if n % 2 else "OCC", "output": f"answer {n}"}) for n in range(1, 2502)]
    kinds = (sample_keys.SMILES, sample_keys.TEXT)
    keyed = []
    for item in sample_keys.keyed_records(iter(records), kinds, Pool(), workers=2):
        events.append("record")
        keyed.append(item)
    # Four chunks waiting (two per worker): the oldest is handed on before the next is submitted; the last,
    # short chunk is submitted when the file ends, then the rest are handed on, oldest first.
    chunk = ["result"] + ["record"] * 500
    assert events == ([("submit", 500)] * 4 + chunk + [("submit", 500)] + chunk + [("submit", 1)]
                      + chunk * 3 + ["result", "record"])
    # The same keys, in file order, as keyed in this process.
    assert keyed == list(sample_keys.keyed_records(iter(records), kinds, None, workers=2))
    assert [line for line, _, _ in keyed] == list(range(1, 2502)) and keyed[0][1].key == keyed[1][1].key
