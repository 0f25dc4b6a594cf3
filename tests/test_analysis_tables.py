"""llasmol.analysis.tables: cell formatting, Markdown/CSV rendering, the printed metric lines, worst-example
order and columns, and the test-split table beside the paper (its title, column and note), on small in-memory
runs whose expected values are worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from refusals import refused

from llasmol.analysis.paper import PAPER_RESULTS, PAPER_SOURCES
from llasmol.analysis.runs import Run, Validation
from llasmol.analysis.tables import (Table, evaluation_note, evaluation_table, format_cell, headline_table,
                                     metric_lines, metric_table, metric_trends, worst_examples, worst_table)


def validation(records=None, metrics=None, step=10) -> Validation:
    return Validation(step=step, metrics_path=Path(f"val-step{step}.json"), predictions_path=None,
                      metrics=metrics or {}, _records=records)


def run_of(*validations: Validation, model="tiny", **kwargs) -> Run:
    return Run(path=Path("/runs/demo"), params={"model": model, "lora": "lite"}, validations=list(validations),
               **kwargs)


# --------------------------------------------------------------------------- cells and rendering


def test_a_cell_reads_as_a_dash_an_integer_or_a_rounded_fraction():
    assert format_cell(None) == "-"
    assert format_cell(math.nan) == "-" and format_cell(math.inf) == "-"
    assert format_cell(1.0) == "1" and format_cell(-2.0) == "-2" and format_cell(12.0) == "12"
    assert format_cell(0.0) == "0.000"  # a zero score is a fraction, not a count
    assert format_cell(0.5) == "0.500" and format_cell(2.5) == "2.500" and format_cell(0.12345, 2) == "0.12"
    assert format_cell(3) == "3" and format_cell("fs") == "fs"


def test_a_markdown_table_has_its_title_header_rule_and_one_line_a_row():
    table = Table(["task", "exact_match", "answer"], [["fs", 0.25, None], ["rs", 1.0, "a|b\nc"]], title="T")
    assert table.to_markdown() == ("**T**\n\n| task | exact_match | answer |\n|---|---|---|\n"
                                   "| fs | 0.250 | - |\n| rs | 1 | a\\|b c |\n")
    assert str(table) == table.to_markdown() == table._repr_markdown_()
    assert Table(["a"], [[1]]).to_markdown() == "| a |\n|---|\n| 1 |\n"  # no title, no title lines
    # Cells are cut at 80 characters unless told otherwise.
    long = Table(["answer"], [["C" * 81], ["C" * 80]]).to_markdown().splitlines()
    assert long[-2:] == ["| " + "C" * 79 + "… |", "| " + "C" * 80 + " |"]
    assert Table(["x"], [[0.5]]).to_markdown(digits=1).splitlines()[-1] == "| 0.5 |"


def test_csv_has_the_header_and_blank_cells_for_none():
    table = Table(["task", "exact_match", "num_samples"], [["fs", 0.25, 4], ["rs", None, 0]])
    assert table.to_csv() == "task,exact_match,num_samples\nfs,0.25,4\nrs,,0\n"


def test_a_row_is_found_by_its_first_cell():
    table = Table(["task", "value"], [["fs", 1], ["rs", 2]])
    assert table.row("rs") == {"task": "rs", "value": 2}
    assert table.records() == [{"task": "fs", "value": 1}, {"task": "rs", "value": 2}]
    with pytest.raises(KeyError):
        table.row(2)  # a value of another column is no row's name


def test_printed_metric_lines_without_intervals():
    results = {"fs": {"exact_match": 0.5, "num_samples": 2.0}, "property_prediction-esol": {"rmse": 2.0}}
    # fs is no task name: none of its metrics is a headline, so only the count shows.
    assert metric_lines(results).splitlines() == ["fs                        num_samples=2",
                                                  "property_prediction-esol  rmse=2"]
    assert metric_lines(results, all_metrics=True).splitlines()[0] == "fs                        exact_match=0.5000  num_samples=2"
    assert metric_lines({"forward_synthesis": {"exact_match": "n/a"}}) == "forward_synthesis  exact_match=n/a"
    assert metric_lines({}) == ""


# --------------------------------------------------------------------------- metric and trend tables


def test_headline_and_metric_tables_read_a_validation_directly():
    metrics = {"forward_synthesis": {"validity": 0.75, "custom": 7.0, "exact_match": 0.5, "num_samples": 4.0},
               "property_prediction-esol": {"rmse": 1.25, "num_samples": 2.0}}
    val = validation(metrics=metrics)
    head = headline_table(val)
    assert head.title == "Headline metrics at val-step10"
    assert head.rows == [["forward_synthesis", "exact_match", 0.5, 4.0],
                         ["property_prediction-esol", "rmse", 1.25, 2.0]]
    table = metric_table(val)
    # The package's order first (scores, then counts), then names it does not know, in the order met.
    assert table.columns == ["task", "exact_match", "validity", "rmse", "num_samples", "custom"]
    assert table.title == "Metrics at val-step10"
    assert metric_table(run_of(val), metrics=["validity"]).rows == [["forward_synthesis", 0.75],
                                                                    ["property_prediction-esol", None]]


def test_metric_trends_of_several_metrics_one_column_each_task_and_metric():
    early = validation(metrics={"forward_synthesis": {"exact_match": 0.0, "validity": 0.5}}, step=2)
    late = validation(metrics={"forward_synthesis": {"exact_match": 0.25, "validity": 0.75},
                               "retrosynthesis": {"validity": 1.0}}, step=4)
    trends = metric_trends(run_of(early, late), metrics=["validity", "exact_match"])
    assert trends.columns == ["step", "forward_synthesis/validity", "forward_synthesis/exact_match",
                              "retrosynthesis/validity"]
    assert trends.rows == [[2, 0.5, 0.0, None], [4, 0.75, 0.25, 1.0]]


# --------------------------------------------------------------------------- worst examples


def sample(task, index, prediction, gold, skipped=False, raw_input=None):
    record = {"task": task, "index": index, "input": f"in{index}", "gold": [gold],
              "predictions": None if skipped else [prediction], "skipped": skipped}
    if raw_input:
        record["raw_input"] = raw_input
    return record


def test_worst_examples_order_categories_and_scores_and_keep_five_by_default():
    fs = "forward_synthesis"
    records = [
        sample(fs, 0, "<SMILES> CCO </SMILES>", "CCO"),  # correct: never among the worst
        sample(fs, 1, "", "CCO", skipped=True),  # skipped, before a missing answer in the file
        sample(fs, 2, "no tags", "CCO"),  # no answer
        sample(fs, 3, "<SMILES> C1CC </SMILES>", "CCO"),  # invalid
        sample(fs, 4, "<SMILES> CCN </SMILES>", "CCO", raw_input="A.B"),  # wrong, similarity 1/3
        sample(fs, 5, "<SMILES> CCCC </SMILES>", "CCO"),  # wrong, similarity 1/4: worse
        sample(fs, 6, "<SMILES> CCCO </SMILES>", "CCO"),  # wrong, similarity 1/2: least bad
        # ESOL: an invalid number before an exact one; the exact one is still a well-formed answer, first.
        sample("property_prediction-esol", 7, "<NUMBER> x </NUMBER>", "1.0"),
        sample("property_prediction-esol", 8, "<NUMBER> 1.0 </NUMBER>", "1.0"),
    ]
    run = run_of(validation(records=records))
    worst = worst_examples(run)
    # Wrong answers by Morgan similarity to the gold, lowest first; then invalid, missing, skipped; five of six.
    assert [s["index"] for s in worst[fs]] == [5, 4, 6, 3, 2]
    categories = [s["category"] for s in worst_examples(run, n=10)[fs]]
    assert categories == ["wrong", "wrong", "wrong", "invalid", "no_answer", "skipped"]
    assert [s["score"] for s in worst[fs][:3]] == pytest.approx([0.25, 1 / 3, 0.5])
    assert [s["index"] for s in worst["property_prediction-esol"]] == [8, 7]
    assert list(worst_examples(run, tasks=["property_prediction-esol"])) == ["property_prediction-esol"]
    table = worst_table(worst_examples(run, n=10, tasks=[fs]))
    rows = {r["index"]: r for r in table.records()}
    assert table.title == "Worst examples"
    # The core input where there is one, the raw top-1 text, all golds joined.
    assert rows[4]["input"] == "A.B" and rows[5]["input"] == "in5"
    assert rows[4]["answer"] == "CCN" and rows[4]["prediction"] == "<SMILES> CCN </SMILES>"
    assert rows[1]["prediction"] is None and rows[1]["answer"] is None and rows[1]["gold"] == "CCO"


def test_a_skipped_sample_comes_after_a_missing_answer_wherever_it_is_in_the_file():
    fs = "forward_synthesis"
    records = [sample(fs, 0, "", "CCO", skipped=True), sample(fs, 1, "no tags", "CCO")]
    assert [s["category"] for s in worst_examples(run_of(validation(records=records)))[fs]] == ["no_answer", "skipped"]


def test_worst_table_takes_the_first_of_several_predictions():
    fs = "forward_synthesis"
    record = {"task": fs, "index": 0, "input": "q", "gold": ["CCO", "OCC"],
              "predictions": ["<SMILES> CCN </SMILES>", "<SMILES> CCO </SMILES>"], "skipped": False}
    table = worst_table(worst_examples(run_of(validation(records=[record]))))
    assert table.columns == ["task", "index", "category", "score", "input", "answer", "gold", "prediction"]
    (row,) = table.records()
    assert row["prediction"] == "<SMILES> CCN </SMILES>" and row["answer"] == "CCN"
    assert row["gold"] == "CCO; OCC" and row["input"] == "q" and row["category"] == "wrong"


# --------------------------------------------------------------------------- test split beside the paper


TEST = {"forward_synthesis": {"exact_match": 0.5, "validity": 1.0, "num_samples": 2.0},
        "property_prediction-esol": {"rmse": 1.5, "num_samples": 2.0}}


def test_a_run_without_test_results_names_the_splits_it_has():
    with refused("/runs/demo", "no test results", "has: none", "data.split=test"):
        evaluation_table(run_of())
    with refused("/runs/demo", "no test results", "has: dev, val"):
        evaluation_table(run_of(evaluations={"val": TEST, "dev": TEST}))
    assert evaluation_table(run_of(evaluations={"dev": TEST}), split="dev").title == "demo: dev results"


def test_a_baseline_stands_beside_the_papers_first_model():
    run = run_of(evaluations={"test": TEST}, baseline={"method": "copy"})
    table = evaluation_table(run)
    source = PAPER_SOURCES["LlaSMol-Mistral"].label
    assert table.title == f"baseline:copy: test results beside LlaSMol-Mistral (paper, {source})"
    assert table.columns == ["task", "metric", "ours", "paper LlaSMol-Mistral"]
    fs = PAPER_RESULTS["LlaSMol-Mistral"]["forward_synthesis"]
    assert table.rows[:2] == [["forward_synthesis", "exact_match", 0.5, fs["exact_match"]],
                              ["forward_synthesis", "validity", 1.0, fs["validity"]]]
    assert table.rows[2:] == [["property_prediction-esol", "rmse", 1.5, None]]  # the headline where none is reported
    assert evaluation_note(run, table) == (
        "'-' in the paper column: ESOL and Lipo RMSE are printed in the paper (Table 12) but only the digit before "
        "the decimal point survives the text its numbers were transcribed from, so they are left out rather than "
        "guessed.\n\n")


def test_the_note_names_tasks_a_paper_row_has_no_value_for_and_is_empty_when_all_are_there():
    stout = run_of(model=None, evaluations={"test": {**TEST, "name_conversion-s2i": {"exact_match": 0.25}}},
                   system={"name": "stout-run", "paper_row": "STOUT"})
    table = evaluation_table(stout)
    assert table.columns[-1] == "paper STOUT"
    note = evaluation_note(stout, table)
    assert note.startswith("'-' in the paper column: ESOL and Lipo RMSE")
    assert note.endswith("; STOUT has no reported value for forward_synthesis.\n\n")
    assert "STOUT has no reported value for forward_synthesis, property" not in note
    complete = run_of(model="mistral", evaluations={"test": {"forward_synthesis": {"exact_match": 0.5}}})
    assert evaluation_note(complete, evaluation_table(complete)) == ""


def test_a_model_the_paper_has_no_row_for_gets_an_empty_paper_column_and_says_so():
    run = run_of(model="qwen", evaluations={"test": TEST})
    table = evaluation_table(run)
    assert table.title == "demo: test results" and table.columns[-1] == "paper"
    assert all(row[-1] is None for row in table.rows)
    assert evaluation_note(run, table) == (
        "Paper column empty: the paper reports no results for demo (model=qwen). Its LlaSMol rows stand beside "
        "runs on model=mistral, llama2, galactica, codellama.\n\n")
