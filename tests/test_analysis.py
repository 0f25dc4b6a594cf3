"""llasmol.analysis, `python -m llasmol.report` and the two analysis notebooks.

Known-answer tests use small hand-made run directories; the report and the notebooks also run on a
real short training run (trained once for this module) and a two-variant sweep made from it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT
from refusals import refused, refused_cli

from llasmol import analysis
from llasmol.analysis.paper import PAPER_RESULTS, PAPER_TRAINABLE
from llasmol.analysis.tables import metric_lines
from llasmol.core.files import write_json, write_jsonl
from llasmol.metrics.scoring import score_records
from llasmol.report import main as report_main

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def smiles(s: str) -> str:
    return f"The product is <SMILES> {s} </SMILES> ."


# Hand-made validation: each sample's expected top-1 outcome is noted.
RECORDS = [
    # forward_synthesis: correct (5 predictions, so top-5 is reported), valid-but-wrong with the
    # right answer second, invalid SMILES, no answer, skipped.
    {"task": "forward_synthesis", "index": 0, "input": "q0", "raw_input": "A.B", "gold": ["CCO"],
     "predictions": [smiles("OCC"), smiles("CC"), smiles("C"), smiles("N"), smiles("O")]},
    {"task": "forward_synthesis", "index": 1, "input": "q1", "raw_input": "C.D", "gold": ["c1ccccc1"],
     "predictions": [smiles("CCN"), smiles("C1=CC=CC=C1")]},
    {"task": "forward_synthesis", "index": 2, "input": "q2", "raw_input": "E.F", "gold": ["CCO"],
     "predictions": [smiles("C1CC")]},
    {"task": "forward_synthesis", "index": 3, "input": "q3", "raw_input": "G.H", "gold": ["CC(=O)O"],
     "predictions": ["I do not know"]},
    {"task": "forward_synthesis", "index": 4, "input": "q4", "raw_input": "I.J", "gold": ["CCCC"],
     "predictions": None, "skipped": True},
    # name_conversion-s2f: correct, wrong, invalid.
    {"task": "name_conversion-s2f", "index": 5, "input": "f0", "gold": ["C2H6O"],
     "predictions": ["<MOLFORMULA> C2H6O </MOLFORMULA>"]},
    {"task": "name_conversion-s2f", "index": 6, "input": "f1", "gold": ["C2H6O"],
     "predictions": ["<MOLFORMULA> C2H5O </MOLFORMULA>"]},
    {"task": "name_conversion-s2f", "index": 7, "input": "f2", "gold": ["C2H6O"],
     "predictions": ["<MOLFORMULA> C2 H6 O </MOLFORMULA>"]},  # spaces: invalid in the official syntax
    # property_prediction-bbbp: correct, wrong, invalid, no answer.
    {"task": "property_prediction-bbbp", "index": 8, "input": "b0", "gold": ["Yes"],
     "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]},
    {"task": "property_prediction-bbbp", "index": 9, "input": "b1", "gold": ["No"],
     "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]},
    {"task": "property_prediction-bbbp", "index": 10, "input": "b2", "gold": ["No"],
     "predictions": ["<BOOLEAN> maybe </BOOLEAN>"]},
    {"task": "property_prediction-bbbp", "index": 11, "input": "b3", "gold": ["Yes"], "predictions": [""]},
    # property_prediction-esol: scored (|error| 0.5 and 2.0), invalid.
    {"task": "property_prediction-esol", "index": 12, "input": "e0", "gold": ["-1.5"],
     "predictions": ["<NUMBER> -1.0 </NUMBER>"]},
    {"task": "property_prediction-esol", "index": 13, "input": "e1", "gold": ["0.5"],
     "predictions": ["<NUMBER> 2.5 </NUMBER>"]},
    {"task": "property_prediction-esol", "index": 14, "input": "e2", "gold": ["0.0"],
     "predictions": ["<NUMBER> abc </NUMBER>"]},
]


def write_run(path: Path, lora: str = "lite", trainable: int = 100, scale: float = 1.0) -> Path:
    """A run directory: params, an early validation (metrics only) and a later one (both files)."""
    records = [{"skipped": False, **r} for r in RECORDS]
    write_json(path / "params.json", {"model": "tiny", "lora": lora, "trainable": trainable,
                                      "total": 1000, "percent": trainable / 10})
    metrics = score_records([{**r, "predictions": r["predictions"] or []} for r in records])
    for task in metrics:
        metrics[task]["num_skipped"] = float(sum(1 for r in records if r["task"] == task and r["skipped"]))
    metrics["forward_synthesis"]["exact_match"] *= scale
    early = {task: {**values, "exact_match": 0.0} for task, values in metrics.items()}
    # step 10 must sort after step 2 (numerically, not as text).
    write_json(path / "metrics" / "val-step2.json", early)
    write_json(path / "metrics" / "val-step10.json", metrics)
    write_jsonl(path / "predictions" / "val-step10.jsonl", records)
    return path


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return write_run(tmp_path / "run")


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    write_run(tmp_path / "sweep" / "0_tiny_lite", "lite", 100)
    write_run(tmp_path / "sweep" / "1_tiny_attn", "attn", 200, scale=2.0)
    return tmp_path / "sweep"


# --------------------------------------------------------------------------- loading


def test_load_run_orders_validations_by_step(run_dir):
    run = analysis.load_run(run_dir)
    assert [v.name for v in run.validations] == ["val-step2", "val-step10"]
    assert run.latest.step == 10 and run.lora == "lite" and run.params["trainable"] == 100
    assert run.validation("val-step2").predictions() == []  # no file for the early one
    assert len(run.latest.predictions()) == len(RECORDS)
    # NaN-free: an RMSE with no valid prediction is null in the file and None here.
    assert run.validation(0).metrics["property_prediction-esol"]["rmse"] is not None


def test_runs_written_before_one_numbering_still_read(run_dir):
    """Validations an older version named val-epoch{E}-step{S} (S the same count) read as before, by step."""
    for folder in ("metrics", "predictions"):
        for file in list((run_dir / folder).iterdir()):
            file.rename(file.with_name(file.name.replace("val-step", "val-epoch0-step")))
    assert sorted(p.name for p in (run_dir / "metrics").glob("val-epoch0-step*.json"))  # the old names, really
    run = analysis.load_run(run_dir)
    assert [(v.name, v.step) for v in run.validations] == [("val-epoch0-step2", 2), ("val-epoch0-step10", 10)]
    assert run.evaluations == {} and len(run.validation("step10").predictions()) == len(RECORDS)
    assert run.validation("val-epoch0-step2").step == 2


def test_metric_table_known_values(run_dir):
    table = analysis.metric_table(analysis.load_run(run_dir))
    assert table.column("task") == ["forward_synthesis", "name_conversion-s2f",
                                    "property_prediction-bbbp", "property_prediction-esol"]
    fs = table.row("forward_synthesis")
    assert fs["exact_match"] == pytest.approx(0.2)
    assert fs["validity"] == pytest.approx(2 / 3)  # 3 answers, 2 valid molecules
    assert fs["num_skipped"] == 1
    assert table.row("name_conversion-s2f")["exact_match"] == pytest.approx(1 / 3)
    assert table.row("property_prediction-bbbp")["accuracy"] == pytest.approx(0.25)
    assert table.row("property_prediction-esol")["rmse"] == pytest.approx(((0.5**2 + 2.0**2) / 2) ** 0.5)
    assert table.row("property_prediction-esol")["exact_match"] is None
    assert table.columns.index("exact_match") < table.columns.index("num_samples")

    md = table.to_markdown().splitlines()
    assert md[2].startswith("| task | exact_match |") and len(md) == 4 + 4
    assert "| forward_synthesis | 0.200 (n=5, too few) |" in table.to_markdown()
    rows = list(csv.DictReader(io.StringIO(table.to_csv())))
    assert rows[0]["task"] == "forward_synthesis" and float(rows[0]["exact_match"]) == pytest.approx(0.2)
    assert rows[3]["exact_match"] == ""

    early = analysis.metric_table(analysis.load_run(run_dir), validation="val-step2")
    assert early.row("forward_synthesis")["exact_match"] == 0.0


def test_topk_curves_known_values(run_dir):
    curves = analysis.topk_curves(analysis.load_run(run_dir))
    fs = dict(curves["forward_synthesis"])
    assert sorted(fs) == [1, 3, 5]  # no sample has 10 predictions
    assert fs[1] == pytest.approx(0.2) and fs[3] == pytest.approx(0.4) and fs[5] == pytest.approx(0.4)
    assert [k for k, _ in curves["name_conversion-s2f"]] == [1]
    assert "property_prediction-bbbp" not in curves
    table = analysis.topk_table(analysis.load_run(run_dir))
    assert table.columns == ["task", "top1", "top3", "top5"]
    assert table.row("name_conversion-s2f")["top3"] is None


def test_failure_counts_known_values(run_dir):
    run = analysis.load_run(run_dir)
    counts = analysis.failure_counts(run)
    zero = dict.fromkeys(analysis.FAILURE_CATEGORIES, 0)
    assert counts["forward_synthesis"] == {**zero, "correct": 1, "wrong": 1, "invalid": 1, "no_answer": 1, "skipped": 1}
    assert counts["name_conversion-s2f"] == {**zero, "correct": 1, "wrong": 1, "invalid": 1}
    assert counts["property_prediction-bbbp"] == {**zero, "correct": 1, "wrong": 1, "invalid": 1, "no_answer": 1}
    assert counts["property_prediction-esol"] == {**zero, "scored": 2, "invalid": 1}
    # "correct" agrees with the metrics of the same validation.
    for task in ("forward_synthesis", "name_conversion-s2f"):
        m = run.latest.metrics[task]
        assert counts[task]["correct"] == round(m["exact_match"] * m["num_samples"])
    table = analysis.failure_table(run)
    assert table.row("forward_synthesis")["num_samples"] == 5
    assert len(table.to_markdown().splitlines()) == 4 + len(counts)


def test_worst_examples_order(run_dir):
    worst = analysis.worst_examples(analysis.load_run(run_dir), n=10)
    assert [s["category"] for s in worst["forward_synthesis"]] == ["wrong", "invalid", "no_answer", "skipped"]
    wrong = worst["forward_synthesis"][0]
    assert wrong["answer"] == "CCN" and 0.0 <= wrong["score"] < 1.0
    assert [s["index"] for s in worst["property_prediction-esol"]] == [13, 12, 14]  # largest error first
    assert worst["property_prediction-esol"][0]["score"] == pytest.approx(2.0)
    assert all(s["category"] != "correct" for samples in worst.values() for s in samples)
    assert len(analysis.worst_examples(analysis.load_run(run_dir), n=1)["forward_synthesis"]) == 1
    table = analysis.worst_table(worst)
    assert "CCN" in table.to_markdown() and "prediction" in table.columns


def test_metric_trends_order_and_columns(run_dir):
    trends = analysis.metric_trends(analysis.load_run(run_dir))
    assert trends.column("step") == [2, 10]
    assert trends.columns[:2] == ["step", "forward_synthesis/exact_match"]
    assert "property_prediction-esol/rmse" in trends.columns
    assert "property_prediction-bbbp/accuracy" in trends.columns
    assert trends.column("forward_synthesis/exact_match") == [0.0, pytest.approx(0.2)]
    fts = analysis.metric_trends(analysis.load_run(run_dir), metrics="validity")
    assert fts.columns == ["step", "forward_synthesis/validity"]


def test_plots_and_drawings(run_dir, tmp_path):
    run = analysis.load_run(run_dir)
    for name, fig in {
        "topk": analysis.plot_topk(analysis.topk_curves(run)),
        "failures": analysis.plot_failures(analysis.failure_counts(run)),
        "trends": analysis.plot_trends(analysis.metric_trends(run)),
        "ablation": analysis.plot_ablation({"fs/exact_match": {"a": 0.1, "b": None}}),
        "empty": analysis.plot_topk({}),
    }.items():
        assert analysis.png(fig).startswith(PNG_MAGIC), name
    # The failure chart's bars are each task's shares of its samples, filling the row.
    counts = analysis.failure_counts(run)
    bars = analysis.plot_failures(counts).axes[0].patches
    for i, task in enumerate(counts):
        row = [b.get_width() for b in bars if round(b.get_y() + b.get_height() / 2) == i]
        assert sum(row) == pytest.approx(1.0), (task, row)
    # A chart with nothing to draw says why, in its middle, instead of showing bare axes.
    for fig, why in [(analysis.plot_topk({}), "no task reports top-k exact match"),
                     (analysis.plot_failures({}), "no predictions"),
                     (analysis.plot_ablation({}), "no variant has a validation")]:
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert texts == [why] and not any(ax.axison for ax in fig.axes)
    image = analysis.draw_examples(analysis.worst_examples(run)["forward_synthesis"], tmp_path / "w.png")
    assert image.startswith(PNG_MAGIC) and (tmp_path / "w.png").read_bytes() == bytes(image)
    assert analysis.draw_examples([{"gold": ["not a smiles ("], "answer": None}]) is None


# --------------------------------------------------------------------------- comparison and paper


def test_paper_numbers():
    assert PAPER_RESULTS["LlaSMol-Mistral"]["forward_synthesis"]["exact_match"] == pytest.approx(0.635)
    assert PAPER_RESULTS["LlaSMol-Llama 2"]["retrosynthesis"]["fts"] == pytest.approx(0.652)
    assert PAPER_RESULTS["LlaSMol-Mistral"]["molecule_captioning"]["meteor"] == pytest.approx(0.452)
    assert PAPER_RESULTS["LlaSMol-Llama 2"]["property_prediction-bbbp"]["mcc"] == pytest.approx(-0.048)
    for model in PAPER_RESULTS.values():
        for values in model.values():
            assert all(-1.0 <= v <= 1.0 for v in values.values())
    assert PAPER_TRAINABLE["full"] == {"trainable": 40.0e6, "percent": 0.59}
    assert PAPER_TRAINABLE["lite"]["trainable"] == 8.4e6 and PAPER_TRAINABLE["plus"]["percent"] == 2.48


def test_compare_table_rows_and_paper_columns(sweep_dir):
    table = analysis.compare_table(sweep_dir)
    assert table.column("variant") == ["tiny/lite", "tiny/attn", "LlaSMol-Mistral", "LlaSMol-Llama 2"]
    assert table.column("source") == ["run", "run", "paper", "paper"]
    lite, attn, mistral, llama = table.records()
    assert lite["trainable"] == 100 and attn["trainable"] == 200
    assert lite["paper_trainable"] == 8.4e6 and attn["paper_trainable"] == 16.8e6
    assert lite["paper_percent"] == 0.12 and attn["paper_percent"] == 0.25
    assert lite["forward_synthesis/exact_match"] == pytest.approx(0.2)
    assert attn["forward_synthesis/exact_match"] == pytest.approx(0.4)
    assert lite["property_prediction-esol/rmse"] is not None
    assert mistral["forward_synthesis/exact_match"] == pytest.approx(0.635)
    assert mistral["name_conversion-s2f/exact_match"] == pytest.approx(0.945)
    assert llama["property_prediction-bbbp/accuracy"] == pytest.approx(0.685)
    assert mistral["property_prediction-esol/rmse"] is None  # not read from the paper
    assert mistral["paper_trainable"] == 40.0e6
    data = analysis.ablation_data(sweep_dir)
    assert data["forward_synthesis/exact_match"] == {"tiny/lite": pytest.approx(0.2), "tiny/attn": pytest.approx(0.4)}


# --------------------------------------------------------------------------- report errors


def test_report_errors(tmp_path, capsys):
    cases = {
        tmp_path / "missing": "is not a directory",
        tmp_path: "is neither a run directory",
    }
    (tmp_path / "fresh").mkdir()
    write_json(tmp_path / "fresh" / "params.json", {"model": "tiny", "lora": "full", "trainable": 1, "total": 2})
    cases[tmp_path / "fresh"] = "has no validation yet (no metrics/val-step*.json): a run validates every val_every_n_steps"
    write_json(tmp_path / "sw" / "0_tiny_full" / "params.json", {"model": "tiny", "lora": "full"})
    cases[tmp_path / "sw"] = "no run has a validation yet"
    for path, message in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            report_main([str(path)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (path, err)
    assert not (tmp_path / "report").exists()


def test_report_command_line_error(tmp_path):
    refused_cli(["llasmol.report", str(tmp_path)], REPO, tmp_path, untouched=tmp_path)


def test_report_on_hand_made_run(run_dir, capsys, monkeypatch):
    drawn = {}
    plot_trends = analysis.plot_trends
    monkeypatch.setattr(analysis, "plot_trends", lambda *a, **kw: drawn.update(kw) or plot_trends(*a, **kw))
    written = report_main([str(run_dir)])
    # trends.png's dashed floors: the best constant answer on the validation's samples (CCO is 2 of 5 golds).
    assert sorted(drawn["floors"]) == ["forward_synthesis/exact_match", "name_conversion-s2f/exact_match",
                                       "property_prediction-bbbp/accuracy", "property_prediction-esol/rmse"]
    assert drawn["floors"]["forward_synthesis/exact_match"] == pytest.approx(0.4)
    out = capsys.readouterr().out
    names = {p.name for p in written}
    assert {"metrics.md", "metrics.csv", "failures.md", "failures.csv", "trends.csv", "topk.png",
            "failures.png", "trends.png", "worst_forward_synthesis.png"} <= names
    assert all(f"wrote {p}" in out for p in written)
    md = (run_dir / "report" / "metrics.md").read_text()
    # Narrow by default: each task's headline metric and samples; which tasks the data lacks, said once here.
    assert "| task | metric | value | num_samples |" in md
    assert "| forward_synthesis | exact_match | 0.200 (n=5, too few) | 5 |" in md
    assert "| property_prediction-esol | rmse |" in md and "validity" not in md
    assert "Tasks: 4 of the 14 SMolInstruct tasks; not in this run's data: retrosynthesis," in md
    assert "--all-metrics" in md and "validity" in (run_dir / "report" / "metrics.csv").read_text()
    report_main([str(run_dir), "--all-metrics"])
    md = (run_dir / "report" / "metrics.md").read_text()
    assert "| forward_synthesis | 0.200 (n=5, too few) |" in md and "validity" in md and "--all-metrics" not in md
    assert "| 0.667 (n=3 of 5, too few) |" in md  # validity: of the 3 samples with an answer


def test_a_test_split_report_says_why_paper_cells_are_empty(run_dir, capsys):
    """The demo model has no paper row, and the paper's ESOL RMSE is not transcribed: a line above test.md says
    so, rather than leave a newcomer a column of '-'."""
    write_json(run_dir / "metrics" / "test.json", analysis.load_run(run_dir).latest.metrics)
    report_main([str(run_dir)])
    tiny = (run_dir / "report" / "test.md").read_text().splitlines()
    table = list(csv.DictReader((run_dir / "report" / "test.csv").open()))  # the same table, for notebooks
    assert len(table) == sum(line.startswith("| ") and not line.startswith(("| task ", "|---")) for line in tiny)
    assert tiny[0].startswith("Paper column empty: the paper reports no results for the tiny demo model")
    assert "model=mistral, llama2, galactica, codellama" in tiny[0] and tiny[1] == ""
    assert all(line.endswith(" | - |") for line in tiny if line.startswith("| ") and "---" not in line[:6]
               and not line.startswith("| task "))
    params = json.loads((run_dir / "params.json").read_text())
    write_json(run_dir / "params.json", {**params, "model": "mistral"})
    report_main([str(run_dir)])
    capsys.readouterr()
    mistral = (run_dir / "report" / "test.md").read_text().splitlines()
    assert mistral[0].startswith("'-' in the paper column: ESOL and Lipo RMSE are printed in the paper (Table 12)")
    assert "| property_prediction-esol | rmse | 1.458 (n=2 of 3, too few) | - |" in mistral
    assert (f"| property_prediction-bbbp | accuracy | 0.250 (n=4, too few) | "
            f"{PAPER_RESULTS['LlaSMol-Mistral']['property_prediction-bbbp']['accuracy']:.3f} |") in mistral


def test_a_value_on_few_answers_says_how_many_wherever_it_is_shown(tmp_path, capsys):
    """An ESOL RMSE from 1 number among 30 answers is not comparable with the paper's: test.md, metrics.md,
    intervals.md and the printed lines say ``n=1 of 30, too few``; the CSV keeps the plain number."""
    esol, bbbp = "property_prediction-esol", "property_prediction-bbbp"
    records = ([{"task": esol, "index": i, "input": f"e{i}", "gold": ["1.0"],
                 "predictions": ["<NUMBER> 0.37 </NUMBER>" if i == 0 else "<NUMBER> soluble </NUMBER>"]}
                for i in range(30)]
               + [{"task": bbbp, "index": 30 + i, "input": f"b{i}", "gold": ["Yes"],
                   "predictions": ["<BOOLEAN> Yes </BOOLEAN>" if i < 12 else "<BOOLEAN> perhaps </BOOLEAN>"]}
                  for i in range(30)])
    metrics = score_records(records)
    run = tmp_path / "run"
    write_json(run / "params.json", {"model": "mistral", "lora": "full", "trainable": 1, "total": 2, "percent": 50})
    write_json(run / "metrics" / "test.json", metrics)
    write_jsonl(run / "predictions" / "test.jsonl", records)
    report_main([str(run), "--all-metrics"])
    capsys.readouterr()
    test_md = (run / "report" / "test.md").read_text()
    assert f"| {esol} | rmse | 0.630 (n=1 of 30, too few) | - |" in test_md
    # Accuracy counts every sample (a non-answer is wrong): 30 of 30, no note; F1 and MCC only the 12 yes/no.
    paper = PAPER_RESULTS["LlaSMol-Mistral"][bbbp]
    assert f"| {bbbp} | accuracy | 0.400 | {paper['accuracy']:.3f} |" in test_md
    metrics_md = (run / "report" / "metrics.md").read_text()
    assert f"| {esol} | 0.630 (n=1 of 30, too few) |" in metrics_md.replace("| - ", "")
    assert "| 1 (n=12 of 30) | 0.000 (n=12 of 30) |" in metrics_md  # f1, mcc
    intervals_md = (run / "report" / "intervals.md").read_text()
    assert f"| {esol} | rmse | 0.630 (n=1 of 30, too few) | 0.630 | 0.630 |" in intervals_md
    assert next(r for r in csv.DictReader((run / "report" / "test.csv").open()) if r["task"] == esol)["ours"] == "0.63"
    lines = metric_lines(metrics).splitlines()
    assert lines[0] == f"{esol}  rmse=0.6300 (n=1 of 30, too few)  num_samples=30"
    assert lines[1] == f"{bbbp}  accuracy=0.4000  num_samples=30"


# --------------------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def real_sweep(trained_run, tmp_path_factory) -> Path:
    """A multirun-shaped folder from one short real run (tiny model, LoRA `lite`, two validations: the
    session's `trained_run`, copied).

    To keep this module quick, the second variant is that run's files relabelled as `attn` (its
    params.json rewritten), not a second training run: the analysis only reads the files.
    """
    sweep = tmp_path_factory.mktemp("real") / "sweep"
    shutil.copytree(trained_run, sweep / "0_tiny_lite", ignore=shutil.ignore_patterns(".hydra", "callback_metrics.json"))
    shutil.copytree(sweep / "0_tiny_lite", sweep / "1_tiny_attn", ignore=shutil.ignore_patterns("checkpoints"))
    params = json.loads((sweep / "1_tiny_attn" / "params.json").read_text())
    write_json(sweep / "1_tiny_attn" / "params.json", {**params, "lora": "attn", "trainable": 2 * params["trainable"]})
    return sweep


def test_report_on_real_run(real_sweep, capsys):
    run_dir = real_sweep / "0_tiny_lite"
    written = report_main([str(run_dir)])
    capsys.readouterr()
    report = run_dir / "report"
    for name in ("metrics.md", "metrics.csv", "intervals.md", "intervals.csv", "failures.md", "failures.csv",
                 "trends.csv", "topk.png", "failures.png", "trends.png", "trivial.md", "trivial.csv"):
        assert (report / name).is_file(), name
    saved = json.loads((run_dir / "metrics" / f"{analysis.load_run(run_dir).latest.name}.intervals.json").read_text())
    for row in csv.DictReader((report / "intervals.csv").open()):  # the run's own intervals, beside each value
        assert [float(row["lo"]), float(row["hi"])] == pytest.approx(saved["tasks"][row["task"]][row["metric"]])
    for png in report.glob("*.png"):
        assert png.read_bytes().startswith(PNG_MAGIC), png
    assert any(p.name.startswith("worst_") for p in written)  # the sample's SMILES tasks have golds
    run = analysis.load_run(run_dir)
    tasks = run.latest.tasks
    md_rows = [line for line in (report / "metrics.md").read_text().splitlines() if line.startswith("| ")]
    assert len(md_rows) == 1 + len(tasks)  # header + one row per task
    assert sorted(line.split(" | ")[0][2:] for line in md_rows[1:]) == sorted(tasks)
    # The failure breakdown agrees with the logged metrics.
    counts = analysis.failure_counts(run)
    for task in tasks:
        m = run.latest.metrics[task]
        assert sum(counts[task].values()) == m["num_samples"]
        if "exact_match" in m:
            assert counts[task]["correct"] == round(m["exact_match"] * m["num_samples"])
    trends = list(csv.DictReader((report / "trends.csv").open()))
    assert [int(r["step"]) for r in trends] == [v.step for v in run.validations] == [2, 4]
    assert (report / "metrics.md").read_text().startswith("How low to expect: the tiny demo model has 2 layers")
    floor = {r["task"]: r for r in csv.DictReader((report / "trivial.csv").open())}
    for task, row in floor.items():  # the constant answer scored as the model's answers are
        golds = [r["gold"][0] for r in run.latest.predictions() if r["task"] == task]
        if row["metric"] == "accuracy":
            assert float(row["value"]) == pytest.approx(max(golds.count(g) for g in golds) / len(golds))
        if row["metric"] == "rmse":
            values = [float(g) for g in golds]
            mean = sum(values) / len(values)
            assert float(row["value"]) == pytest.approx(
                (sum((v - float(row["constant answer"])) ** 2 for v in values) / len(values)) ** 0.5)
            assert abs(float(row["constant answer"]) - mean) <= 0.005 + 1e-9  # written to 2 decimals
    assert {"property_prediction-bbbp", "property_prediction-esol"} <= set(floor)
    curves = run.loss_curves()  # what trends.png draws first
    # One point per validation, at the step its files are named by.
    steps = [step for step, _ in curves["val/loss"]]
    assert steps == [v.step for v in run.validations] and curves["val/loss"][-1][1] == run.val_loss
    assert curves["train/loss"] and curves["train/loss"][-1][1] == run.train_loss


def test_report_on_real_sweep(real_sweep, capsys, ablation_titles, monkeypatch):
    written = report_main([str(real_sweep)])
    capsys.readouterr()
    # every variant validated: the chart says it shows their latest validations (a baseline's: "or test split")
    assert ablation_titles == [f"{real_sweep.name}: variants at their latest validation, 95% intervals"]
    from llasmol.analysis import pairs as pairs_module

    monkeypatch.setattr(pairs_module, "ablation_intervals", lambda runs, labels: {"val/loss": dict.fromkeys(labels)})
    report_main([str(real_sweep)])  # runs without intervals (intervals=none): the title promises none
    capsys.readouterr()
    assert ablation_titles[-1] == f"{real_sweep.name}: variants at their latest validation"
    report = real_sweep / "report"
    assert {p.name for p in written} == {"comparison.md", "comparison.csv", "ablation.png", "pairs.md", "pairs.csv"}
    data = analysis.ablation_data(real_sweep)
    seconds = json.loads((real_sweep / "0_tiny_lite" / "result.json").read_text())["seconds"]
    assert 0 < seconds and data["minutes"]["tiny/lite"] == pytest.approx(seconds / 60)
    assert data["train/loss"]["tiny/lite"] == analysis.load_run(real_sweep / "0_tiny_lite").train_loss is not None
    assert (report / "ablation.png").read_bytes().startswith(PNG_MAGIC)
    pairs = list(csv.DictReader((report / "pairs.csv").open()))
    tasks = {r["task"] for r in pairs}
    assert {(r["a"], r["b"]) for r in pairs} == {("tiny/lite", "tiny/attn")} and len(tasks) == len(pairs) >= 10
    for r in pairs:  # the two variants validated on the same subset: every sample paired
        assert int(r["samples"]) >= 1 and r["excludes_zero"] in ("yes", "no") and r["on"].startswith("val-step")
        if r["difference"]:  # blank where a metric is undefined on one side (RMSE with no valid number)
            assert float(r["difference"]) == pytest.approx(float(r["a_value"]) - float(r["b_value"]))
            assert float(r["lo"]) <= float(r["hi"])
    rows = list(csv.DictReader((report / "comparison.csv").open()))
    assert [r["variant"] for r in rows] == ["tiny/lite", "tiny/attn", "LlaSMol-Mistral", "LlaSMol-Llama 2"]
    params = [json.loads((real_sweep / d / "params.json").read_text()) for d in ("0_tiny_lite", "1_tiny_attn")]
    assert [int(rows[i]["trainable"]) for i in range(2)] == [p["trainable"] for p in params]
    assert float(rows[2]["forward_synthesis/exact_match"]) == pytest.approx(0.635)


# --------------------------------------------------------------------------- notebooks


def _execute_notebook(name: str, env: str, value: Path, monkeypatch):
    """Run a notebook headless as it is committed, told what to read by its environment variable."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    raw_cells = json.loads((REPO / "notebooks" / name).read_text())["cells"]
    assert all(c.get("id") for c in raw_cells), f"{name}: every cell needs an id (nbformat 4.5 warns otherwise)"
    # Committed without outputs, with one cell tagged as papermill's `parameters` that reads the variable.
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, name
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and env in params[0].source, f"{name} needs one `parameters` cell reading ${env}"
    monkeypatch.setenv(env, str(value))
    nbclient.NotebookClient(nb, timeout=HANG_TIMEOUT, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    texts = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", output
            data = output.get("data", {})
            assert "image/png" not in data or len(data.get("text/plain", "")) < 100  # no text copy of the image
            texts.append(str(output.get("text", "")) + str(data.get("text/markdown", "")) + str(data.get("text/plain", "")))
    images = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    return "\n".join(texts), images


def test_analyze_predictions_notebook(real_sweep, monkeypatch):
    text, images = _execute_notebook("analyze_predictions.ipynb", "LLASMOL_RUN_DIR", real_sweep / "0_tiny_lite",
                                     monkeypatch)
    assert "| forward_synthesis |" in text and "exact_match" in text and "validity" in text
    assert "no_answer" in text  # the failure breakdown
    assert images >= 4


def test_compare_runs_notebook(real_sweep, monkeypatch):
    text, images = _execute_notebook("compare_runs.ipynb", "LLASMOL_SWEEP_DIR", real_sweep, monkeypatch)
    assert "tiny/lite" in text and "LlaSMol-Mistral" in text and "forward_synthesis/exact_match" in text
    assert images >= 1


def test_the_notebooks_default_to_the_newest_run_and_sweep(real_sweep, tmp_path):
    import os
    import shutil

    root = tmp_path / "outputs" / "train"
    (root / "multirun").mkdir(parents=True)
    for name, when in (("old", 1_000), ("new", 2_000)):
        shutil.copytree(real_sweep / "0_tiny_lite", root / name)
        os.utime(root / name, (when, when))
    shutil.copytree(real_sweep, root / "multirun" / "sweep")
    assert analysis.newest(root) == root / "new"
    assert analysis.newest(root, multirun=True) == root / "multirun" / "sweep"
    with refused("no run directory", tmp_path / "nothing"):
        analysis.newest(tmp_path / "nothing")


def test_markdown_tables_print_counts_as_integers_and_scores_as_fractions():
    from llasmol.analysis.tables import Table

    table = Table(columns=["task", "exact_match", "num_skipped", "tp"], rows=[["fs", 0.0, 0.0, 3.0]])
    assert table.to_markdown().splitlines()[-1] == "| fs | 0.000 | 0 | 3 |"


def test_charts_say_something_on_a_short_sweep():
    """Training and validation loss share a panel, trainable parameters and time have panels of their own,
    RMSE is apart from the fractions, and a panel with no value at all (no valid number for RMSE yet) is left
    out rather than drawn empty; the trends chart leads with the loss curves, which move while every exact
    match of a random-initialised model is still 0."""
    from llasmol.analysis.plots import plot_ablation, plot_trends
    from llasmol.analysis.tables import Table

    data = {"val/loss": {"lite": 3.2, "full": 3.1}, "train/loss": {"lite": 3.4, "full": 3.0},
            "trainable (M)": {"lite": 0.03, "full": 0.07}, "minutes": {"lite": 0.5, "full": 0.7},
            "answered": {"lite": 0.25, "full": 0.5},
            "forward_synthesis/exact_match": {"lite": 0.0, "full": 0.0},
            "retrosynthesis/exact_match": {"lite": 0.0, "full": 0.125},
            "property_prediction-esol/rmse": {"lite": None, "full": None}}
    fig = plot_ablation(data, title="sweep X")
    assert [ax.get_ylabel().split(" (")[0] for ax in fig.axes] == [
        "loss, nats/token", "trainable parameters", "training time", "answered", "headline metric"]
    loss_panel = fig.axes[0]
    assert [t.get_text() for t in loss_panel.get_xticklabels()] == ["val/loss", "train/loss"]
    assert [t.get_text() for t in fig.axes[1].texts] == ["0.03", "0.07"]  # the parameters' values, printed
    assert "other work" in fig.axes[2].get_ylabel()  # time says what moves it besides the variant
    assert sorted(round(b.get_height(), 2) for c in loss_panel.containers for b in c) == [3.0, 3.1, 3.2, 3.4]
    # A score that is 0 for every variant has no bars to compare: left out of its panel, and said.
    assert [t.get_text() for t in fig.axes[4].get_xticklabels()] == ["retrosynthesis/exact_match"]
    assert fig.get_suptitle() == ("sweep X\n0 for every variant, left out: the headline metric of 1 task "
                                  "(comparison.md has them)")
    # Each panel as wide as its bar groups need: 1.5 a group for loss (2), parameters (1), time (1) and the
    # answered share (1), 0.9 a task for the fractions with 3 at least; the figure 2 wider than the panels, at most 18.
    widths = [ax.get_position().width for ax in fig.axes]
    assert [round(w / widths[1], 2) for w in widths] == [2.0, 1.0, 1.0, 1.0, 2.0]
    assert tuple(fig.get_size_inches()) == (2.0 + 3.0 + 1.5 + 1.5 + 1.5 + 3.0, 5.0)
    data["retrosynthesis/exact_match"]["full"] = 0.0
    data["answered"] = {"lite": 0.0, "full": None}
    nothing_learned = plot_ablation(data, title="sweep X")  # no panel of scores at all: the title says why
    assert [ax.get_ylabel().split(" (")[0] for ax in nothing_learned.axes] == [
        "loss, nats/token", "trainable parameters", "training time"]
    assert nothing_learned.get_suptitle() == ("sweep X\n0 for every variant, left out: the answered share and the "
                                              "headline metric of 2 tasks (comparison.md has them)")
    data["property_prediction-esol/rmse"] = {"lite": 1.5, "full": None}
    assert len(plot_ablation(data).axes) == 4
    trends = Table(["step", "forward_synthesis/exact_match", "property_prediction-esol/rmse"],
                   [[100, 0.1, None], [200, 0.2, None]])
    assert len(plot_trends(trends, title="run Y").axes) == 1  # no RMSE yet: no empty panel
    trends.rows[1][2] = 1.2
    assert [ax.get_ylabel() for ax in plot_trends(trends).axes] == ["value (fraction)", "RMSE (lower is better)"]
    assert tuple(plot_trends(trends).get_size_inches()) == (4.5 + 2 * 4.5, 4.0)  # 4.5 inches a panel, and a margin
    rmse_line = plot_trends(trends).axes[1].lines[0]  # a validation without a value is a gap, not a point
    assert list(rmse_line.get_xdata()) == [100, 200] and math.isnan(rmse_line.get_ydata()[0])
    assert rmse_line.get_ydata()[1] == 1.2
    losses = {"train/loss": [(10, 4.2), (20, 3.9), (30, 3.5)], "val/loss": [(100, 3.6), (200, 3.3)]}
    fig = plot_trends(trends, losses=losses)
    assert [ax.get_ylabel() for ax in fig.axes][0] == "loss (nats/token)"
    lines = {line.get_label(): list(zip(*line.get_data())) for line in fig.axes[0].get_lines()}
    assert lines == {"train/loss": [(10, 4.2), (20, 3.9), (30, 3.5)], "val/loss": [(100, 3.6), (200, 3.3)]}


def test_report_compares_two_runs_and_a_run_with_itself_is_zero(real_sweep, capsys):
    a, b = real_sweep / "0_tiny_lite", real_sweep / "1_tiny_attn"
    written = report_main([str(a), str(b)])
    assert {p.name for p in written} == {"pairs.md", "pairs.csv"} and written[0].parent == a / "report" / "vs_1_tiny_attn"
    assert "tasks differ beyond noise" in capsys.readouterr().out
    same = report_main([str(a), str(a), "--out", str(real_sweep / "self")])
    rows = list(csv.DictReader((real_sweep / "self" / "pairs.csv").open()))
    defined = [r for r in rows if r["difference"]]
    assert len(defined) >= 8 and {(float(r["difference"]), float(r["lo"]), float(r["hi"]), r["excludes_zero"])
                                  for r in defined} == {(0.0, 0.0, 0.0, "no")}
    assert all(r["excludes_zero"] == "no" and not r["lo"] for r in rows if not r["difference"])
    assert same[0].name == "pairs.md"
    with pytest.raises(SystemExit) as stop:
        report_main([str(a), str(real_sweep)])
    assert stop.value.code == 2 and "is not a run directory: two paths compare two runs" in capsys.readouterr().err


def test_printed_metric_lines_show_each_tasks_headline_metric_unless_all_are_asked():
    from llasmol.analysis.tables import metric_lines

    results = {"forward_synthesis": {"exact_match": 0.5, "validity": 1.0, "num_samples": 2},
               "property_prediction-esol": {"rmse": 1.25, "num_samples": 3},
               "molecule_captioning": {"num_samples": 1}}  # its headline metric missing: the count alone
    intervals = {"tasks": {"forward_synthesis": {"exact_match": [0.0, 1.0]}}}
    assert metric_lines(results, intervals).splitlines() == [
        "forward_synthesis         exact_match=0.5000 [0, 1] (n=2, too few)  num_samples=2",
        "property_prediction-esol  rmse=1.2500  num_samples=3",  # no num_valid given: its basis is not known
        "molecule_captioning       num_samples=1"]
    everything = metric_lines(results, intervals, all_metrics=True).splitlines()
    assert everything[0] == ("forward_synthesis         exact_match=0.5000 [0, 1] (n=2, too few)  validity=1  "
                             "num_samples=2")  # no num_no_answer given: validity's basis is not known
    assert everything[1:] == metric_lines(results, intervals).splitlines()[1:]


def test_the_reports_task_line_names_the_tasks_a_run_lacks_and_is_absent_for_all_14():
    from llasmol.core.tasks import TASK_NAMES
    from llasmol.analysis.report_folder import coverage_note

    assert coverage_note(TASK_NAMES) == ""
    note = coverage_note([t for t in TASK_NAMES if t not in ("molecule_captioning", "property_prediction-hiv")])
    assert note.startswith("\nTasks: 12 of the 14 SMolInstruct tasks; not in this run's data: molecule_captioning, "
                           "property_prediction-hiv (")


@pytest.mark.parametrize("folder, model, lora", [("3_tiny_lite", "tiny", "lite"),
                                                 ("12_mistral_v03_full", "mistral_v03", "full"),
                                                 ("0_llama2_13b_large", "llama2_13b", "large"),
                                                 ("my_run", None, None), ("3_tiny", None, None)])
def test_a_job_folder_without_params_names_its_model_and_lora(tmp_path, folder, model, lora):
    """A multirun job's folder is {job}_{model}_{lora}; a model's name may hold underscores, a LoRA's does not.
    (A run stopped before it wrote params.json is read by its folder's name.)"""
    from llasmol.analysis.runs import Run

    run = Run(path=tmp_path / folder, params={}, validations=[])
    assert (run.model, run.lora) == (model, lora)
    named = Run(path=tmp_path / folder, params={"model": "m", "lora": "l"}, validations=[])
    assert (named.model, named.lora) == ("m", "l")  # params.json, where there is one, says


def test_a_markdown_cell_longer_than_its_limit_is_cut_to_the_limit_with_an_ellipsis():
    from llasmol.analysis.tables import Table

    table = Table(["task", "answer"], [["fs", "C" * 100], ["rs", "C" * 80]])
    cells = [line.split(" | ")[1].rstrip(" |") for line in table.to_markdown(max_chars=80).splitlines()[-2:]]
    assert cells == ["C" * 79 + "…", "C" * 80]
    assert "C" * 100 in table.to_markdown(max_chars=None)


def test_a_multirun_folder_that_is_not_there_has_no_jobs(tmp_path):
    from llasmol.analysis.runs import variant_dirs

    assert variant_dirs(tmp_path / "missing") == []
    (tmp_path / "file").write_text("")
    assert variant_dirs(tmp_path / "file") == []


def test_the_ablation_chart_draws_each_bars_interval_and_none_for_a_missing_value():
    from llasmol.analysis.plots import plot_ablation

    data = {"val/loss": {"lite": 3.0, "full": 2.0}, "forward_synthesis/exact_match": {"lite": 0.25, "full": None}}
    intervals = {"val/loss": {"lite": [2.5, 3.25], "full": [1.75, 2.5]},
                 "forward_synthesis/exact_match": {"lite": [0.1, 0.5], "full": [0.0, 0.2]}}
    fig = plot_ablation(data, intervals=intervals)
    spans = {}
    for ax in fig.axes:
        for bars in ax.containers:
            if getattr(bars, "errorbar", None) is not None:
                segments = bars.errorbar.lines[2][0].get_segments()
                spans[(ax.get_ylabel().split(" (")[0], bars.get_label())] = [
                    (round(float(s[0][1]), 3), round(float(s[1][1]), 3)) for s in segments if len(s)]
    assert spans[("loss, nats/token", "lite")] == [(2.5, 3.25)]
    assert spans[("loss, nats/token", "full")] == [(1.75, 2.5)]
    assert spans[("headline metric", "lite")] == [(0.1, 0.5)]
    assert spans[("headline metric", "full")] == []  # no value, no interval drawn


def test_the_comparison_has_one_column_per_task_and_metric_whatever_the_runs_share(sweep_dir):
    from llasmol.analysis.compare import comparison_columns

    runs = analysis.load_sweep(sweep_dir)
    assert len(runs) >= 2
    columns = comparison_columns(runs)
    assert len(columns) == len(set(columns)) > 0  # each pair once, though every run has the task
    assert comparison_columns(runs, {"forward_synthesis": ["validity", "exact_match"]})[:2] == [
        ("forward_synthesis", "validity"), ("forward_synthesis", "exact_match")]


# --------------------------------------------------------------------------- reading run folders, exactly


CSV_LOG = """epoch,step,train/loss,val/loss
0,1,4.0,
0,2,3.5,
0,2,,3.75
0,,2.5,
0,3,nan,
0,4,3.0,
0,4,,3.25
0,5,abc,
"""


def _hand_run(path: Path) -> Path:
    """`write_run` plus a whole test split (its records empty), intervals files, a CSV log and result.json."""
    write_run(path)
    # JSON numbers become floats; true, text, NaN and infinity are not numbers a table can show: None.
    (path / "metrics" / "test.json").write_text(
        '{"forward_synthesis": {"exact_match": 1, "validity": true, "note": "a", "rmse": NaN, "big": Infinity},'
        ' "meta": 3}')
    write_json(path / "metrics" / "test.intervals.json", {"level": 0.95, "tasks": {}})
    write_json(path / "metrics" / "val-step10.intervals.json", {"level": 0.95, "tasks": {}})
    write_json(path / "metrics" / "notes.json", [1, 2])  # not a {task: ...} object: not an evaluated split
    (path / "predictions" / "test.jsonl").write_text("")  # a split with no records yet reads as none
    (path / "csv").mkdir()
    (path / "csv" / "metrics.csv").write_text(CSV_LOG)
    write_json(path / "result.json", {"seconds": 90})
    return path


def test_a_run_reads_its_splits_validations_losses_and_time_exactly(tmp_path):
    from llasmol.analysis.runs import read_csv_log

    run = analysis.load_run(_hand_run(tmp_path / "0_tiny_lite"))
    # Only metrics/test.json is an evaluated split: not the validations, nor the intervals files beside them.
    assert run.evaluations == {"test": {"forward_synthesis": {"exact_match": 1.0, "validity": None, "note": None,
                                                              "rmse": None, "big": None}}}
    test = run.validation("test")  # a split by name
    assert (test.name, test.step, test.split) == ("test", None, "test")
    assert test.metrics_path == run.path / "metrics" / "test.json"
    assert test.predictions_path == run.path / "predictions" / "test.jsonl" and test.predictions() == []
    with refused(run.path, "no dev results", "has: test"):
        run.evaluation("dev")
    # Validations: the latest unless told, by position, by name, by step, by file name.
    assert run.validation().name == "val-step10" and run.validation(None).step == 10
    assert run.validation(0).name == "val-step2" and run.validation(-1).name == "val-step10"
    assert run.validation("step2").step == 2 and run.validation("val-step2.json").step == 2
    assert run.validation("val-step10").predictions_path == run.path / "predictions" / "val-step10.jsonl"
    with refused(run.path, "2 validations", "index 2"):
        run.validation(2)
    with refused(run.path, "'val-step3'", "val-step2, val-step10"):
        run.validation("val-step3")
    # The CSV log: numbers as floats, empty, 'nan' and text cells as None; the last of each loss.
    rows = read_csv_log(run.path / "csv" / "metrics.csv")
    assert len(rows) == 8 and rows[0] == {"epoch": 0.0, "step": 1.0, "train/loss": 4.0, "val/loss": None}
    assert rows[3]["step"] is None and rows[4]["train/loss"] is None and rows[7]["train/loss"] is None
    assert (run.val_loss, run.train_loss) == (3.25, 3.0)
    assert run.loss_curves() == {"train/loss": [(1, 4.0), (2, 3.5), (4, 3.0)], "val/loss": [(2, 3.75), (4, 3.25)]}
    assert run.seconds == 90.0
    assert read_csv_log(tmp_path / "missing.csv") == []


def test_a_run_without_a_log_result_or_splits_has_none_of_them(tmp_path):
    run = analysis.load_run(write_run(tmp_path / "run"))
    assert (run.val_loss, run.train_loss, run.seconds, run.loss_curves()) == (
        None, None, None, {"train/loss": [], "val/loss": []})
    with refused(run.path, "no test results", "has: none"):
        run.evaluation("test")
    write_json(run.path / "result.json", {"best_checkpoint": None})  # written, but without a time
    assert analysis.load_run(run.path).seconds is None
    write_json(run.path / "result.json", [90.0])  # not the object train writes: no time
    assert analysis.load_run(run.path).seconds is None
    (run.path / "result.json").write_text("[" * 100_000 + "]" * 100_000)  # nested past Python's stack
    with refused(run.path / "result.json", "nested too deeply"):
        analysis.load_run(run.path).seconds
    # A folder with params.json alone is a run (require_validation is off unless asked).
    write_json(tmp_path / "fresh" / "params.json", [1, 2])  # not an object: no parameters
    fresh = analysis.load_run(tmp_path / "fresh")
    assert fresh.params == {} and fresh.validations == [] and fresh.latest is None
    # So is a folder with only result.json, or only the CSV log.
    write_json(tmp_path / "ended" / "result.json", {})
    (tmp_path / "logged" / "csv").mkdir(parents=True)
    (tmp_path / "logged" / "csv" / "metrics.csv").write_text("step\n")
    assert analysis.is_run_dir(tmp_path / "ended") and analysis.is_run_dir(tmp_path / "logged")


def test_a_baseline_or_outside_systems_folder_reads_its_split_and_its_label(tmp_path):
    base = tmp_path / "1_rdkit"
    write_json(base / "baseline.json", {"method": "rdkit"})
    write_json(base / "params.json", {"model": "tiny", "lora": "full"})  # a baseline has neither, whatever is here
    write_json(base / "metrics" / "valid.json", {"name_conversion-s2f": {"exact_match": 0.5}})
    write_json(base / "metrics" / "dev.json", {"name_conversion-s2f": {"exact_match": 0.25}})
    run = analysis.load_run(base, require_validation=True)
    assert (run.label, run.lora, run.model, run.latest) == ("baseline:rdkit", None, None, None)
    assert run.validation().name == "dev"  # no test split: the first by name
    write_json(base / "metrics" / "test.json", {"name_conversion-s2f": {"exact_match": 1.0}})
    assert analysis.load_run(base).validation().name == "test"  # the test split, where there is one
    with refused(base, "no validation yet"):
        analysis.load_run(base).validation(0)

    system = tmp_path / "gpt"
    write_json(system / "system.json", {"name": "gpt-4"})
    write_json(system / "metrics" / "test.json", {})
    assert analysis.load_run(system).label == "gpt-4"
    write_json(system / "system.json", {"name": 5})  # no usable name: the folder's
    assert analysis.load_run(system).label == "gpt"
    write_json(system / "system.json", [1])
    write_json(system / "baseline.json", ["rdkit"])  # neither file an object: a plain run
    plain = analysis.load_run(system)
    assert (plain.system, plain.baseline, plain.label) == (None, None, "gpt")


def test_validations_are_in_step_order_whatever_order_the_folder_lists_them(tmp_path):
    steps = [7, 300, 3, 12, 1, 9, 40, 5, 11, 2, 100, 8]
    for step in steps:
        write_json(tmp_path / "run" / "metrics" / f"val-step{step}.json", {"forward_synthesis": {"exact_match": step}})
    run = analysis.load_run(tmp_path / "run")
    assert [v.step for v in run.validations] == sorted(steps)
    assert run.latest.metrics == {"forward_synthesis": {"exact_match": 300.0}}


def test_a_metrics_file_that_is_not_an_object_is_one_line(tmp_path):
    write_json(tmp_path / "run" / "metrics" / "val-step3.json", [1, 2])
    with refused(tmp_path / "run" / "metrics" / "val-step3.json", "{task: {metric: value}}"):
        analysis.load_run(tmp_path / "run")


def test_a_multirun_folder_lists_its_numbered_run_folders_in_job_order(tmp_path):
    from llasmol.analysis.runs import variant_dirs

    sweep = tmp_path / "sweep"
    for name in ("10_tiny_full", "2_tiny_lite"):
        write_json(sweep / name / "params.json", {"model": "tiny", "lora": name.split("_")[-1]})
    (sweep / "3_empty").mkdir()  # numbered, but no run's files
    write_json(sweep / "report" / "params.json", {})  # a run's file, but not numbered
    (sweep / "multirun.yaml").write_text("x: 1\n")
    assert [p.name for p in variant_dirs(sweep)] == ["2_tiny_lite", "10_tiny_full"]  # by number, not by text
    assert [r.name for r in analysis.load_sweep(sweep)] == ["2_tiny_lite", "10_tiny_full"]
    assert analysis.is_multirun_dir(sweep) and not analysis.is_multirun_dir(sweep / "2_tiny_lite")
    assert not analysis.is_multirun_dir(sweep / "3_empty") and not analysis.is_multirun_dir(sweep / "multirun.yaml")
    assert not analysis.is_run_dir(sweep / "3_empty") and not analysis.is_run_dir(sweep / "multirun.yaml")
    with refused(sweep / "3_empty", "multirun directory"):
        analysis.load_sweep(sweep / "3_empty")
    with refused(tmp_path / "missing", "not a directory"):
        analysis.load_sweep(tmp_path / "missing")
    with refused(tmp_path / "missing", "not a directory"):
        analysis.load_run(tmp_path / "missing")
    with refused(sweep / "3_empty", "run directory", "params.json"):
        analysis.load_run(sweep / "3_empty")


@pytest.fixture
def mixed_sweep(tmp_path) -> Path:
    """Job 0: a run with a test split, a CSV log and its time; job 1: a baseline (a test split only); job 2: the
    same model and LoRA as job 0; job 3: a run whose params.json names no LoRA."""
    sweep = tmp_path / "mixed"
    _hand_run(sweep / "0_tiny_lite")
    write_json(sweep / "1_rdkit" / "baseline.json", {"method": "rdkit"})
    write_json(sweep / "1_rdkit" / "metrics" / "test.json", {"name_conversion-s2f": {"exact_match": 1.0}})
    write_run(sweep / "2_tiny_lite", scale=2.0)
    write_json(sweep / "3_run" / "params.json", {"model": "tiny", "trainable": 5})
    write_json(sweep / "3_run" / "metrics" / "val-step1.json", {"forward_synthesis": {"exact_match": 0.0}})
    return sweep


def test_the_comparison_rows_of_runs_a_baseline_and_the_paper(mixed_sweep):
    from llasmol.analysis.paper import PAPER_SOURCES

    table = analysis.compare_table(mixed_sweep, paper_models=["LlaSMol-Mistral", "GPT-4"])
    heads = ["forward_synthesis/exact_match", "name_conversion-s2f/exact_match", "property_prediction-bbbp/accuracy",
             "property_prediction-esol/rmse"]
    assert table.columns == ["variant", "source", "lora", "trainable", "percent", "paper_trainable", "paper_percent",
                             "validation", "val/loss", "paper_source", *heads]
    assert table.title == "Variants beside the paper"
    rmse = ((0.5**2 + 2.0**2) / 2) ** 0.5
    paper = [[PAPER_RESULTS[m].get(t, {}).get(k) for t, k in (h.split("/") for h in heads)]
             for m in ("LlaSMol-Mistral", "GPT-4")]
    expected = [
        # Two runs would share the label tiny/lite: each is named by its folder.
        ["0_tiny_lite", "run", "lite", 100, 10.0, 8.4e6, 0.12, "val-step10", 3.25, None, 0.2, 1 / 3, 0.25, rmse],
        ["2_tiny_lite", "run", "lite", 100, 10.0, 8.4e6, 0.12, "val-step10", None, None, 0.4, 1 / 3, 0.25, rmse],
        ["3_run", "run", None, 5, None, None, None, "val-step1", None, None, 0.0, None, None, None],
        ["0_tiny_lite (test)", "run", "lite", 100, 10.0, None, None, "test", None, None, 1.0, None, None, None],
        ["baseline:rdkit (test)", "baseline", None, None, None, None, None, "test", None, None, None, 1.0, None, None],
        ["LlaSMol-Mistral", "paper", "full", None, None, 40.0e6, 0.59, "test", None,
         PAPER_SOURCES["LlaSMol-Mistral"].label, *paper[0]],
        ["GPT-4", "paper", None, None, None, None, None, "test subset", None, PAPER_SOURCES["GPT-4"].label, *paper[1]],
    ]
    assert [r[:10] for r in table.rows] == [r[:10] for r in expected]
    for row, want in zip(table.rows, expected):
        assert row[10:] == [pytest.approx(v) if v is not None else None for v in want[10:]], row[0]
    assert analysis.variant_labels(analysis.load_sweep(mixed_sweep)) == [
        "0_tiny_lite", "baseline:rdkit", "2_tiny_lite", "3_run"]


def test_the_ablation_data_of_runs_and_a_baseline(mixed_sweep):
    data = analysis.ablation_data(analysis.load_sweep(mixed_sweep))
    labels = ["0_tiny_lite", "baseline:rdkit", "2_tiny_lite", "3_run"]
    assert list(data)[:4] == ["val/loss", "train/loss", "trainable (M)", "minutes"]
    assert data["val/loss"] == dict(zip(labels, [3.25, None, None, None]))
    assert data["train/loss"] == dict(zip(labels, [3.0, None, None, None]))
    assert data["trainable (M)"] == dict(zip(labels, [pytest.approx(1e-4), None, pytest.approx(1e-4),
                                                      pytest.approx(5e-6)]))
    assert data["minutes"] == dict(zip(labels, [1.5, None, None, None]))  # result.json's 90 seconds
    # Answered between the tags: 12 of the 15 samples (a refusal, a skipped prompt and an empty yes/no are not);
    # files without their counts have no share.
    assert data["answered"] == dict(zip(labels, [pytest.approx(0.8), None, pytest.approx(0.8), None]))
    assert data["forward_synthesis/exact_match"] == dict(zip(labels, [pytest.approx(0.2), None, pytest.approx(0.4),
                                                                      0.0]))
    # A baseline's bars are its test split's numbers.
    assert data["name_conversion-s2f/exact_match"] == dict(zip(labels, [pytest.approx(1 / 3), 1.0,
                                                                        pytest.approx(1 / 3), None]))
    chosen = analysis.ablation_data(mixed_sweep, {"forward_synthesis": "validity"})
    assert "forward_synthesis/validity" in chosen and "forward_synthesis/exact_match" not in chosen


def test_the_paper_table_has_every_task_unless_told_and_each_systems_caveat():
    from llasmol.analysis.paper import PAPER_MODELS

    table = analysis.paper_table()
    assert table.columns[:4] == ["system", "kind", "paper_source", "caveat"]
    assert table.column("system") == list(PAPER_MODELS)
    tasks = {c.split("/")[0] for c in table.columns[4:]}
    assert tasks == {t for m in PAPER_MODELS for t in PAPER_RESULTS[m]}  # every task any system has
    assert table.row("GPT-4")["caveat"].startswith("Table 3's GPT-4 row differs from the 0-shot rows")
    assert table.row("LlaSMol-Mistral")["caveat"] is None  # no caveat: an empty cell, not ""
    chosen = analysis.paper_table(["forward_synthesis"], models=["GPT-4"],
                                  metrics={"forward_synthesis": ["validity", "exact_match"]})
    assert chosen.columns[4:] == ["forward_synthesis/validity", "forward_synthesis/exact_match"]
    assert chosen.title == "The paper's reported numbers (test set)"


# --------------------------------------------------------------------------- the report command, exactly


def test_a_validation_without_predictions_gets_the_tables_its_metrics_allow(run_dir, capsys):
    written = report_main([str(run_dir), "--validation", "val-step2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"note: {run_dir} has no predictions/val-step2.jsonl: no failure breakdown or worst "
                      "examples")
    report = run_dir / "report"
    # No records: no trivial floor, failure breakdown or worst examples; the rest in this order.
    assert written == [report / name for name in ("metrics.md", "metrics.csv", "intervals.md", "intervals.csv",
                                                  "topk.csv", "topk.png", "trends.csv", "trends.png")]
    assert out[1:] == [f"wrote {p}" for p in written]
    assert all(p.is_file() for p in written) and not (report / "failures.md").exists()
    md = (report / "metrics.md").read_text()
    assert md.startswith("How low to expect: the tiny demo model") and "run: headline metrics at val-step2" in md
    assert (report / "intervals.md").read_text().startswith(
        "Percentile intervals of 1,000 bootstrap resamples of the scored samples")
    assert "| forward_synthesis | exact_match | 0.000 (n=5, too few) | 5 |" in md  # the early validation's numbers
    # Another model's report has no note about the demo model's zeros.
    write_json(run_dir / "params.json", {"model": "mistral", "lora": "lite", "trainable": 1, "total": 2})
    report_main([str(run_dir), "--validation", "val-step2"])
    assert (report / "metrics.md").read_text().startswith("**run: headline metrics at val-step2**\n")


def test_the_report_command_passes_its_options_on(run_dir, tmp_path, monkeypatch, capsys):
    import llasmol.analysis.report_folder as report

    calls = []
    monkeypatch.setattr(report, "report_run", lambda *args: calls.append(args) or [])
    report_main([str(run_dir)])
    assert calls[-1] == (run_dir, None, None, 5, False)  # the defaults: latest validation, 5 worst, headlines
    report_main([str(run_dir), "--validation", "val-step2", "--worst", "2", "--all-metrics", "--out", "x"])
    assert calls[-1] == (run_dir, "x", "val-step2", 2, True)
    with pytest.raises(SystemExit) as refused:
        report_main([str(run_dir), "--worst", "-3"])
    assert refused.value.code == 2 and len(calls) == 2  # refused before any work
    assert capsys.readouterr().err == "error: --worst -3 must be a whole number >= 0 (worst examples per task; 0: none)\n"
    with pytest.raises(SystemExit) as help_exit:
        report_main(["--help"])
    assert help_exit.value.code == 0
    assert "Write an analysis report of a run (or a multirun) into its `report/` folder." in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        report_main([str(run_dir), str(run_dir), str(run_dir)])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == (
        "error: 3 paths given: give one run or multirun directory, or two runs to compare")
    assert len(calls) == 2


def test_a_report_that_cannot_be_written_is_one_line_naming_the_file(run_dir, tmp_path, monkeypatch, capsys):
    import errno

    from llasmol.core.files import WRITE_ELSEWHERE

    before = WRITE_ELSEWHERE.get()
    chart = run_dir / "report" / "topk.png"

    def refuse(*args, filename=str(chart), **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", filename) if filename else OSError(errno.EROFS, "x")

    monkeypatch.setattr(analysis, "plot_topk", refuse)
    with pytest.raises(SystemExit) as stop:
        report_main([str(run_dir)])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == (
        f"error: cannot write {chart}: read-only file system; make that folder writable or write the report "
        "elsewhere with --out <folder>")
    # An error that names no file: the folder given (--out, else the run) is named.
    monkeypatch.setattr(analysis, "plot_topk", lambda *a, **k: refuse(filename=None))
    with pytest.raises(SystemExit):
        report_main([str(run_dir)])
    assert capsys.readouterr().err.startswith(f"error: cannot write {run_dir}: read-only file system;")
    with pytest.raises(SystemExit):
        report_main([str(run_dir), "--out", str(tmp_path / "elsewhere")])
    assert capsys.readouterr().err.startswith(f"error: cannot write {tmp_path / 'elsewhere'}: read-only")
    assert WRITE_ELSEWHERE.get() == before  # the run commands' advice is back once report is done
    # The report's folder itself cannot be made: that folder is named.
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: refuse(filename=None))
    with pytest.raises(SystemExit):
        report_main([str(run_dir), "--out", str(tmp_path / "new")])
    assert capsys.readouterr().err.startswith(f"error: cannot write {tmp_path / 'new'}: read-only file system;")
    with pytest.raises(SystemExit):
        report_main([str(run_dir)])
    assert capsys.readouterr().err.startswith(f"error: cannot write {run_dir / 'report'}: read-only file system;")


def test_worst_example_pictures_are_listed_only_where_drawn(tmp_path, capsys):
    """A SMILES task whose golds no toolkit can draw gets no picture, and the report does not claim one."""
    recs = [{"task": "forward_synthesis", "index": 0, "input": "q0", "gold": ["CCO"], "predictions": [smiles("CC")]},
            {"task": "retrosynthesis", "index": 1, "input": "q1", "gold": ["C1CC("], "predictions": [smiles("CC")]},
            {"task": "name_conversion-s2f", "index": 2, "input": "f0", "gold": ["C2H6O"],
             "predictions": ["<MOLFORMULA> CH4 </MOLFORMULA>"]}]
    run = tmp_path / "run"
    write_json(run / "params.json", {"model": "tiny", "lora": "lite"})
    write_json(run / "metrics" / "val-step1.json", score_records(recs))
    write_jsonl(run / "predictions" / "val-step1.jsonl", recs)
    written = report_main([str(run)])
    capsys.readouterr()
    assert sorted(p.name for p in written if p.name.startswith("worst_")) == ["worst_forward_synthesis.png"]
    assert sorted(p.name for p in (run / "report").glob("worst_*")) == ["worst_forward_synthesis.png"]


def test_a_run_with_nothing_scored_yet_says_so_once(tmp_path, capsys):
    from llasmol.analysis.runs import NO_VALIDATION

    fresh = tmp_path / "fresh"
    write_json(fresh / "params.json", {"model": "tiny", "lora": "full"})
    with pytest.raises(SystemExit) as stop:
        report_main([str(fresh)])
    assert stop.value.code == 2 and capsys.readouterr().err.strip() == (
        f"error: {fresh} {NO_VALIDATION} (nor an evaluated split: metrics/<split>.json)")
    assert not (fresh / "report").exists()


def test_a_report_into_a_virtual_folder_is_one_line_before_any_chart(run_dir, capsys):
    with pytest.raises(SystemExit) as stop:
        report_main([str(run_dir), "--out", "/proc/llasmol-report"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --out /proc/llasmol-report cannot be written: /proc is on a "
                                              "virtual file system")
