"""Intervals beside a run's metrics and paired comparisons between runs, on hand-made run directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from llasmol.analysis import load_run
from llasmol.analysis.pairs import ablation_intervals, basis, interval_table, intervals_of, paired_table
from llasmol.core.files import write_json, write_jsonl
from llasmol.metrics.scoring import score_records

BBBP, S2F = "property_prediction-bbbp", "name_conversion-s2f"


def records(right_bbbp: list[bool], right_s2f: list[bool]) -> list[dict]:
    out = []
    for i, ok in enumerate(right_bbbp):
        out.append({"task": BBBP, "index": i, "input": f"b{i}", "gold": ["Yes"],
                    "predictions": ["<BOOLEAN> Yes </BOOLEAN>" if ok else "<BOOLEAN> No </BOOLEAN>"]})
    for i, ok in enumerate(right_s2f, len(out)):
        out.append({"task": S2F, "index": i, "input": f"f{i}", "gold": ["C2H6O"],
                    "predictions": ["<MOLFORMULA> C2H6O </MOLFORMULA>" if ok else "<MOLFORMULA> CH4 </MOLFORMULA>"]})
    return out


def write_run(path: Path, recs: list[dict], lora: str, test: list[dict] | None = None) -> Path:
    write_json(path / "params.json", {"model": "tiny", "lora": lora, "trainable": 10, "total": 100, "percent": 10})
    write_jsonl(path / "predictions" / "val-step4.jsonl", recs)
    write_json(path / "metrics" / "val-step4.json", score_records(recs))
    if test is not None:
        write_jsonl(path / "predictions" / "test.jsonl", test)
        write_json(path / "metrics" / "test.json", score_records(test))
    return path


@pytest.fixture
def two_runs(tmp_path):
    strong = records([i % 10 != 0 for i in range(120)], [i % 2 == 0 for i in range(40)])  # 90% and 50%
    weak = records([i % 10 < 6 for i in range(120)], [i % 2 == 0 for i in range(40)])  # 60% and the same 50%
    return (load_run(write_run(tmp_path / "0_tiny_full", strong, "full")),
            load_run(write_run(tmp_path / "1_tiny_lite", weak, "lite")))


def test_a_clear_gap_excludes_zero_and_an_equal_task_does_not(two_runs):
    table = paired_table(list(two_runs), ["full", "lite"])
    bbbp, s2f = table.row("full"), [r for r in table.records() if r["task"] == S2F][0]
    assert (bbbp["task"], bbbp["on"], bbbp["samples"]) == (BBBP, "val-step4", 120)
    assert bbbp["difference"] == pytest.approx(0.3) and bbbp["excludes_zero"] == "yes"
    assert bbbp["lo"] > 0.15 and bbbp["hi"] < 0.45
    assert s2f["difference"] == 0.0 and s2f["excludes_zero"] == "no" and (s2f["lo"], s2f["hi"]) == (0.0, 0.0)


def test_a_run_paired_with_itself_is_exactly_zero(two_runs):
    table = paired_table([two_runs[0], two_runs[0]], ["a", "b"])
    assert {r["difference"] for r in table.records()} == {0.0}
    assert {(r["lo"], r["hi"], r["excludes_zero"]) for r in table.records()} == {(0.0, 0.0, "no")}


def test_the_test_split_is_the_basis_when_both_have_it(tmp_path, two_runs):
    test = records([True] * 30, [True] * 10)
    a = load_run(write_run(tmp_path / "a", records([True], [True]), "full", test=test))
    b = load_run(write_run(tmp_path / "b", records([False], [True]), "lite", test=records([False] * 30, [True] * 10)))
    assert basis(a)[0] == "test"
    rows = paired_table([a, b], ["a", "b"]).records()
    assert {r["on"] for r in rows} == {"test"} and rows[0]["samples"] == 30 and rows[0]["difference"] == 1.0
    # One evaluated on the test split, the other not: their validations are compared instead.
    rows = paired_table([a, two_runs[1]], ["a", "lite"]).records()
    assert {r["on"] for r in rows} == {"val-step4"}


def test_intervals_are_read_beside_the_metrics_or_computed_for_older_runs(two_runs):
    run = two_runs[0]
    val = run.latest
    computed = intervals_of(val.metrics_path, val.predictions())
    lo, hi = computed[BBBP]["accuracy"]
    assert lo < 0.9 < hi
    table = interval_table(val)
    assert table.records()[0] == {"task": BBBP, "metric": "accuracy", "value": 0.9, "lo": lo, "hi": hi}
    write_json(val.metrics_path.with_name("val-step4.intervals.json"),
               {"level": 0.95, "resamples": 5, "seed": 0, "tasks": {BBBP: {"accuracy": [0.1, 0.2]}}})
    assert intervals_of(val.metrics_path, val.predictions()) == {BBBP: {"accuracy": [0.1, 0.2]}}
    bars = ablation_intervals(list(two_runs), ["full", "lite"])
    assert bars[f"{BBBP}/accuracy"]["full"] == [0.1, 0.2]
    assert set(bars[f"{S2F}/exact_match"]) == {"lite"}  # full's file, written by hand above, has no S2F
    # A damaged intervals file (cut short by a kill, edited by hand) is as good as none: computed again.
    val.metrics_path.with_name("val-step4.intervals.json").write_text('{"level": 0.95, "tas')
    assert intervals_of(val.metrics_path, val.predictions()) == computed
    assert interval_table(val).title.startswith("95% bootstrap intervals")


def test_the_ablation_chart_draws_the_intervals(two_runs, tmp_path):
    from matplotlib.container import ErrorbarContainer

    from llasmol.analysis import ablation_data
    from llasmol.analysis.plots import plot_ablation

    runs, labels = list(two_runs), ["0_tiny_full", "1_tiny_lite"]
    data = ablation_data(runs)
    fig = plot_ablation(data, tmp_path / "a.png", intervals=ablation_intervals(runs, list(data["val/loss"])))
    bars = [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one per variant in the fraction panel
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert labels  # the labels the chart uses are ablation_data's


def test_the_interval_table_names_the_level_its_file_was_computed_at(two_runs, tmp_path):
    from llasmol.inference.pipeline import Evaluation, RunFiles
    from llasmol.report import main as report_main

    run = two_runs[0]
    val = run.latest
    assert interval_table(val).title == "95% bootstrap intervals at val-step4"  # computed now, at 95%
    settings = {"level": 0.9, "resamples": 200, "seed": 0}
    Evaluation(RunFiles(None, val.metrics_path), settings).score(val.predictions())  # as `intervals.level=0.9` writes it
    assert interval_table(val).title == "90% bootstrap intervals at val-step4"
    report_main([str(run.path)])
    assert "90% bootstrap intervals at val-step4" in (run.path / "report" / "intervals.md").read_text()


def test_a_run_without_a_validation_or_a_test_split_is_compared_on_nothing(tmp_path):
    from llasmol.analysis.runs import Run

    assert basis(Run(path=tmp_path / "0_tiny_lite", params={}, validations=[])) == ("-", [])


def test_the_defaults_are_a_thousand_resamples_seed_zero_and_95_percent(two_runs):
    """The report's notes promise 1,000 resamples and 95% intervals: the defaults of every entry point."""
    from llasmol.metrics.intervals import bootstrap_intervals, per_sample_statistics

    val = two_runs[0].latest
    assert intervals_of(val.metrics_path, val.predictions()) == bootstrap_intervals(
        per_sample_statistics(val.predictions()), 1000, 0, 0.95)
    runs, labels = list(two_runs), ["full", "lite"]
    table = paired_table(runs, labels)
    assert table.rows == paired_table(runs, labels, resamples=1000, seed=0, level=0.95).rows
    assert table.rows != paired_table(runs, labels, seed=1).rows  # the seed shows in the bounds
    assert table.title == "Paired differences (A - B) with 95% bootstrap intervals"


def test_what_a_run_is_compared_on_when_files_are_missing_or_empty(tmp_path, two_runs):
    # A validation whose predictions were not kept: nothing to pair, though the validation is there.
    run = load_run(write_run(tmp_path / "r", records([True], [True]), "full"))
    (run.path / "predictions" / "val-step4.jsonl").unlink()
    assert basis(load_run(run.path)) == ("-", [])
    # An empty test split file: the test split, with no records (not an error).
    (run.path / "predictions" / "test.jsonl").write_text("")
    assert basis(load_run(run.path)) == ("test", [])
    # No intervals file and no records: no intervals.
    assert intervals_of(tmp_path / "nowhere" / "val-step1.json", []) == {}
    # An intervals file without its tasks is as good as none: computed from the records.
    val = two_runs[0].latest
    write_json(val.metrics_path.with_name("val-step4.intervals.json"), {"level": 0.9})
    assert intervals_of(val.metrics_path, val.predictions())[BBBP]["accuracy"][0] < 0.9


def test_a_baselines_test_split_gets_its_error_bar(tmp_path, two_runs):
    base = tmp_path / "1_rdkit"
    test = records([True] * 20, [])
    write_json(base / "baseline.json", {"method": "rdkit"})
    write_jsonl(base / "predictions" / "test.jsonl", test)
    write_json(base / "metrics" / "test.json", score_records(test))
    bars = ablation_intervals([two_runs[0], load_run(base), load_run(write_run(tmp_path / "2_x", [], "x"))],
                              ["full", "baseline:rdkit", "x"])
    assert bars[f"{BBBP}/accuracy"]["baseline:rdkit"] == [1.0, 1.0]  # every answer right
    assert set(bars[f"{BBBP}/accuracy"]) == {"full", "baseline:rdkit"}  # no records, no bar


def test_the_note_under_a_paired_table_counts_the_clear_differences_of_each_pair(two_runs, tmp_path):
    from llasmol.analysis.pairs import compare_two, paired_runs_note

    full, lite = two_runs
    same = load_run(write_run(tmp_path / "2_tiny_full", records([i % 10 != 0 for i in range(120)],
                                                                [i % 2 == 0 for i in range(40)]), "full"))
    table = paired_table([full, lite, same], ["full", "lite", "same"])
    assert paired_runs_note(table).splitlines() == [
        f"- full vs lite: 1 of 2 tasks differ beyond noise ({BBBP})",
        "- full vs same: 0 of 2 tasks differ beyond noise",
        f"- lite vs same: 1 of 2 tasks differ beyond noise ({BBBP})",
    ]
    assert compare_two(full, lite).column("a") == ["0_tiny_full", "0_tiny_full"]  # named by folder unless told
    assert compare_two(full, lite, ["A", "B"]).records()[0]["b"] == "B"


def test_the_two_run_report_names_the_runs_and_says_what_it_found(two_runs, tmp_path, capsys):
    import csv

    from llasmol.report import main as report_main

    full, lite = two_runs
    written = report_main([str(full.path), str(lite.path)])
    out = capsys.readouterr().out.splitlines()
    folder = full.path / "report" / "vs_1_tiny_lite"
    assert written == [folder / "pairs.md", folder / "pairs.csv"]
    assert out == [f"- 0_tiny_full vs 1_tiny_lite: 1 of 2 tasks differ beyond noise ({BBBP})",
                   f"wrote {folder / 'pairs.md'}", f"wrote {folder / 'pairs.csv'}"]
    assert (folder / "pairs.md").read_text().startswith("A - B of each task's headline metric on the samples both")
    assert f"- 0_tiny_full vs 1_tiny_lite: 1 of 2 tasks differ beyond noise ({BBBP})\n\n" in (
        folder / "pairs.md").read_text()
    # The same run twice: both share a label, so the paths given name them.
    report_main([str(full.path), str(full.path), "--out", str(tmp_path / "self")])
    rows = list(csv.DictReader((tmp_path / "self" / "pairs.csv").open()))
    assert {(r["a"], r["b"]) for r in rows} == {(str(full.path), str(full.path))}
    capsys.readouterr()
    # Runs with no sample in common: nothing to pair, and the report says so.
    other = load_run(write_run(tmp_path / "other", [{**r, "input": "x" + r["input"]} for r in records([True], [])],
                               "full"))
    report_main([str(full.path), str(other.path), "--out", str(tmp_path / "apart")])
    note = "No two runs share scored samples (paired comparisons need the same samples)."
    assert capsys.readouterr().out.splitlines()[0] == note
    assert (tmp_path / "apart" / "pairs.md").read_text().startswith(note + "\n\n")
    # A run with nothing scored yet cannot be compared.
    write_json(tmp_path / "fresh" / "params.json", {"model": "tiny", "lora": "full"})
    with pytest.raises(SystemExit):
        report_main([str(full.path), str(tmp_path / "fresh")])
    assert "has no validation yet" in capsys.readouterr().err


def test_a_sweep_of_many_runs_compares_each_with_the_first_not_every_pair(two_runs, monkeypatch):
    """300 runs made the report compare 44,850 pairs (over 15 minutes); past ALL_PAIRS_UP_TO runs each is
    compared with the first, and each run's answers are read once."""
    from llasmol.analysis import pairs

    read = []
    real_basis = pairs.basis
    monkeypatch.setattr(pairs, "basis", lambda run: (read.append(run.name), real_basis(run))[1])
    few = list(two_runs) * 4  # 8 runs: every pair
    assert len({(r["a"], r["b"]) for r in paired_table(few, [f"r{k}" for k in range(8)]).records()}) == 28
    read.clear()
    many = list(two_runs) * 10  # 20 runs
    table = paired_table(many, [f"r{k}" for k in range(20)])
    assert sorted({(r["a"], r["b"]) for r in table.records()}) == sorted(("r0", f"r{k}") for k in range(1, 20))
    assert len(read) == 20  # each run once, the first kept
    assert table.title.endswith("(each of 19 runs against r0: more than 8 runs)")
