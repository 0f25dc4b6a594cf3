"""The one evaluation pipeline: the same answers give the same files whichever command made them (a
baseline, a model's generation, evaluate of a predictions file, a validation's reducer), and a predictions
line is one record type that reads back to the line it was written from."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from conftest import compose_config
from llasmol.baseline import baseline
from llasmol.data.source import SMolInstructSource
from llasmol.evaluate import evaluate
from llasmol.inference.pipeline import Evaluation, ModelAnswers, RunFiles, Samples
from llasmol.inference.predictions import Prediction, make_record, read_predictions
from llasmol.metrics.reducer import reduced_metrics
from llasmol.metrics.scoring import GoldPool

TASKS = "data.tasks=[name_conversion-s2f,property_prediction-bbbp,forward_synthesis]"
FILES = ("predictions/test.jsonl", "metrics/test.json", "metrics/test.intervals.json")


def files_of(folder: Path, name: str = "test") -> list[bytes]:
    return [(folder / f.replace("test", name)).read_bytes() for f in FILES]


class Replay:
    """A generator that answers each query with the responses a file gave it (a model with known answers)."""

    def __init__(self, records: list[dict]) -> None:
        self.answers = defaultdict(list)
        for r in records:
            self.answers[r["input"]].append(r["predictions"])

    def generate_batches(self, queries, settings):
        yield list(range(len(queries))), [self.answers[q].pop(0) for q in queries]


def test_the_same_answers_give_the_same_files_from_every_path(tmp_path):
    first = tmp_path / "baseline"
    cfg = compose_config([f"paths.output_dir={first}", "method=nearest_neighbor", TASKS, "intervals.resamples=40"],
                         config_name="baseline")
    made = baseline(cfg)
    written = [json.loads(line) for line in (first / FILES[0]).read_text().splitlines()]
    assert {r["task"] for r in written} == {"name_conversion-s2f", "property_prediction-bbbp", "forward_synthesis"}

    # evaluate predictions= name=: the file kept as another system's row, scored by the same route
    row = tmp_path / "row"
    again = evaluate(compose_config([f"paths.output_dir={row}", f"predictions={first / FILES[0]}", "name=again",
                                     "intervals.resamples=40"], config_name="evaluate"))
    assert files_of(row) == files_of(first)
    assert again["metrics"] == made["metrics"] and again["intervals"] == made["intervals"]

    # a model that gives those answers, through evaluate's answerer
    source = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x", TASKS]).data)
    model = tmp_path / "model"
    outcome = Evaluation(RunFiles.named(model, "test"), cfg.intervals).run(
        ModelAnswers(Replay(written), cfg.generation), Samples.of(source, "test"))
    assert outcome.records == written and files_of(model) == files_of(first)

    # a validation: the DDP reducer's metrics, the pipeline's files
    val, name = tmp_path / "val", "val-step3"
    reduced = reduced_metrics(written, list(source.task_names()), torch.device("cpu"))
    assert reduced == made["metrics"]
    Evaluation(RunFiles.named(val, name), dict(cfg.intervals)).finish(written, reduced)
    assert files_of(val, name) == files_of(first)


def test_a_predictions_record_round_trips_to_the_same_json_line(tmp_path):
    source = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x"]).data)
    split = source.split("test")
    sider = {"task": "property_prediction-sider", "input": "Is <SMILES> CCO </SMILES> hepatotoxic?",
             "raw_input": "CCO", "target": "Hepatobiliary disorders", "raw_output": "No"}
    records = [make_record(0, split[0], GoldPool(), ["<SMILES> CCO </SMILES>", "no tags"]),
               make_record(1, split[1], GoldPool(), None),  # skipped: over the prompt limit
               make_record(7, sider, GoldPool(), ["<BOOLEAN> No </BOOLEAN>"])]
    assert list(records[0]) == ["task", "index", "input", "raw_input", "gold", "predictions", "answers", "skipped"]
    assert list(records[2])[:5] == ["task", "index", "input", "raw_input", "target"]
    assert records[1]["predictions"] is None and records[1]["answers"] is None and records[1]["skipped"] is True
    # a base protocol's fields come after ours, and stay
    records[0].update(query="Q: CCO", responses=["CCO"])
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    for line in lines:
        assert json.dumps(Prediction.from_dict(json.loads(line)).to_dict(), ensure_ascii=False) == line
    path = tmp_path / "p.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    read = read_predictions(path)
    assert read[0] == records[0] and read[2] == records[2]
    assert read[1]["predictions"] == [] and read[1]["skipped"] is True  # the reader's lists, never None
