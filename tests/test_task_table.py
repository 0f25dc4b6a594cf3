"""Tasks are a value (`llasmol.core.tasks.TaskTable`), not process state: two runs that declare the same task
name differently, read by one process in either order, are each scored by their own declaration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config
from refusals import refused

from llasmol import analysis
from llasmol.core.errors import UserError
from llasmol.core.run_dir import read_tasks
from llasmol.core.schema import check_config
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.evaluate import evaluate

# One name, two meanings: a solubility (scored by RMSE) in one run, a yes/no assay (accuracy) in the other.
AS_NUMBER = {"alpha": {"family": "number"}}
AS_BOOLEAN = {"alpha": {"family": "boolean", "headline": "mcc"}}


def _run(folder: Path, declared: dict, records: list[dict]) -> Path:
    (folder / "predictions").mkdir(parents=True)
    (folder / "tasks.json").write_text(json.dumps(declared))
    (folder / "predictions" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


@pytest.fixture
def two_runs(tmp_path):
    numbers = _run(tmp_path / "numbers", AS_NUMBER, [
        {"task": "alpha", "input": "CCO", "gold": "1.5", "predictions": ["<NUMBER> 1.0 </NUMBER>"]},
        {"task": "alpha", "input": "CCN", "gold": "-2.0", "predictions": ["<NUMBER> -1.0 </NUMBER>"]}])
    labels = _run(tmp_path / "labels", AS_BOOLEAN, [
        {"task": "alpha", "input": "CCO", "gold": "Yes", "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]},
        {"task": "alpha", "input": "CCN", "gold": "No", "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]}])
    return numbers, labels


def _scored(folder: Path) -> dict:
    cfg = compose_config([f"paths.output_dir={folder}/out", f"predictions={folder}/predictions/test.jsonl",
                          f"output={folder}/out/metrics.json"], config_name="evaluate")
    return evaluate(cfg)["metrics"]["alpha"]


@pytest.mark.parametrize("first", ["numbers", "labels"])
def test_two_runs_declaring_one_name_differently_are_each_scored_by_their_own(two_runs, first):
    numbers, labels = two_runs if first == "numbers" else two_runs[::-1]
    for folder in (numbers, labels, numbers):  # in one process, each read after the other, and again
        values = _scored(folder)
        if folder.name == "numbers":  # errors 0.5 and 1.0: RMSE sqrt((0.25 + 1) / 2)
            assert values["rmse"] == pytest.approx((1.25 / 2) ** 0.5) and "accuracy" not in values
        else:  # one of two right
            assert values["accuracy"] == 0.5 and "rmse" not in values
    # The report's reading of each run: its own table, its own headline.
    assert analysis.headline("alpha", analysis.load_run(two_runs[0]).table) == "rmse"
    assert analysis.headline("alpha", analysis.load_run(two_runs[1]).table) == "mcc"
    assert "alpha" not in SMOLINSTRUCT  # nothing of either run stayed behind


def test_runs_read_together_must_mean_one_task_by_one_name(two_runs):
    numbers, labels = (read_tasks(folder) for folder in two_runs)
    with refused("alpha", "declared twice", "scored differently"):
        numbers.with_declared(labels.declared)
    assert numbers.with_declared(numbers.declared) == numbers  # the same declaration again: the same table


def test_a_commands_table_is_its_own_config_and_a_runs_is_its_tasks_json(tmp_path):
    own = check_config(compose_config(["paths.output_dir=/x", "+data.new_tasks.beta.family=formula"])).tasks
    assert list(own.declared) == ["beta"] and own["beta"].answer_tag == "MOLFORMULA"
    plain = check_config(compose_config(["paths.output_dir=/x"])).tasks
    assert plain is SMOLINSTRUCT and "beta" not in plain  # the check before did not leave beta behind
    assert read_tasks(tmp_path) is SMOLINSTRUCT  # a folder without tasks.json adds nothing
    assert read_tasks(tmp_path, own) is own
    (tmp_path / "tasks.json").write_text(json.dumps({"gamma": {"family": "caption"}}))
    both = read_tasks(tmp_path, own)
    assert list(both.declared) == ["beta", "gamma"] and list(own.declared) == ["beta"]


@pytest.mark.parametrize("content, said", [
    ('["alpha"]', "holds a JSON list"),
    ("{", "is not valid JSON (Expecting property name"),
    ('{"alpha": {"family": "colour"}}', "data.new_tasks.alpha.family='colour'"),
    ('{"forward_synthesis": {"family": "smiles"}}', "is a SMolInstruct task name"),
])
def test_a_runs_tasks_json_is_read_as_checked_data(tmp_path, content, said):
    (tmp_path / "tasks.json").write_text(content)
    with refused(str(tmp_path / "tasks.json"), said):
        read_tasks(tmp_path)


@pytest.mark.parametrize("edit", [
    lambda f: f["declared"]["alpha"].update(headline="f1"),  # scored by another metric
    lambda f: f["declared"]["alpha"].update(pooled=True),
    lambda f: f["declared"].update(delta={"family": "number"}),  # a task added
    lambda f: f["declared"].pop("beta"),
    lambda f: f.update(sha256=f["sha256"][:-1] + "0" if f["sha256"][-1] != "0" else f["sha256"][:-1] + "1"),
    lambda f: f.update(declared=[]),
])
def test_a_tasks_json_edited_after_it_was_written_is_refused(tmp_path, edit):
    """`write_tasks` keeps the declarations' fingerprint: a change to how a task is read or scored, a task added or
    removed, or a changed fingerprint is one line naming the file and what to do; the file as written reads back
    (key order and spacing do not matter), and a file from before fingerprints (the declarations alone) still reads."""
    from llasmol.core.run_dir import write_tasks

    declared = {"alpha": {"family": "boolean", "headline": "mcc"}, "beta": {"family": "number", "num_beams": 3}}
    write_tasks(tmp_path, declared)
    assert read_tasks(tmp_path).declared == declared
    found = json.loads((tmp_path / "tasks.json").read_text())
    (tmp_path / "tasks.json").write_text(json.dumps({"sha256": found["sha256"], "declared": {
        "beta": {"num_beams": 3, "family": "number"}, "alpha": found["declared"]["alpha"]}}))
    assert dict(read_tasks(tmp_path)["beta"].generation)["num_beams"] == 3  # another order, the same declarations
    edit(found)
    (tmp_path / "tasks.json").write_text(json.dumps(found))
    with refused(str(tmp_path / "tasks.json"), "was changed after the command that wrote it", "restore it",
                 "evaluate predictions=<copy>"):
        read_tasks(tmp_path)
    (tmp_path / "tasks.json").write_text(json.dumps(declared))  # an older run's file
    assert read_tasks(tmp_path).declared == declared


def test_a_tasks_json_that_is_no_file_is_named(tmp_path):
    """What stands where tasks.json should be is named as what it is (a folder, a pipe, a dangling link, a link
    loop), never taken for no file (the run's own tasks would then be "unknown")."""
    import os

    path = tmp_path / "tasks.json"
    path.mkdir()
    with refused(str(path), "is a folder, not a regular file"):
        read_tasks(tmp_path)
    path.rmdir()
    os.mkfifo(path)
    with refused(str(path), "is a named pipe (FIFO), not a regular file"):
        read_tasks(tmp_path)
    path.unlink()
    path.symlink_to(tmp_path / "gone.json")
    with refused(str(path), "is a symbolic link to", "which does not exist"):
        read_tasks(tmp_path)
    path.unlink()
    path.symlink_to(tmp_path / "loop")
    (tmp_path / "loop").symlink_to(path)
    with refused(str(path), "is a symbolic link loop"):
        read_tasks(tmp_path)
    assert TaskTable() == SMOLINSTRUCT and len(SMOLINSTRUCT) == 14


def test_a_declared_tasks_beams_sit_over_the_default_and_under_generation_tasks():
    """Precedence of a task's beams: `generation.default` < its declaration < `generation.tasks.<task>`, each
    pair both ways round, and a table without the task takes the default."""
    from omegaconf import OmegaConf

    from llasmol.inference.beam_search import task_settings as settings

    def task_settings(*args):
        s = settings(*args)
        return s.num_beams, s.num_return_sequences, s.max_new_tokens

    table = TaskTable({"alpha": {"family": "smiles", "num_beams": 6, "num_return_sequences": 3}})
    gen = OmegaConf.create({"default": {"num_beams": 4, "num_return_sequences": 1, "max_new_tokens": 50},
                            "tasks": {}})
    assert task_settings(gen, "alpha", table) == (6, 3, 50)  # declared over the default, the rest default
    assert task_settings(gen, "alpha") == (4, 1, 50)  # SMolInstruct's table knows no alpha: the default
    gen.tasks["alpha"] = {"num_beams": 2, "num_return_sequences": 2}
    assert task_settings(gen, "alpha", table) == (2, 2, 50)  # generation.tasks over the declaration
    gen.tasks["alpha"] = {"max_new_tokens": 7}
    assert task_settings(gen, "alpha", table) == (6, 3, 7)  # only what it names
