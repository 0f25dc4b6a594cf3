"""Base models asked as the paper asked them (k-shot Figure 3 queries, Galactica's and Molinst's forms) and
read with the official extraction rules, through `evaluate ckpt=none` on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import SEED, compose_config
from omegaconf import OmegaConf
from refusals import refused

from llasmol.core.tasks import TASK_NAMES
from llasmol.data.untuned_queries import (
    GALACTICA,
    ICL,
    MOLINST,
    Example,
    galactica_query,
    icl_query,
    molinst_query,
)
from llasmol.inference.prompting import (
    Protocol,
    build_queries,
    draw_examples,
    protocol_for,
    read_answers,
)
from llasmol.metrics.answer_rules import extract_base_answer

MODELS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "model").glob("*.yaml"))
# The paper's protocol per base (Section 5.2, App. A.2.2-A.2.3): (style, shots, rules).
PAPER = {"mistral": ("icl", 1, "mistral"), "llama2": ("icl", 1, "llama"), "llama2_13b": ("icl", 1, "llama"),
         "codellama": ("icl", 1, "codellama"), "galactica": ("galactica", 0, "gal"), "tiny": ("icl", 1, "mistral")}
# Bases the paper did not evaluate get the protocol it gave its general-purpose bases (Mistral's).
PAPER.update({model: PAPER["mistral"] for model in MODELS if model not in PAPER})


def test_every_table_has_every_task():
    assert list(ICL) == list(GALACTICA) == list(MOLINST) == list(TASK_NAMES)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_a_one_shot_query_holds_one_example_and_the_question(task):
    t = ICL[task]
    shot = Example("SHOT_IN", "SHOT_OUT", "Nausea")
    query = icl_query(task, Example("ASKED_IN", "HIDDEN", "Nausea"), [shot])
    assert query.startswith(f"{t.general}\n{t.specific}\n\n")
    lines = query.split("\n\n", 1)[1].split("\n")
    output_title = t.output_title.replace("{target}", "Nausea")
    assert lines == [f"{t.input_title}: SHOT_IN", f"{output_title}: SHOT_OUT", f"{t.input_title}: ASKED_IN",
                     f"{output_title}:"]
    assert "HIDDEN" not in query
    assert icl_query(task, Example("ASKED_IN", target="Nausea")).count(f"{t.input_title}:") == 1  # 0-shot


def test_figure_3_forward_synthesis_template_as_printed():
    t = ICL["forward_synthesis"]
    assert (t.input_title, t.output_title) == ("Reactants and reagents SMILES", "Product SMILES")
    assert t.general.startswith("You are an expert chemist. Given the SMILES representation of reactants and reagents")
    assert t.specific.endswith("Your reply must be valid and chemically reasonable.")


def _bundled(split: str):
    from llasmol.data.source import SMolInstructSource

    cfg = compose_config(["paths.output_dir=/x"], "evaluate")
    return SMolInstructSource.from_config(OmegaConf.to_container(cfg.data, resolve=True)).split(split)


def test_one_shot_examples_come_from_the_training_split_of_the_same_task_seeded():
    test, train = _bundled("test"), _bundled("train")
    starts, start = {}, 0
    for task, count in test.counts().items():
        starts[task], start = start, start + count
    indices = sorted(starts.values())  # the first test sample of every task
    protocol = Protocol("icl", 1, "mistral", seed=SEED)
    queries = build_queries(protocol, test, indices, train)
    training_pairs = {}
    for j in range(len(train)):
        s = train[j]
        training_pairs.setdefault(s["task"], set()).add((str(s["raw_input"]), str(s["raw_output"])))
    for i in indices:
        sample, t = test[i], ICL[test[i]["task"]]
        body = queries[i].split("\n\n", 1)[1].split("\n")
        assert len(body) == 4 and body[2] == f"{t.input_title}: {sample['raw_input']}"
        shot = (body[0].split(": ", 1)[1], body[1].split(": ", 1)[1])
        assert shot in training_pairs[sample["task"]]
    assert build_queries(protocol, test, indices, train) == queries  # seeded
    assert build_queries(Protocol("icl", 1, "mistral", seed=14), test, indices, train) != queries
    # three shots are three distinct training samples
    three = draw_examples(train, indices[0], test[indices[0]]["task"], 3, 13)
    assert len({(e.input, e.output) for e in three}) == 3
    # as many shots as the task has training samples: exactly those samples, none of a neighbouring task
    for task, count in train.counts().items():
        every = draw_examples(train, indices[0], task, count, 13)
        assert {(e.input, e.output) for e in every} == {p for p in training_pairs[task]} and len(every) == count


def test_more_shots_than_training_samples_is_one_error():
    train = _bundled("train")
    with refused("100000-shot", "forward_synthesis", "prompting.shots"):
        draw_examples(train, 0, "forward_synthesis", 100000, 13)


def test_a_task_missing_from_the_training_split_has_no_examples_to_draw():
    class OneTask:  # a training split holding forward synthesis only
        def counts(self):
            return {"forward_synthesis": 2}

        def __getitem__(self, i):
            return {"raw_input": f"in{i}", "raw_output": f"out{i}", "target": None}

    assert len(draw_examples(OneTask(), 0, "forward_synthesis", 2, 13)) == 2
    with refused("1-shot", "retrosynthesis", "has 0", "prompting.shots"):
        draw_examples(OneTask(), 0, "retrosynthesis", 1, 13)


@pytest.mark.parametrize("style, form", [("galactica", galactica_query), ("molinst", molinst_query)])
def test_zero_shot_styles_ask_each_sample_in_their_own_form(style, form):
    test = _bundled("test")
    indices = [0, len(test) - 1]
    queries = build_queries(Protocol(style, 0, "gal" if style == "galactica" else "mol", 0), test, indices)
    assert queries == {i: form(test[i]["task"], Example(str(test[i]["raw_input"]), str(test[i]["raw_output"]),
                                                       test[i].get("target"))) for i in indices}
    assert queries[0] != queries[indices[1]]
    for i, query in queries.items():  # each the sample's own question, in the style's own shape
        assert str(test[i]["raw_input"]) in query
        assert query.endswith("### Response:\n") == (style == "molinst") and ("### Input:" in query) == (style == "molinst")


# A response of each task's kind, after Galactica's query (which ends with the title its rule reads).
GAL_RESPONSES = {"forward_synthesis": "CCO[END_I_SMILES]", "retrosynthesis": "CC.O[END_I_SMILES]",
                 "molecule_captioning": "A small alcohol.\nMore.", "molecule_generation": "CCO[END_I_SMILES]",
                 "name_conversion-i2f": "C2H6O\n", "name_conversion-i2s": "CCO[END_SMILES]",
                 "name_conversion-s2f": "C2H6O\n", "name_conversion-s2i": "ethanol.\n"}
GAL_EXPECTED = {"forward_synthesis": "CCO", "retrosynthesis": "CC.O", "molecule_captioning": "A small alcohol.",
                "molecule_generation": "CCO", "name_conversion-i2f": "C2H6O", "name_conversion-i2s": "CCO",
                "name_conversion-s2f": "C2H6O", "name_conversion-s2i": "ethanol"}


@pytest.mark.parametrize("task", TASK_NAMES)
def test_galactica_and_molinst_queries_carry_the_titles_their_rules_read(task):
    question = Example("CCO", target="Nausea")
    gal = galactica_query(task, question)
    response = GAL_RESPONSES.get(task, "Yes\nNo" if task not in ("property_prediction-esol", "property_prediction-lipo")
                                 else "-1.2\n")
    expected = GAL_EXPECTED.get(task, response.split("\n")[0])
    assert extract_base_answer("gal", task, gal + " " + response) == expected
    # As evaluate reads a response: as generated (not stripped), after the query.
    record = {"index": 0, "task": task, "predictions": [" " + response]}
    read = read_answers(Protocol("galactica", 0, "gal", 0), [record], {0: gal})[0]
    assert read["answers"] == [expected] and read["predictions"] == [" " + response]
    mol = molinst_query(task, question)
    assert mol.endswith("### Input:\nCCO\n\n### Response:\n")
    assert ("Nausea" in mol) == ("Nausea" in gal) == (task == "property_prediction-sider")
    answer = extract_base_answer("mol", task, mol + "yes, it does.</s>")
    record = {"index": 0, "task": task, "predictions": ["yes, it does.</s>"]}
    assert read_answers(Protocol("molinst", 0, "mol", 0), [record], {0: mol})[0]["answers"] == [answer]
    assert answer == ("Yes" if task.startswith("property_prediction-") and task not in
                      ("property_prediction-esol", "property_prediction-lipo") else
                      "yes, it does" if task.endswith(("esol", "lipo")) else "yes, it does.")


@pytest.mark.parametrize("model", MODELS)
def test_the_setting_composes_for_every_base_with_the_papers_protocol(model):
    cfg = compose_config(["paths.output_dir=/x", "ckpt=none", f"model={model}"], "evaluate")
    protocol = protocol_for(cfg.prompting, bare=True)
    assert (protocol.style, protocol.shots, protocol.rules) == PAPER[model]
    assert protocol.seed == cfg.seed
    assert protocol_for(cfg.prompting, bare=False) is None  # a tuned checkpoint keeps its own queries
    mol = compose_config(["paths.output_dir=/x", f"model={model}", "prompting=molinst"], "evaluate")
    assert protocol_for(mol.prompting, bare=False) == Protocol("molinst", 0, "mol", cfg.seed)
    k = compose_config(["paths.output_dir=/x", f"model={model}", "prompting=mistral", "prompting.shots=5"], "evaluate")
    assert protocol_for(k.prompting, bare=True).shots == 5


@pytest.mark.parametrize("overrides,named", [
    ({"style": "icll"}, ("prompting.style='icll'", "dataset, icl, galactica, molinst")),
    ({"shots": -1}, ("prompting.shots=-1", ">= 0")),
    ({"shots": True}, ("prompting.shots=True",)),
    ({"style": "galactica", "rules": "gal", "shots": 1},
     ("prompting.shots=1", "prompting.style=galactica", "prompting.shots=0")),
    ({"rules": "gpt4"}, ("prompting.rules='gpt4'",)),
])
def test_bad_prompting_settings_are_one_error(overrides, named):
    """The command's check (the schema) and then the protocol it asks for, as `evaluate` meets them."""
    from llasmol.core.schema import check_config

    cfg = compose_config(["paths.output_dir=/x", "ckpt=none", "prompting=mistral",
                          *(f"prompting.{k}={v}" for k, v in overrides.items())], "evaluate")
    with refused(*named):
        check_config(cfg)
        protocol_for(cfg.prompting, bare=True)


def test_evaluate_ckpt_none_one_shot_on_the_tiny_model(tmp_path, monkeypatch):
    """The bare tiny model asked 1-shot as the paper asked Mistral: each record keeps the query (one training
    example and the question), the responses as generated and the answers Mistral's rules read; the row is labelled
    with its protocol; re-scoring the predictions file gives the same metrics."""
    from llasmol.analysis.runs import load_run
    from llasmol.evaluate import evaluate
    from llasmol.inference.predictions import read_predictions

    tasks = ["forward_synthesis", "property_prediction-bbbp"]
    cfg = compose_config([f"paths.output_dir={tmp_path}", "ckpt=none", "data.max_samples_per_task={test:2}",
                          "generation.max_new_tokens_limit=4", f"data.tasks=[{','.join(tasks)}]",
                          "generation.max_prompt_tokens=2048", "intervals.resamples=0"], "evaluate")
    from llasmol.inference.beam_search import BeamGenerator

    stripped, batch = [], BeamGenerator._generate_batch
    monkeypatch.setattr(BeamGenerator, "_generate_batch", lambda self, *a: stripped.append(self.strip) or batch(self, *a))
    result = evaluate(cfg)
    assert stripped and not any(stripped)  # the rules read the responses as generated
    records = read_predictions(tmp_path / "predictions" / "test.jsonl")
    assert sorted(r["task"] for r in records) == sorted(t for t in tasks for _ in range(2))
    for r in records:
        t = ICL[r["task"]]
        assert r["query"].count(f"{t.input_title}: ") == 2 and r["query"].endswith(f"{t.output_title}:")
        assert r["query"].split("\n")[-2] == f"{t.input_title}: {r['raw_input']}"
        assert r["extraction"] == "mistral" and "responses" not in r
        assert r["answers"] == [extract_base_answer("mistral", r["task"], x) for x in r["predictions"]]
    for task in tasks:
        no_answer = sum(r["answers"][0] is None for r in records if r["task"] == task)
        assert result["metrics"][task]["num_no_answer"] == no_answer
        assert result["metrics"][task]["num_samples"] == 2
    assert json.loads((tmp_path / "system.json").read_text())["name"] == "tiny (1-shot)"
    assert load_run(tmp_path).label == "tiny (1-shot)"
    rescored = evaluate(compose_config([f"paths.output_dir={tmp_path / 're'}",
                                        f"predictions={tmp_path / 'predictions' / 'test.jsonl'}", "intervals.resamples=0"], "evaluate"))
    assert json.dumps(rescored["metrics"], sort_keys=True) == json.dumps(result["metrics"], sort_keys=True)


@pytest.mark.slow
def test_cfg_job_prints_the_prompting_setting_for_every_base(tmp_path):
    import os
    import subprocess
    import sys

    for model in MODELS:
        given = ["model.name=someone/any-base", "model.path=/x"] if model == "hf" else []  # its id and folder
        proc = subprocess.run([sys.executable, "-m", "llasmol.evaluate", "ckpt=none", f"model={model}", *given,
                               "--cfg", "job"],
                              capture_output=True, text=True, cwd=tmp_path, timeout=600,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        printed = OmegaConf.create(proc.stdout).prompting
        assert (printed.style, printed.shots, printed.rules) == PAPER[model]


@pytest.mark.parametrize("model,protocol,label,paper_row", [
    ("mistral", Protocol("icl", 1, "mistral", 13), "Mistral (1-shot)", "Mistral"),
    ("mistral", Protocol("icl", 3, "mistral", 13), "Mistral (3-shot)", None),  # the paper has no such row
    ("codellama", Protocol("icl", 1, "codellama", 13), "Code Llama (1-shot)", "Code Llama"),
    ("galactica", Protocol("galactica", 0, "gal", 13), "Galactica (0-shot)", "Galactica"),
    ("llama2", Protocol("molinst", 0, "mol", 13), "Molinst (0-shot)", "Molinst"),
    ("tiny", Protocol("icl", 1, "mistral", 13), "tiny (1-shot)", None),
])
def test_a_protocol_row_is_labelled_and_set_beside_the_papers_row(tmp_path, model, protocol, label, paper_row):
    from llasmol.analysis.paper import PAPER_RESULTS
    from llasmol.analysis.runs import load_run
    from llasmol.analysis.tables import evaluation_table
    from llasmol.evaluate import _protocol_row

    cfg = OmegaConf.create({"ckpt": "none" if protocol.style != "molinst" else "zjunlp/llama2-molinst-molecule-7b"})
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "test.json").write_text(json.dumps({"name_conversion-s2f": {"exact_match": 0.25}}))
    _protocol_row(cfg, OmegaConf.create({"name": model}), protocol, tmp_path, "test", 4)
    run = load_run(tmp_path)
    assert run.label == label
    table = evaluation_table(run)
    assert (f"beside {paper_row} " in table.title) == (paper_row is not None)
    if paper_row:
        assert table.rows[0][:4] == ["name_conversion-s2f", "exact_match", 0.25,
                                     PAPER_RESULTS[paper_row]["name_conversion-s2f"]["exact_match"]]


def test_a_mistyped_prompting_choice_is_one_error():
    from llasmol.core.config import check_overrides

    with refused("prompting=mistrall", "molinst"):
        check_overrides("evaluate", ["ckpt=none", "prompting=mistrall"])


def test_promptings_refuse_selfies_data_before_loading_a_model(tmp_path):
    from llasmol.evaluate import evaluate

    cfg = compose_config([f"paths.output_dir={tmp_path}", "ckpt=none", "data.representation=selfies",
                          "model.path=/nonexistent"], "evaluate")
    with refused("prompting.style=icl", "data.representation=selfies", "prompting=dataset"):
        evaluate(cfg)
