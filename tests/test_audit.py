"""`python -m llasmol.audit`: leaks planted one kind at a time are found (and nothing else), a clean copy and
the bundled sample pass, bad input is one line, and the exit status gates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT, compose_config
from smolinstruct_fixture import MOLECULES, RELATED_TASKS, TASKS, add_record, name_of, split_of, write_smolinstruct

from llasmol.leakage import checks, sample_keys, summary_lines
from llasmol.audit import exit_status, run_audit
from llasmol.core.config import check_overrides
from llasmol.core.errors import UserError
from llasmol.core.tasks import PAPER_TOTALS
from llasmol.core.tasks import TASKS as TASK_TABLE
from llasmol.data.smiles import canonical_kekule

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
    with pytest.raises(UserError, match="is not a folder"):
        audit(tmp_path / "nowhere", tmp_path / "out")
    raw = copy / "raw" / "test" / "property_prediction-esol.jsonl"
    raw.write_text(raw.read_text() + "[1, 2]\n")
    # The rule training applies at start-up: every raw line is an object with input and output.
    with pytest.raises(UserError, match=r"property_prediction-esol.jsonl line 9 is not a JSON object with input "
                                        r"and output \(it is list\): fix the line, or set data.skip_bad_lines=true"):
        audit(copy, tmp_path / "out")
    raw.write_text(raw.read_text() + "{not json\n" + json.dumps({"input": "CCO"}) + "\n")
    skipped = audit(copy, tmp_path / "out", "data.skip_bad_lines=true")
    assert skipped["skipped_lines"]["count"] == 3 and skipped["summary"]["passed"]
    assert [(s["line"], s["why"]) for s in skipped["skipped_lines"]["examples"]] == [
        (9, "is not a JSON object with input and output (it is list)"),
        (10, "is not valid JSON (Expecting property name enclosed in double quotes)"),
        (11, "is not a JSON object with input and output (it is dict)")]
    with pytest.raises(UserError, match="held_out lists 'dev'"):
        audit(copy, tmp_path / "out", "held_out=[dev]")
    with pytest.raises(UserError, match=r"^workers=0 must be an integer >= 1 and <= 1024 or null"):
        audit(copy, tmp_path / "out", "workers=0")
    with pytest.raises(UserError, match=r"^held_outt is not a setting of llasmol.audit: check the spelling"):
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
    missing = run(f"data.path={tmp_path / 'nowhere'}")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"error: data.path={tmp_path / 'nowhere'} is not a folder: "
                                                   "point it at the root of a SMolInstruct copy"]


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
    proc = subprocess.run([sys.executable, "-m", "llasmol.audit", f"hydra.run.dir={blocker / 'run'}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=HANG_TIMEOUT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {blocker} is not a folder, so the run folder {blocker / 'run'} cannot be made there: give the run a "
        "folder with hydra.run.dir=<folder>"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_reaction_in_train_rs_whose_reactants_are_exactly_test_fs_ones_is_found(copy, tmp_path):
    """The other direction: RS train has FS test's reaction backwards, its reactants all of FS test's."""
    add_record(copy, "forward_synthesis", "test", "CCO.CC(=O)O", "CCOC(C)=O")
    add_record(copy, "retrosynthesis", "train", "O=C(OCC)C", "OCC.OC(C)=O")  # the same molecules, spelled otherwise
    result = audit(copy, tmp_path / "out")
    assert ("shared_reaction", "retrosynthesis/train", "forward_synthesis/test", 1, True) in findings(result)
