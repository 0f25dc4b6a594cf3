"""The base models' answer extraction behaves as the official LLM4Chem rules on crafted, tricky outputs.

Expected answers come from running the official `prediction_extraction.py` functions once on these texts
(tests/data/answer_rules_cases.jsonl says how); its code is not part of this project.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refusals import refused

from llasmol.core.tasks import TASK_NAMES
from llasmol.metrics.answer_rules import RULES, extract_base_answer

CASES_FILE = Path(__file__).parent / "data" / "answer_rules_cases.jsonl"


def _cases() -> list[tuple[str, str, str, object]]:
    """(rule set, task, text, expected answer) for every case of the data file."""
    lines = CASES_FILE.read_text(encoding="utf-8").splitlines()
    tasks = json.loads(lines[0])["tasks"]
    return [(case["rules"], task, case["text"], expected)
            for case in map(json.loads, lines[1:]) for task, expected in zip(tasks, case["expected"])]


CASES = _cases()


def test_the_cases_cover_every_rule_set_and_task():
    assert {(rules, task) for rules, task, _, _ in CASES} == {(r, t) for r in RULES for t in TASK_NAMES}
    for rules in RULES:  # answers, not only misses, for every rule set
        assert sum(expected is not None for r, _, _, expected in CASES if r == rules) >= 20


@pytest.mark.parametrize("rules", list(RULES))
def test_rule_reads_what_the_official_rule_reads(rules):
    wrong = [(task, text, expected, extract_base_answer(rules, task, text))
             for r, task, text, expected in CASES if r == rules
             if extract_base_answer(rules, task, text) != expected]
    assert not wrong, f"{len(wrong)} differences, e.g. (task, text, official, ours): {wrong[:3]}"


@pytest.mark.parametrize("text,expected", [
    # the official rule keeps the text from the title's second character on
    ("Predicted product SMILES: CCO", "redicted product SMILES: CCO"),
    # a bracket alone matches before a bracket atom, so `[Na+]` stops after `[N`
    ("[Na+]xyz", "[N"),
    ("Result: [Na+].[Cl-] salt", "[N"),
])
def test_llama_forward_synthesis_quirks(text, expected):
    assert extract_base_answer("llama", "forward_synthesis", text) == expected


def test_missing_title_is_no_answer_not_a_crash():
    # the official Galactica and Molinst rules assert here and stop the run
    assert extract_base_answer("gal", "forward_synthesis", "CCO") is None
    assert extract_base_answer("mol", "property_prediction-bbbp", "Yes") is None
    assert extract_base_answer("mistral", "forward_synthesis", None) is None


def test_unknown_rule_set_names_the_choices():
    with refused("prompting.rules='gpt'", "llama, codellama, mistral, gal, mol"):
        extract_base_answer("gpt", "forward_synthesis", "CCO")


def test_a_title_said_twice_is_read_after_its_first_occurrence_unless_the_rule_takes_the_last():
    from llasmol.metrics.answer_rules import _after

    text = "Product: CCO. Product: CCN"
    assert _after(text, "Product:") == " CCO. Product: CCN"
    assert _after(text, "Product:", last=True) == " CCN"
    assert _after(text, "product:", fold=True) == " CCO. Product: CCN"
    assert _after(text, "product:") is None  # case-sensitive unless folded


@pytest.mark.parametrize("text,expected", [
    # A leading SMILES run is the answer when it is the whole text or longer than 10 characters (the official
    # rule's bound): 10 carbons before other words are not, 11 are.
    ("CCCCCCCCCC with text", None),
    ("CCCCCCCCCCC with text", "CCCCCCCCCCC"),
    ("CCCCCCCCCC", "CCCCCCCCCC"),
    # A per-product title without a "product 2:" after it gives no answer.
    ("Here are the predicted reactants for each product: CCO.CN", None),
    ("Here are the predicted reactants for each product: product 1: CCO product 2: **CN.O**", "CN.O"),
])
def test_llama_retrosynthesis_reads_a_leading_run_longer_than_ten_characters(text, expected):
    assert extract_base_answer("llama", "retrosynthesis", text) == expected


@pytest.mark.parametrize("rules,task,text,expected", [
    # Rules that read after the *last* colon (or '=' / "is "), with an earlier one in the text.
    ("llama", "forward_synthesis", "Step 1: think. Answer: CCO", "CCO"),
    ("llama", "name_conversion-i2f", "Think: hard. Formula: C2H6O.", "C2H6O"),
    ("llama", "property_prediction-lipo", "a: 1\nb: 2.5", "2.5"),
    ("llama", "property_prediction-lipo", "x = 1, y = 2.5", "2.5"),
    ("codellama", "forward_synthesis", "Step: x. Product: CCO", "CCO"),
    ("mistral", "name_conversion-i2s", "Name: x. SMILES: CCO", "CCO"),
    ("mistral", "property_prediction-lipo", "a: 1, b: 2.5", "2.5"),
    ("mistral", "property_prediction-lipo", "It is 3 or it is 2.5.", "2.5"),
    ("llama", "molecule_generation", "Step one: ab: cd, result two: CCO", "CCO"),
    # Titles matched whatever their case, the last occurrence read.
    ("llama", "retrosynthesis", "REACTANTS: CCN then reactants: CCO", "CCO"),
    ("llama", "retrosynthesis", "The Predicted Reactants For Each Product: b PRODUCT 2: CCO", "CCO"),
    ("llama", "retrosynthesis", "the predicted reactants for each product: a product 2: CN; "
                                "the predicted reactants for each product: b product 2: CCO", "CCO"),
    ("llama", "molecule_generation", "Answer Is: CCO and: x", "CCO"),
    ("llama", "name_conversion-s2i", "iupac name: wrong. IUPAC name: ethanol", "ethanol"),
    ("llama", "name_conversion-s2i", "iupac name: ethanol (or: x)", "ethanol (or: x)"),
])
def test_titles_are_read_at_their_last_occurrence_in_any_case_where_the_official_rule_does(rules, task, text,
                                                                                          expected):
    assert extract_base_answer(rules, task, text) == expected
