"""Property-based robustness: arbitrary model output never breaks extraction or scoring."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llasmol.core.tasks import TASK_NAMES, get_task
from llasmol.metrics import STATS, add_stats, extract_answer, finalize, sample_stats
from llasmol.metrics.formula import parse_formula

FRACTIONS = {
    "exact_match", "top1_exact_match", "top3_exact_match", "top5_exact_match", "top10_exact_match",
    "validity", "fts", "fts_maccs", "fts_rdk", "accuracy", "f1",
    "meteor", "bleu2", "bleu4", "rouge1", "rouge2", "rougeL", "tokenizer_scibert",
}  # fmt: skip

GOLDS = {
    "forward_synthesis": ["CC(=O)O", "c1ccccc1.O"],
    "retrosynthesis": ["CCO.CC(=O)Cl"],
    "molecule_generation": ["N[C@@H](C)C(=O)O"],
    "name_conversion-i2s": ["CCO"],
    "name_conversion-i2f": ["C2H6O"],
    "name_conversion-s2f": ["C2H3O2-"],
    "name_conversion-s2i": ["sodium;ethanoate"],
    "property_prediction-esol": ["-1.41"],
    "property_prediction-lipo": ["2.5", "3"],
    "property_prediction-bbbp": ["Yes"],
    "property_prediction-clintox": ["No"],
    "property_prediction-hiv": ["No"],
    "property_prediction-sider": ["Yes", "No"],
    "molecule_captioning": ["The molecule is an acetate ester."],
}
TASKS = sorted(TASK_NAMES)
assert set(GOLDS) == set(TASKS)

JUNK = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=60)
PIECES = st.sampled_from(
    ["<SMILES>", "</SMILES>", "<MOLFORMULA>", "</MOLFORMULA>", "<IUPAC>", "</IUPAC>", "<NUMBER>", "</NUMBER>",
     "<BOOLEAN>", "</BOOLEAN>", " ", ".", ";", "CCO", "c1ccccc1", "C1CC", "[Na+]", "Yes", "no", "nan", "1e999",
     "-0.5", "C2H6O", "(", ")", "[13C]", "+", "-", "\x00", "\ufffd", "ethanol", "The molecule is", "acid"]
)  # fmt: skip
TAGGY = st.lists(st.one_of(PIECES, JUNK), max_size=12).map("".join)
TEXT = st.one_of(st.text(), TAGGY)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(task: str, metrics: dict[str, float]) -> None:
    assert set(metrics) >= {"num_samples", "num_no_answer"}
    for key, value in metrics.items():
        assert isinstance(value, float), (task, key)
        if key in FRACTIONS:
            assert 0.0 <= value <= 1.0, (task, key, value)
        elif key == "mcc":
            assert -1.0 <= value <= 1.0
        elif key != "rmse":
            assert value >= 0 and math.isfinite(value), (task, key, value)


@SETTINGS
@given(task=st.sampled_from(TASKS), text=TEXT)
def test_extract_never_raises(task, text):
    answer = extract_answer(task, text)
    assert answer is None or (isinstance(answer, str) and answer == answer.strip() and answer)
    tag = get_task(task).answer_tag
    if answer is not None and tag is not None:
        assert f"<{tag}>" not in answer and f"</{tag}>" not in answer


@SETTINGS
@given(task=st.sampled_from(TASKS), predictions=st.lists(TEXT, max_size=4))
def test_sample_stats_and_finalize_never_raise(task, predictions):
    stats = sample_stats(task, predictions, GOLDS[task])
    assert tuple(stats) == STATS[task]
    assert all(isinstance(v, float) and math.isfinite(v) for v in stats.values())
    _check(task, finalize(task, stats))


@SETTINGS
@given(task=st.sampled_from(TASKS), data=st.lists(TEXT, min_size=2, max_size=6))
def test_sums_of_random_samples_stay_in_range(task, data):
    total: dict[str, float] = {}
    for text in data:
        add_stats(total, sample_stats(task, [text], GOLDS[task]))
    metrics = finalize(task, total)
    _check(task, metrics)
    assert metrics["num_samples"] == len(data)


@SETTINGS
@given(task=st.sampled_from(TASKS), text=TEXT)
def test_tagged_text_is_scored(task, text):
    tag = get_task(task).answer_tag
    wrapped = text if tag is None else f"Answer: <{tag}> {text} </{tag}> ."
    _check(task, finalize(task, sample_stats(task, [wrapped], GOLDS[task])))


@SETTINGS
@given(text=TEXT)
def test_parse_formula_never_raises(text):
    parsed = parse_formula(text)
    if parsed is not None:
        atoms, charge = parsed
        assert atoms and all(count != 0 for _, count in atoms) and isinstance(charge, int)


def test_huge_and_binary_output():
    huge = "<SMILES> " + "C" * 100_000 + " </SMILES>"
    binary = bytes(range(256)).decode("latin-1") * 50
    for task in TASKS:
        for text in (huge, binary, "<NUMBER> " + "9" * 5000 + " </NUMBER>", "\x00" * 10_000):
            _check(task, finalize(task, sample_stats(task, [text] * 3, GOLDS[task])))
