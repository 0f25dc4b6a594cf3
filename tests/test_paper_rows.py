"""The paper's reference rows (`llasmol.analysis.paper`): transcribed numbers against the paper's tables,
a source for every system, and only metric and task names this package computes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llasmol import analysis
from llasmol.analysis.paper import (
    KINDS,
    PAPER_LLASMOL_MODELS,
    PAPER_MODEL_OF_BASE,
    PAPER_MODELS,
    PAPER_RESULTS,
    PAPER_SOURCES,
    paper_metric,
)
from llasmol.core.tasks import TASK_NAMES, get_task
from llasmol.metrics.families import FAMILIES

ROOT = Path(__file__).resolve().parents[1]

# (system, task, metric, value as printed in the paper / 100 for percentages, table)
PRINTED = [
    ("LlaSMol-Galactica", "name_conversion-i2f", "top3_exact_match", 0.912, 4),
    ("LlaSMol-Galactica", "name_conversion-i2s", "fts_rdk", 0.864, 5),
    ("LlaSMol-Galactica", "forward_synthesis", "top5_exact_match", 0.706, 10),
    ("LlaSMol-Galactica", "property_prediction-sider", "mcc", 0.418, 13),
    ("LlaSMol-Galactica", "molecule_captioning", "meteor", 0.394, 3),
    ("LlaSMol-Code Llama", "name_conversion-s2f", "top3_exact_match", 0.960, 6),
    ("LlaSMol-Code Llama", "name_conversion-s2i", "top5_exact_match", 0.305, 7),
    ("LlaSMol-Code Llama", "retrosynthesis", "validity", 1.0, 11),
    ("LlaSMol-Code Llama", "property_prediction-bbbp", "mcc", 0.042, 13),
    ("LlaSMol-Mistral", "molecule_captioning", "bleu2", 0.414, 9),
    ("LlaSMol-Llama 2", "molecule_captioning", "bleu4", 0.203, 9),
    ("GPT-4", "molecule_captioning", "meteor", 0.198, 3),
    ("GPT-4", "forward_synthesis", "exact_match", 0.011, 3),
    ("GPT-4", "name_conversion-i2s", "validity", 0.842, 2),
    ("GPT-4 (0-shot)", "forward_synthesis", "exact_match", 0.020, 10),
    ("GPT-4 (0-shot)", "property_prediction-clintox", "accuracy", 0.368, 13),
    ("GPT-4 (1-shot)", "name_conversion-i2f", "exact_match", 0.222, 4),
    ("GPT-4 (3-shot)", "property_prediction-sider", "mcc", -0.143, 13),
    ("GPT-4 (5-shot)", "retrosynthesis", "fts_maccs", 0.683, 11),
    ("GPT-4 (5-shot)", "molecule_captioning", "bleu2", 0.214, 9),
    ("Galactica", "name_conversion-i2s", "exact_match", 0.097, 5),
    ("Galactica", "property_prediction-clintox", "mcc", -0.023, 13),
    ("Galactica", "molecule_captioning", "meteor", 0.050, 3),
    ("Llama 2", "name_conversion-i2s", "validity", 0.181, 5),
    ("Llama 2", "property_prediction-hiv", "accuracy", 0.933, 13),
    ("Code Llama", "property_prediction-clintox", "accuracy", 0.854, 13),
    ("Code Llama", "retrosynthesis", "top3_exact_match", 0.001, 11),
    ("Mistral", "molecule_generation", "validity", 0.359, 8),
    ("Mistral", "property_prediction-hiv", "accuracy", 0.071, 13),
    ("Mistral", "name_conversion-i2f", "top3_exact_match", 0.031, 4),
    ("Molinst", "property_prediction-clintox", "accuracy", 0.063, 13),
    ("Molinst", "retrosynthesis", "fts", 0.480, 11),
    ("Molinst", "molecule_captioning", "meteor", 0.124, 3),
    ("STOUT", "name_conversion-i2s", "exact_match", 0.735, 5),
    ("STOUT", "name_conversion-i2s", "validity", 0.994, 5),
    ("STOUT", "name_conversion-s2i", "exact_match", 0.565, 7),
    ("STOUT+RDKit", "name_conversion-i2f", "exact_match", 0.979, 4),
    ("RDKit", "name_conversion-s2f", "exact_match", 1.0, 6),
    ("Uni-Mol", "property_prediction-bbbp", "mcc", 0.651, 13),
    ("Uni-Mol", "property_prediction-hiv", "f1", 0.328, 13),
    ("MolT5", "molecule_captioning", "meteor", 0.515, 3),
    ("MolT5", "molecule_generation", "fts", 0.732, 8),
    ("Molecular Transformer", "forward_synthesis", "top5_exact_match", 0.871, 10),
    ("Molecular Transformer", "retrosynthesis", "exact_match", 0.470, 11),
    ("RSMILES", "forward_synthesis", "exact_match", 0.787, 10),
    ("RSMILES", "retrosynthesis", "top5_exact_match", 0.699, 11),
]


@pytest.mark.parametrize("system,task,metric,value,table", PRINTED)
def test_transcribed_numbers(system, task, metric, value, table):
    assert paper_metric(system, task, metric) == pytest.approx(value, abs=1e-9)
    assert table in PAPER_SOURCES[system].tables


def test_left_out_cells_stay_out():
    for system in PAPER_MODELS:  # Table 12 (and Table 2's RMSE columns) do not survive extraction
        assert "property_prediction-esol" not in PAPER_RESULTS[system]
        assert "property_prediction-lipo" not in PAPER_RESULTS[system]
        assert "rouge1" not in PAPER_RESULTS[system].get("molecule_captioning", {})
    assert "validity" not in PAPER_RESULTS["Galactica"]["forward_synthesis"]  # Table 3 and 10 disagree
    assert "validity" not in PAPER_RESULTS["Mistral"]["forward_synthesis"]
    assert "top3_exact_match" not in PAPER_RESULTS["STOUT"]["name_conversion-i2s"]  # printed "-"
    assert "meteor" not in PAPER_RESULTS["GPT-4 (0-shot)"]["molecule_captioning"]
    assert set(PAPER_RESULTS["GPT-4"]) == {"name_conversion-i2f", "name_conversion-i2s", "molecule_captioning",
                                           "molecule_generation", "forward_synthesis", "retrosynthesis"}


def test_every_system_has_a_source():
    assert set(PAPER_SOURCES) == set(PAPER_RESULTS) == set(PAPER_MODELS)
    for name, src in PAPER_SOURCES.items():
        assert src.kind in KINDS, name
        assert src.tables and all(2 <= t <= 13 for t in src.tables), name
        assert src.test_set and src.setting and src.evaluated_on, name
        assert src.label.startswith("Table") and src.label.endswith(src.where), name
    gpt4 = [m for m in PAPER_MODELS if m.startswith("GPT-4")]
    assert gpt4 == ["GPT-4", "GPT-4 (0-shot)", "GPT-4 (1-shot)", "GPT-4 (3-shot)", "GPT-4 (5-shot)"]
    for shots in (0, 1, 3, 5):  # each k-shot row's setting says its k (App. A.2.1, Tables 4-11 and 13)
        setting = PAPER_SOURCES[f"GPT-4 ({shots}-shot)"].setting
        assert f"; {shots}-shot, in-context examples" in setting, setting
    for name in PAPER_MODELS:  # App. A.2.1: GPT-4 on 500 test samples; everything else on the whole test set
        assert PAPER_SOURCES[name].full_test_set == (name not in gpt4), name
    assert "500" in PAPER_SOURCES["GPT-4"].evaluated_on and PAPER_SOURCES["GPT-4"].label == "Tables 2, 3; 500 test samples"
    assert PAPER_SOURCES["LlaSMol-Mistral"].label == "Tables 2-11, 13; test set"
    assert "test samples" in PAPER_SOURCES["STOUT"].caveat
    assert {PAPER_SOURCES[m].kind for m in ("STOUT", "RDKit", "Uni-Mol", "MolT5", "RSMILES")} == {"task-specific"}
    assert PAPER_SOURCES["Molinst"].kind == "instruction-tuned LLM" and PAPER_SOURCES["Mistral"].kind == "base LLM"


def test_llasmol_rows_first_and_bases():
    assert PAPER_MODELS[:4] == PAPER_LLASMOL_MODELS
    assert set(PAPER_LLASMOL_MODELS) == {"LlaSMol-Mistral", "LlaSMol-Llama 2", "LlaSMol-Galactica",
                                         "LlaSMol-Code Llama"}
    assert PAPER_MODEL_OF_BASE == {"mistral": "LlaSMol-Mistral", "llama2": "LlaSMol-Llama 2",
                                   "galactica": "LlaSMol-Galactica", "codellama": "LlaSMol-Code Llama"}
    for base, model in PAPER_MODEL_OF_BASE.items():
        assert (ROOT / "conf" / "model" / f"{base}.yaml").is_file()
        assert PAPER_SOURCES[model].base == base
        # Every LlaSMol row covers all tasks but the two regression ones.
        assert len(PAPER_RESULTS[model]) == len(TASK_NAMES) - 2


def test_names_are_tasks_and_metrics_this_package_computes():
    for system, tasks in PAPER_RESULTS.items():
        for task, values in tasks.items():
            assert task in TASK_NAMES, (system, task)
            known = set(FAMILIES[get_task(task).family].metric_names)
            assert values and set(values) <= known, (system, task, set(values) - known)


def test_values_finite_and_in_range():
    for system, tasks in PAPER_RESULTS.items():
        for task, values in tasks.items():
            for metric, v in values.items():
                assert isinstance(v, float) and math.isfinite(v), (system, task, metric)
                low = -1.0 if metric == "mcc" else 0.0
                assert low <= v <= 1.0, (system, task, metric, v)  # no rmse here (Table 12 left out)
            if "exact_match" in values:
                assert values["exact_match"] == values.get("top1_exact_match", values["exact_match"])


def test_paper_table_and_compare_defaults():
    table = analysis.paper_table(["forward_synthesis", "property_prediction-bbbp"])
    assert table.column("system") == list(PAPER_MODELS)
    rsmiles = table.row("RSMILES")
    assert rsmiles["forward_synthesis/exact_match"] == pytest.approx(0.787)
    assert rsmiles["property_prediction-bbbp/accuracy"] is None and rsmiles["kind"] == "task-specific"
    assert table.row("GPT-4 (0-shot)")["paper_source"] == "Tables 4-11, 13; 500 test samples"
    assert analysis.COMPARE_PAPER_MODELS == ("LlaSMol-Mistral", "LlaSMol-Llama 2")
