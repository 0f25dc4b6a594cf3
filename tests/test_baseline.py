"""`python -m llasmol.baseline`: each method answers the bundled sample (and a small copy with the three tasks
the sample lacks), writes a predictions file like any other, and is scored and reported as a run is."""

from __future__ import annotations

import gc
import json
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_config
from refusals import refused, refused_cli

from llasmol import analysis
from llasmol.baseline import baseline
from llasmol.core.tasks import get_task
from llasmol.core.smiles import canonical_kekule
from llasmol.data.source import SMolInstructSource
from llasmol.evaluate import evaluate
from llasmol.inference.beam_search import task_settings
from llasmol.inference.predictions import read_predictions
from llasmol.metrics import extract_answer
from llasmol.analysis.report_folder import report_run

# The fields every predictions record carries (llasmol.inference.predictions.make_record).
RECORD_FIELDS = {"task", "index", "input", "raw_input", "gold", "predictions", "answers", "skipped"}


def run_method(folder: Path, *overrides: str) -> dict:
    cfg = compose_config([f"paths.output_dir={folder}", *overrides], config_name="baseline")
    return baseline(cfg)["metrics"]


def records_of(folder: Path, split: str = "test") -> list[dict]:
    return read_predictions(folder / "predictions" / f"{split}.jsonl")


# --------------------------------------------------------------------------- a copy with MC, MG and SIDER

MOLECULES = ["CCO", "CC(=O)O", "c1ccccc1", "CCN(CC)CC", "CC(C)O", "CCCCCC", "c1ccncc1", "CC(=O)Nc1ccc(O)cc1",
             "ClCCl", "CCOC(C)=O", "OCC(O)CO", "C1CCOC1", "CS(C)=O", "N#Cc1ccccc1", "CC(C)(C)O", "Oc1ccccc1"]
SIDE_EFFECTS = ("Hepatobiliary disorders", "Eye disorders")


def _caption(k: int) -> str:
    return f"The molecule is compound number {k}, a small organic molecule of class {k % 3}."


def write_extra_tasks(root: Path) -> Path:
    """SMolInstruct's layout with the three tasks the bundled sample lacks. SIDER: every molecule once per
    side effect, 'Yes' for the first and 'No' for the second, so only a model per side effect can be right."""
    tasks = {
        "molecule_captioning": lambda k, s: (s, _caption(k)),
        "molecule_generation": lambda k, s: (_caption(k), s),
        "property_prediction-sider": lambda k, s: (s, {SIDE_EFFECTS[0]: "Yes", SIDE_EFFECTS[1]: "No"}),
    }
    for task, pair in tasks.items():
        (root / "core_tag").mkdir(parents=True, exist_ok=True)
        (root / "core_tag" / f"{task}.json").write_text(json.dumps(get_task(task).core_tags()))
        (root / "template" / "instruction_tuning").mkdir(parents=True, exist_ok=True)
        (root / "template" / "instruction_tuning" / f"{task}.json").write_text(
            json.dumps([{"input": "Question: <INPUT>", "output": "<OUTPUT>"}]))
        for split in ("train", "dev", "test"):
            chosen = [k for k in range(len(MOLECULES)) if (k % 4 == 3) == (split == "test") and split != "dev"]
            chosen = chosen or [0]
            lines, samples = [], []
            for k in chosen:
                core_in, core_out = pair(k, canonical_kekule(MOLECULES[k]))
                lines.append(json.dumps({"input": core_in, "output": core_out}))
                for target in (SIDE_EFFECTS if isinstance(core_out, dict) else (None,)):
                    samples.append({"idx": len(lines) - 1, "template_id": 0, "target": target})
            (root / "raw" / split).mkdir(parents=True, exist_ok=True)
            (root / "raw" / split / f"{task}.jsonl").write_text("\n".join(lines) + "\n")
            folder = root / "sample" / "instruction_tuning" / split
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{task}.json").write_text(json.dumps({"template_name": "instruction_tuning", "samples": samples}))
    return root


@pytest.fixture(scope="module")
def extra_root(tmp_path_factory) -> Path:
    return write_extra_tasks(tmp_path_factory.mktemp("extra"))


# --------------------------------------------------------------------------- rdkit


def test_rdkit_formulas_match_every_s2f_gold_and_read_as_a_run(tmp_path):
    import time

    import torch

    threads, started = torch.get_num_threads(), time.perf_counter()
    try:
        torch.set_num_threads(1)
        metrics = run_method(tmp_path, "method=rdkit")
        assert torch.get_num_threads() == 2  # n_jobs (default 2) bounds the scoring's threads too
    finally:
        torch.set_num_threads(threads)
    wall = time.perf_counter() - started
    assert list(metrics) == ["name_conversion-s2f"]  # every other task of the sample is skipped
    s2f = metrics["name_conversion-s2f"]
    assert s2f["num_samples"] == 30 and s2f["exact_match"] == 1.0 and s2f["num_invalid"] == 0
    records = records_of(tmp_path)
    assert len(records) == 30
    for r in records:
        assert RECORD_FIELDS <= set(r) and not r["skipped"]
        assert r["predictions"] == [f"<MOLFORMULA> {r['answers'][0]} </MOLFORMULA>"]
    # The file re-scores to the same numbers through evaluate's own path.
    rescored = evaluate(compose_config(["paths.output_dir=/x", f"predictions={tmp_path}/predictions/test.jsonl"],
                                       config_name="evaluate"))["metrics"]
    assert rescored == json.loads((tmp_path / "metrics" / "test.json").read_text()) == metrics
    # Bootstrap intervals beside the metrics, as evaluate writes them: every answer right, so [1, 1].
    intervals = json.loads((tmp_path / "metrics" / "test.intervals.json").read_text())
    assert intervals["resamples"] == 1000 and intervals["tasks"]["name_conversion-s2f"]["exact_match"] == [1.0, 1.0]
    info = json.loads((tmp_path / "baseline.json").read_text())
    assert info["method"] == "rdkit" and info["tasks"] == ["name_conversion-s2f"] and len(info["skipped"]) == 10
    assert info["seconds"]["total"] > 0 and info["peak_rss_mib"] > 0
    # Seconds to the millisecond, each phase within the command's own time; memory to a tenth of a MiB.
    seconds = info["seconds"]
    assert set(seconds) == {"answer", "score", "total"} and all(round(v, 3) == v for v in seconds.values())
    assert 0 <= seconds["answer"] <= seconds["total"] <= wall and 0 <= seconds["score"] <= seconds["total"]
    assert round(info["peak_rss_mib"], 1) == info["peak_rss_mib"] and info["peak_rss_mib"] > 50
    assert info["n_jobs"] == 2 and info["seed"] == 13 and info["split"] == "test"  # conf/shared.yaml's seed
    # The report and the comparison read the folder as the run `baseline:rdkit`.
    written = {p.name for p in report_run(tmp_path)}
    assert {"test.md", "metrics.md", "failures.md", "worst.md", "topk.png"} <= written
    assert "baseline:rdkit: test results beside LlaSMol-Mistral" in (tmp_path / "report" / "test.md").read_text()
    table = analysis.compare_table([analysis.load_run(tmp_path)])
    row = table.row("baseline:rdkit (test)")
    assert row["source"] == "baseline" and row["name_conversion-s2f/exact_match"] == 1.0


def test_a_method_asked_for_a_task_it_cannot_answer_says_so(tmp_path):
    with refused("method=rdkit", "forward_synthesis", "name_conversion-s2f"):
        run_method(tmp_path, "method=rdkit", "data.tasks=[name_conversion-s2f,forward_synthesis]")
    with refused("no method", "method=<name>", "rdkit, opsin, fingerprint, nearest_neighbor"):
        run_method(tmp_path)


def test_an_output_that_is_a_folder_is_refused_before_the_method_reads_any_data(tmp_path):
    # output= names the metrics file; a folder there would be swapped for a JSON file at the very end.
    (tmp_path / "metrics_here").mkdir()
    with refused(f"output={tmp_path / 'metrics_here'}", "folder", untouched=tmp_path):
        run_method(tmp_path / "run", "method=rdkit", f"output={tmp_path / 'metrics_here'}", "data.path=/nonexistent")


def test_unknown_method_is_one_line_listing_the_methods(tmp_path):
    refused_cli(["llasmol.baseline", "method=nearest", f"hydra.run.dir={tmp_path}"], tmp_path,
                "method='nearest'", "rdkit, opsin, fingerprint, nearest_neighbor", untouched=tmp_path)


def test_a_mistyped_method_in_a_sweep_stops_before_the_first_method_runs(tmp_path):
    refused_cli(["llasmol.baseline", "--multirun", "method=rdkit,rdkt", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                tmp_path, "method='rdkt'", "rdkit, opsin, fingerprint, nearest_neighbor",
                untouched=tmp_path)  # rdkit, the first value, did not run either: no sweep folder


@pytest.mark.parametrize("override,named", [
    ("n_jobs=0", "n_jobs=0"),
    ("morgan.n_bits=100", "morgan.n_bits=100"),
    ("morgan.radius=-1", "morgan.radius=-1"),
    ("fingerprint.n_estimators=0", "fingerprint.n_estimators=0"),
    ("fingerprint.n_estimators=100001", "fingerprint.n_estimators=100001"),
    ("morgan.radius=17", "morgan.radius=17"),
    ("fingerprint.max_features=half", "fingerprint.max_features='half'"),
    ("fingerprint.max_features=1.5", "fingerprint.max_features=1.5"),
    ("nearest_neighbor.max_train_inputs=0", "nearest_neighbor.max_train_inputs=0"),
    ("nearest_neighbor.text_ngrams=[5,3]", "nearest_neighbor.text_ngrams=[5, 3]"),
])
def test_a_bad_setting_of_a_method_is_named_before_any_data_is_read(tmp_path, override, named):
    from llasmol.baseline import check_method

    method = "nearest_neighbor" if override.startswith(("nearest", "n_jobs", "morgan")) else "fingerprint"
    cfg = compose_config([f"paths.output_dir={tmp_path}", f"method={method}", override, "data.path=/nonexistent"],
                         config_name="baseline")
    for check in (check_method, baseline):
        with refused(named):
            check(cfg)
    check_method(compose_config([f"paths.output_dir={tmp_path}", f"method={method}"], config_name="baseline"))
    # the bounds themselves are allowed
    check_method(compose_config([f"paths.output_dir={tmp_path}", "method=fingerprint", "fingerprint.n_estimators=100000",
                                 "morgan.radius=16"], config_name="baseline"))


def test_a_report_over_a_run_and_two_baselines_has_a_row_for_each(tmp_path, capsys, ablation_titles):
    import csv

    from test_analysis import write_run

    from llasmol.report import main as report_main

    sweep = tmp_path / "sweep"
    run = write_run(sweep / "0_tiny_lite", "lite", 100)
    rdkit = run_method(sweep / "1_rdkit", "method=rdkit")
    forest = run_method(sweep / "2_fingerprint", "method=fingerprint",
                        "data.tasks=[property_prediction-esol,property_prediction-bbbp]")
    written = report_main([str(sweep)])
    capsys.readouterr()
    assert {p.name for p in written} == {"comparison.md", "comparison.csv", "ablation.png", "pairs.md", "pairs.csv"}
    assert ablation_titles == ["sweep: variants at their latest validation (or test split), 95% intervals"]  # baselines: test
    # Paired only where two rows scored the same samples: the two baselines share no task, the run validated.
    assert "No two runs share scored samples" in (sweep / "report" / "pairs.md").read_text()
    rows = {r["variant"]: r for r in csv.DictReader((sweep / "report" / "comparison.csv").open())}
    assert list(rows) == ["tiny/lite", "baseline:rdkit (test)", "baseline:fingerprint (test)", "LlaSMol-Mistral",
                          "LlaSMol-Llama 2"]
    assert [rows[v]["source"] for v in rows] == ["run", "baseline", "baseline", "paper", "paper"]
    latest = json.loads((run / "metrics" / "val-step10.json").read_text())
    assert float(rows["tiny/lite"]["name_conversion-s2f/exact_match"]) == pytest.approx(
        latest["name_conversion-s2f"]["exact_match"])
    assert float(rows["baseline:rdkit (test)"]["name_conversion-s2f/exact_match"]) == 1.0 == \
        rdkit["name_conversion-s2f"]["exact_match"]
    assert rows["baseline:rdkit (test)"]["property_prediction-bbbp/accuracy"] == ""  # rdkit has no such row
    assert float(rows["baseline:fingerprint (test)"]["property_prediction-bbbp/accuracy"]) == pytest.approx(
        forest["property_prediction-bbbp"]["accuracy"])
    markdown = (sweep / "report" / "comparison.md").read_text()
    assert all(f"| {variant} |" in markdown for variant in rows)


# --------------------------------------------------------------------------- opsin


def test_opsin_reproduces_the_samples_opsin_built_golds(tmp_path):
    metrics = run_method(tmp_path, "method=opsin")
    assert set(metrics) == {"name_conversion-i2f", "name_conversion-i2s"}
    for task in metrics:
        assert metrics[task]["num_samples"] == 30 and metrics[task]["exact_match"] == 1.0, task
    for r in records_of(tmp_path):
        if r["task"] == "name_conversion-i2s":  # written in SMolInstruct's SMILES form, as the golds are
            assert r["answers"] == [canonical_kekule(r["answers"][0])] and r["answers"][0] in r["gold"]


def test_opsin_without_java_is_one_line_saying_what_to_install(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with refused("method=opsin", "java", "llasmol[opsin]", "default-jre-headless"):
        run_method(tmp_path, "method=opsin")


# --------------------------------------------------------------------------- fingerprint


def _train_labels(task: str) -> list[str]:
    source = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x"], config_name="baseline").data)
    return [out for _, out, _ in source.split("train").core_samples(task)]


def test_fingerprint_forests_beat_a_constant_predictor(tmp_path):
    tasks = "data.tasks=[property_prediction-esol,property_prediction-bbbp]"
    gc.collect()  # what earlier tests in this process left unclosed is theirs, not this run's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        metrics = run_method(tmp_path / "a", "method=fingerprint", tasks)
        gc.collect()  # an unclosed file warns when it is collected
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]  # the training files are closed
    golds = {t: [r["gold"][0] for r in records_of(tmp_path / "a") if r["task"] == t] for t in metrics}
    # ESOL: the training mean for every molecule; BBBP: the training majority answer.
    mean = float(np.mean([float(y) for y in _train_labels("property_prediction-esol")]))
    constant_rmse = math.sqrt(np.mean([(float(y) - mean) ** 2 for y in golds["property_prediction-esol"]]))
    majority = Counter(_train_labels("property_prediction-bbbp")).most_common(1)[0][0]
    constant_accuracy = np.mean([y == majority for y in golds["property_prediction-bbbp"]])
    assert metrics["property_prediction-esol"]["rmse"] < constant_rmse - 0.2  # 1.90 vs 2.37
    assert metrics["property_prediction-bbbp"]["accuracy"] > constant_accuracy + 0.05  # 0.93 vs 0.80
    assert metrics["property_prediction-esol"]["num_valid"] == 30
    # Seeded: a second run writes the same predictions.
    run_method(tmp_path / "b", "method=fingerprint", tasks)
    assert [r["predictions"] for r in records_of(tmp_path / "a")] == [r["predictions"] for r in records_of(tmp_path / "b")]


def test_fingerprint_learns_one_classifier_per_side_effect(tmp_path, extra_root):
    metrics = run_method(tmp_path, "method=fingerprint", f"data.path={extra_root}")
    assert list(metrics) == ["property_prediction-sider"]
    # Each molecule is Yes for one side effect and No for the other: only per-target models are all right.
    sider = metrics["property_prediction-sider"]
    assert sider["num_samples"] == 8 and sider["accuracy"] == 1.0
    assert {r["target"] for r in records_of(tmp_path)} == set(SIDE_EFFECTS)


# --------------------------------------------------------------------------- nearest_neighbor


@pytest.mark.parametrize("copy", ["bundled", "extra"])
def test_nearest_neighbor_answers_every_sample_of_every_task(tmp_path, extra_root, copy):
    gen = compose_config(["paths.output_dir=/x"], config_name="baseline").generation
    data = [] if copy == "bundled" else [f"data.path={extra_root}"]
    metrics = run_method(tmp_path, "method=nearest_neighbor", *data)
    expected = 11 if copy == "bundled" else 3  # together, all 14 tasks
    assert len(metrics) == expected
    for task, values in metrics.items():
        assert values["num_no_answer"] == 0, task
    for r in records_of(tmp_path):
        k = task_settings(gen, r["task"]).num_return_sequences
        assert 1 <= len(r["predictions"]) <= k and all(a is not None for a in r["answers"]), r["task"]
        assert r["answers"] == [extract_answer(r["task"], p) for p in r["predictions"]]
        if get_task(r["task"]).answer_tag == "SMILES":
            assert len(r["predictions"]) == k  # 5 or 10 nearest reactions, names, descriptions: distinct answers
    if copy == "extra":  # the caption nearest in Morgan space, scored by METEOR like a model's
        assert 0 < metrics["molecule_captioning"]["meteor"] <= 1
        assert metrics["property_prediction-sider"]["accuracy"] == 1.0  # neighbours of the same side effect only


def test_nearest_neighbor_finds_each_training_input_itself(tmp_path):
    metrics = run_method(tmp_path, "method=nearest_neighbor", "data.split=train")
    for task, values in metrics.items():
        assert values["num_samples"] == 300, task
        family = get_task(task).family
        if family == "number":
            assert values["rmse"] == 0.0, task
        elif family == "boolean":
            assert values["accuracy"] == 1.0, task
        else:
            assert values["exact_match"] == 1.0, task


def test_tanimoto_search_equals_rdkits_bulk_similarity():
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    from llasmol.classical.morgan import morgan_packed, top_k_similar

    source = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x"], config_name="baseline").data)
    smiles = [x for x, _, _ in source.split("train").core_samples("name_conversion-s2f")]
    queries, table = smiles[:25] + ["not a SMILES"], smiles[25:]
    rows, sims = top_k_similar(morgan_packed(queries), morgan_packed(table), k=4, table_rows=64)  # 5 blocks
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    fps = [generator.GetFingerprint(Chem.MolFromSmiles(s)) for s in table]
    for q, found, values in zip(queries[:25], rows, sims):
        expected = sorted(DataStructs.BulkTanimotoSimilarity(generator.GetFingerprint(Chem.MolFromSmiles(q)), fps))
        assert values.tolist() == pytest.approx(expected[::-1][:4], abs=1e-6)
        assert [DataStructs.TanimotoSimilarity(generator.GetFingerprint(Chem.MolFromSmiles(q)), fps[j])
                for j in found] == pytest.approx(values.tolist(), abs=1e-6)
        assert len(set(found.tolist())) == 4  # each row once
    assert sims[-1].tolist() == [0.0] * 4  # an unreadable SMILES is similar to nothing
    # ... and still gets k distinct rows of the table (no placeholder row 0 from the running top-k's start)
    assert len(set(rows[-1].tolist())) == 4 and set(rows[-1].tolist()) <= set(range(len(table)))
    few, zero = top_k_similar(morgan_packed(["not a SMILES"]), morgan_packed(table[:2]), k=2)
    assert sorted(few[0].tolist()) == [0, 1] and zero[0].tolist() == [0.0, 0.0]


def test_fingerprints_from_worker_processes_equal_the_serial_ones(monkeypatch):
    import llasmol.classical.morgan as morgan

    source = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x"], config_name="baseline").data)
    smiles = [x for x, _, _ in source.split("train").core_samples("forward_synthesis")] + ["CCO", "CCO", "?"]
    serial = morgan.morgan_packed(smiles, n_jobs=1)
    monkeypatch.setattr(morgan, "_PARALLEL_FROM", 1)
    assert np.array_equal(morgan.morgan_packed(smiles, n_jobs=2), serial)
    assert serial.shape == (303, 256) and serial[:-1].any(axis=1).all() and not serial[-1].any()
    assert np.array_equal(serial[-3], serial[-2])


# --------------------------------------------------------------------------- the notebook


@pytest.mark.slow
def test_the_analysis_notebook_reads_a_baseline_folder(tmp_path, monkeypatch):
    from test_analysis import _execute_notebook

    run_method(tmp_path, "method=rdkit")
    text, images = _execute_notebook("analyze_predictions.ipynb", "LLASMOL_RUN_DIR", tmp_path, monkeypatch)
    assert "baseline:rdkit" in text and "| name_conversion-s2f |" in text and images >= 2


def test_the_forest_says_how_many_training_labels_it_left_out_and_only_then(caplog):
    from llasmol.baseline import make_method
    from llasmol.classical.common import Examples

    method = make_method(compose_config(["method=fingerprint", "fingerprint.n_estimators=2"], "baseline"))
    train = Examples()
    for smiles, answer in [("CCO", "Yes"), ("CCN", "No"), ("CCC", "perhaps"), ("CCCl", "Yes")]:
        train.add(smiles, answer, None)
    with caplog.at_level("WARNING"):
        method.fit("property_prediction-bbbp", train)
    assert [r.getMessage() for r in caplog.records] == [
        "fingerprint: property_prediction-bbbp: 1 training labels are not yes/no; left out"]
    caplog.clear()
    clean = Examples()
    for smiles, answer in [("CCO", "Yes"), ("CCN", "No")] * 2:
        clean.add(smiles, answer, None)
    with caplog.at_level("WARNING"):
        method.fit("property_prediction-bbbp", clean)
    assert not caplog.records


@pytest.mark.parametrize("method_name", ["fingerprint", "nearest_neighbor"])
def test_a_side_effect_never_seen_in_training_is_unanswered_and_said_once(caplog, method_name):
    """SIDER has one model or index per side effect: a test target with no training sample gets no answer
    (scored as no answer), and the log says which target and how many samples."""
    from llasmol.baseline import make_method
    from llasmol.classical.common import Examples

    method = make_method(compose_config([f"method={method_name}", "fingerprint.n_estimators=2"], "baseline"))
    train, test = Examples(), Examples()
    for smiles, answer in [("CCO", "Yes"), ("CCN", "No"), ("CCCl", "Yes"), ("c1ccccc1", "No")]:
        train.add(smiles, answer, "Eye disorders")
    for smiles, target in [("CCO", "Eye disorders"), ("CCN", "Renal disorders"), ("CCC", "Renal disorders")]:
        test.add(smiles, "", target)
    method.fit("property_prediction-sider", train)
    with caplog.at_level("WARNING"):
        answers = method.predict("property_prediction-sider", test, 1)
    assert answers[1:] == [[], []] and answers[0] in (["Yes"], ["No"])
    assert [r.getMessage() for r in caplog.records] == [
        f"{method_name}: no training sample of property_prediction-sider with target 'Renal disorders': 2 samples "
        "unanswered" if method_name == "nearest_neighbor" else
        "fingerprint: no training label of property_prediction-sider for target 'Renal disorders': 2 samples "
        "unanswered"]
    assert method_name != "nearest_neighbor" or answers[0] == ["Yes"]  # CCO itself was seen in training


def test_opsin_says_how_many_names_it_cannot_parse(caplog):
    from llasmol.baseline import make_method
    from llasmol.classical.common import Examples

    method = make_method(compose_config(["method=opsin"], "baseline"))
    test = Examples()
    for name in ["ethanol", "not a chemical name at all", "benzene"]:
        test.add(name, "", None)
    with caplog.at_level("INFO", logger="llasmol.classical.opsin_names"):
        answers = method.predict("name_conversion-i2f", test, 1)
    assert answers == [["C2H6O"], [], ["C6H6"]]
    assert [r.getMessage() for r in caplog.records] == [
        "opsin: name_conversion-i2f: OPSIN cannot parse 1 of 3 names (no answer)"]
    caplog.clear()
    with caplog.at_level("INFO", logger="llasmol.classical.opsin_names"):
        method.predict("name_conversion-i2f", Examples(["ethanol"], [""], [None]), 1)
    assert caplog.records == []  # every name parsed: nothing to say


# --------------------------------------------------------------------------- the methods' own rules, in-process


def _method(name: str, *overrides: str):
    from llasmol.baseline import make_method

    return make_method(compose_config([f"method={name}", "fingerprint.n_estimators=2", "n_jobs=1", *overrides],
                                      "baseline"))


def _examples(pairs, target=None):
    from llasmol.classical.common import Examples

    examples = Examples()
    for core_in, answer in pairs:
        examples.add(core_in, answer, target)
    return examples


def test_nearest_neighbor_gives_the_inputs_own_answers_first_each_answer_once():
    """Training samples sharing an input are one entry with all their answers (each once); the query's own
    input comes first, then the next nearest entry's answers."""
    method = _method("nearest_neighbor")
    train = _examples([("CCO", "A"), ("CCO", "A"), ("CCO", "B"), ("CCCO", "C"), ("c1ccccc1", "D")])
    method.fit("forward_synthesis", train)
    assert method._indexes["forward_synthesis"][None].answers == [["A", "B"], ["C"], ["D"]]
    assert method.predict("forward_synthesis", _examples([("CCO", ""), ("CCCCO", "")]), 3) == [
        ["A", "B", "C"], ["C", "A", "B"]]
    assert method.predict("forward_synthesis", _examples([("CCO", "")]), 1) == [["A"]]
    # IUPAC names go through TF-IDF n-grams: the same name first, then the closest one
    method.fit("name_conversion-i2s", _examples([("ethanol", "CCO"), ("propanol", "CCCO"), ("benzene", "c1ccccc1")]))
    assert method.predict("name_conversion-i2s", _examples([("propanol", "")]), 2) == [["CCCO", "CCO"]]
    # Once a task has answered its index is dropped: asked again, it has nothing
    method.forget("name_conversion-i2s")
    assert "name_conversion-i2s" not in method._indexes
    assert not any(key[0] == "name_conversion-i2s" for key in method._vectorizers)
    assert method.predict("forward_synthesis", _examples([("CCO", "")]), 1) == [["A"]]  # the other task is kept
    assert method.predict("name_conversion-i2s", _examples([("propanol", "")]), 1) == [[]]


def test_nearest_neighbor_keeps_a_seeded_subset_of_distinct_inputs_above_the_cap(caplog):
    inputs = ["C" * n for n in range(1, 13)]  # 12 distinct inputs
    train = _examples([(x, x) for x in inputs])
    capped = _method("nearest_neighbor", "nearest_neighbor.max_train_inputs=10")
    with caplog.at_level("INFO", logger="llasmol.classical.nearest"):
        capped.fit("forward_synthesis", train)
    kept = capped._indexes["forward_synthesis"][None].inputs
    assert len(kept) == len(set(kept)) == 10 and kept == [x for x in inputs if x in kept]  # drawn without replacement
    assert "nearest_neighbor: forward_synthesis indexes 10 distinct training inputs" in caplog.messages
    at_cap = _method("nearest_neighbor", "nearest_neighbor.max_train_inputs=12")
    at_cap.fit("forward_synthesis", train)
    assert at_cap._indexes["forward_synthesis"][None].inputs == inputs  # exactly at the cap: all, in order


def test_each_side_effect_forest_has_its_own_seed_and_a_forgotten_task_is_unanswered(caplog):
    method = _method("fingerprint")
    pairs = [("CCO", "Yes"), ("CCN", "No"), ("CCCl", "Yes"), ("c1ccccc1", "No")]
    train = _examples(pairs, "Eye disorders")
    for core_in, answer in pairs:
        train.add(core_in, answer, "Renal disorders")
    with caplog.at_level("INFO", logger="llasmol.classical.forest"):
        method.fit("property_prediction-sider", train)
    assert caplog.messages == ["fingerprint: property_prediction-sider: 2 forest(s) on 8 training samples"]
    caplog.clear()
    forests = method._models["property_prediction-sider"]
    assert forests["Eye disorders"].random_state != forests["Renal disorders"].random_state
    method.forget("property_prediction-sider")
    with caplog.at_level("WARNING"):
        assert method.predict("property_prediction-sider", _examples([("CCO", "")], "Eye disorders"), 1) == [[]]
    assert len(caplog.records) == 1


def test_a_baseline_defaults_to_seed_0_one_job_and_no_settings():
    from llasmol.classical.common import Baseline
    from llasmol.core.tasks import TASK_NAMES

    class Everything(Baseline):
        def why_not(self, task):
            return None if task.family == "smiles" else "not a molecule"

    plain = Everything()
    assert (plain.seed, plain.n_jobs, plain.settings, plain.needs_training) == (0, 1, {}, False)
    assert Everything({"a": 1}, n_jobs=0).n_jobs == 1 and Everything({"a": 1}).settings == {"a": 1}
    assert plain.answerable() == [t for t in TASK_NAMES if get_task(t).family == "smiles"]
    examples = _examples([("a", "1"), ("b", "2")])
    examples.add("c", "3", "T")
    assert len(examples) == 3 and examples.answers == ["1", "2", "3"] and examples.targets == [None, None, "T"]
    assert examples.groups() == {None: [0, 1], "T": [2]}


def test_choose_tasks_skips_or_refuses_what_a_method_cannot_answer(caplog):
    from llasmol.classical.runner import choose_tasks

    source = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x"], config_name="baseline").data)
    rdkit = _method("rdkit")
    with caplog.at_level("INFO", logger="llasmol.classical.runner"):
        answered, skipped = choose_tasks(rdkit, source, named=False)
    assert answered == ["name_conversion-s2f"] and len(skipped) == 10
    assert len(caplog.records) == len(set(skipped.values()))  # one line per reason
    with refused("method=rdkit", "forward_synthesis"):
        choose_tasks(rdkit, source, named=True)
    only_fs = SMolInstructSource.from_config(compose_config(["paths.output_dir=/x", "data.tasks=[forward_synthesis]"],
                                                            config_name="baseline").data)
    with refused("method=rdkit", "none of the tasks", "name_conversion-s2f"):
        choose_tasks(rdkit, only_fs, named=False)


def test_method_answers_advance_by_each_tasks_samples_and_time_only_what_they_do(caplog):
    import time

    from llasmol.classical.runner import MethodAnswers
    from llasmol.inference.pipeline import Samples

    cfg = compose_config(["paths.output_dir=/x", "data.tasks=[name_conversion-s2f]"], config_name="baseline")
    source = SMolInstructSource.from_config(cfg.data)
    samples = Samples.of(source, "test", per_task=4, seed=13)
    answerer = MethodAnswers(_method("rdkit"), ["name_conversion-s2f"], None, cfg.generation)
    steps = []
    with caplog.at_level("INFO", logger="llasmol.classical.runner"):
        tick = time.perf_counter()
        records = answerer.answer(samples, advance=steps.append)
        wall = time.perf_counter() - tick
    assert caplog.messages == ["method=rdkit answered 4 samples of name_conversion-s2f"]
    assert steps == [4] and len(records) == 4 and set(answerer.seconds) == {"answer"}
    assert 0 <= answerer.seconds["answer"] <= wall  # the clock starts at 0 and times only the answering
    assert all(r["predictions"][0].startswith("<MOLFORMULA> ") for r in records)
    trained = MethodAnswers(_method("nearest_neighbor"), ["name_conversion-s2f"], source.split("train"), cfg.generation)
    tick = time.perf_counter()
    trained.answer(samples)
    wall = time.perf_counter() - tick
    assert set(trained.seconds) == {"train", "answer"} and all(v >= 0 for v in trained.seconds.values())
    assert trained.seconds["train"] + trained.seconds["answer"] <= wall
    assert trained.train_sizes == {"name_conversion-s2f": 300}
    source.close()


def test_a_baseline_over_selfies_data_is_refused(tmp_path):
    from llasmol.classical.runner import run_baseline

    cfg = compose_config(["paths.output_dir=/x", "data.representation=selfies"], config_name="baseline")
    source = SMolInstructSource.from_config(cfg.data)
    import torch

    threads = torch.get_num_threads()  # the runner sets the method's n_jobs before it refuses
    try:
        with refused("SMILES", "data.representation=selfies", untouched=tmp_path):
            run_baseline(_method("rdkit"), source, "test", cfg.generation, tmp_path)
    finally:
        torch.set_num_threads(threads)


def test_peak_memory_is_converted_from_kib_on_linux_and_from_bytes_on_macos(monkeypatch):
    """getrusage's ru_maxrss is in KiB on Linux and in bytes on macOS; baseline.json says MiB on both."""
    import resource
    from types import SimpleNamespace

    from llasmol.classical import runner

    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=3 * 2**20))
    monkeypatch.setattr(runner, "sys", SimpleNamespace(platform="darwin"))  # the runner's view only
    assert runner._peak_rss_mib() == 3.0
    monkeypatch.setattr(runner, "sys", SimpleNamespace(platform="linux"))
    assert runner._peak_rss_mib() == 3 * 1024.0


@pytest.mark.parametrize("returned, said", [(False, "OPSIN returned nothing for 2 names"),
                                            (["CCO"], "OPSIN returned 1 lines for 2 names")])
def test_an_opsin_reply_that_does_not_answer_every_name_stops_rather_than_shift_the_answers(monkeypatch, returned,
                                                                                             said):
    """One answer a line: a reply of another length would pair every later name with its neighbour's SMILES."""
    import py2opsin

    from llasmol.classical.opsin_names import opsin_smiles

    monkeypatch.setattr(py2opsin, "py2opsin", lambda lines, tmp_fpath: returned)
    with pytest.raises(RuntimeError, match=f"^{said}$"):
        opsin_smiles(["ethanol", "benzene"])
