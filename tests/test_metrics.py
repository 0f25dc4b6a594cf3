"""Known-answer tests of the chemistry metrics: extraction, SMILES, formula, IUPAC, number, boolean."""

from __future__ import annotations

import math

import pytest

from refusals import refused

from llasmol.core.tasks import SMOLINSTRUCT, TASK_NAMES, Scoring, get_task
from llasmol.metrics import STATS, add_stats, extract_answer, finalize, sample_stats, score_records
from llasmol.metrics.formula import parse_formula
from llasmol.metrics.molecules import parse_molecule


def smiles(text: str) -> str:
    return f"The answer is <SMILES> {text} </SMILES> ."


def tagged(task: str, text: str) -> str:
    tag = get_task(task).answer_tag
    return f"Here: <{tag}> {text} </{tag}>"


def score(task: str, samples: list[tuple[list[str], list[str]]], tasks=None) -> dict[str, float]:
    """`samples` scored as the official scorer reads them, or as the table `tasks` says (`read_as`)."""
    tasks = tasks or SMOLINSTRUCT
    total: dict[str, float] = {}
    for predictions, golds in samples:
        add_stats(total, sample_stats(task, predictions, golds, tasks=tasks))
    return finalize(task, total, tasks)


# --------------------------------------------------------------------------- extraction


def test_tags_cover_every_task():
    assert set(TASK_NAMES) == set(STATS)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The product is <SMILES> CC(=O)O </SMILES> .", "CC(=O)O"),
        ("<SMILES>CCO</SMILES>", "CCO"),
        ("<SMILES> A </SMILES> and <SMILES> B </SMILES>", "A"),  # the first pair
        ("<SMILES> a <SMILES> b </SMILES>", "b"),  # a pair never holds a tag
        ("</SMILES> x <SMILES> CCO </SMILES>", "CCO"),  # a stray closing tag first
        ("<SMILES> CCO", None),  # unclosed
        ("CCO </SMILES>", None),  # unopened
        ("no tags at all", None),
        ("", None),
        ("<SMILES>   </SMILES>", None),  # empty answer
        ("<smiles> CCO </smiles>", None),  # tags are case-sensitive
        ("<MOLFORMULA> C2H6O </MOLFORMULA>", None),  # another task's tag
    ],
)
def test_extract_smiles(text, expected):
    assert extract_answer("forward_synthesis", text) == expected


def test_extract_other_tags_and_captioning():
    assert extract_answer("name_conversion-s2f", "<MOLFORMULA> C2H6O </MOLFORMULA>") == "C2H6O"
    assert extract_answer("name_conversion-s2i", "<IUPAC> ethanol </IUPAC>") == "ethanol"
    assert extract_answer("property_prediction-esol", "<NUMBER> -1.41 </NUMBER>") == "-1.41"
    assert extract_answer("property_prediction-hiv", "<BOOLEAN> No </BOOLEAN>") == "No"
    assert extract_answer("molecule_captioning", "  The molecule is an acid.\n") == "The molecule is an acid."
    assert extract_answer("molecule_captioning", " \n ") is None
    assert extract_answer("forward_synthesis", None) is None  # type: ignore[arg-type]
    with refused("no_such_task"):
        extract_answer("no_such_task", "x")


def test_extract_huge_text_is_fast():
    text = "<SMILES> " * 200_000 + "CCO </SMILES>" + "x" * 1_000_000
    assert extract_answer("forward_synthesis", text) == "CCO"
    # Many closing tags before any opening one (a rescan per closing tag took ~1 min on this).
    text = "</SMILES>" * 200_000 + "<SMILES> CCO </SMILES>"
    assert extract_answer("forward_synthesis", text) == "CCO"
    assert extract_answer("forward_synthesis", "</SMILES>" * 200_000) is None


# --------------------------------------------------------------------------- SMILES tasks


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("C1=CC=CC=C1", "c1ccccc1"),  # Kekulé vs aromatic
        ("OCC", "CCO"),  # another spelling
        ("CCO;O", "O.CCO"),  # ';' is '.' and fragment order does not matter
        ("O . CCO", "CCO.O"),  # spaces around the dot
        ("N[C@@H](C)C(=O)O", "C[C@H](N)C(=O)O"),  # the same enantiomer, written differently
        # Isotope labels go before comparing, as the official canonicalisation drops them.
        ("[13CH3]O", "CO"),
        ("[2H]C([2H])([2H])O.CC", "CO.CC"),
    ],
)
def test_smiles_same_molecule(pred, gold):
    metrics = score("forward_synthesis", [([smiles(pred)], [gold])])
    assert metrics["exact_match"] == 1.0
    assert metrics["validity"] == 1.0
    assert metrics["fts"] == pytest.approx(1.0)
    assert metrics["fts_maccs"] == pytest.approx(1.0)
    assert metrics["fts_rdk"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("N[C@@H](C)C(=O)O", "N[C@H](C)C(=O)O"),  # enantiomers
        ("NC(C)C(=O)O", "N[C@H](C)C(=O)O"),  # unspecified vs specified stereo
        ("C/C=C/C", "C/C=C\\C"),  # E vs Z
        ("CCO", "CCO.O"),  # a missing fragment
        ("CCN", "CCO"),
        ("CC(=O)[O-]", "CC(=O)O"),  # acetate is not acetic acid: the net charge differs
        ("[NH4+]", "N"),
        ("CC(O)=C", "CC(C)=O"),  # keto and enol: standard InChI keeps these apart
    ],
)
def test_smiles_different_molecule(pred, gold):
    metrics = score("retrosynthesis", [([smiles(pred)], [gold])])
    assert metrics["exact_match"] == 0.0
    assert metrics["validity"] == 1.0


@pytest.mark.parametrize("pred, gold", [
    ("O=C1C=CC=CN1", "OC1=NC=CC=C1"),  # 2-pyridone and 2-hydroxypyridine
    ("[NH3+]CC(=O)[O-]", "NCC(=O)O"),  # zwitterionic and neutral glycine
])
def test_identity_is_standard_inchi_so_the_tautomers_it_merges_match(pred, gold):
    """Not canonical SMILES (they differ here): exact match as the official scorer, though the fingerprints,
    of the graphs as written, differ."""
    metrics = score("molecule_generation", [([smiles(pred)], [gold])])
    assert metrics["exact_match"] == 1.0
    assert metrics["fts"] < 0.5


def test_enantiomers_have_full_morgan_similarity_but_no_match():
    metrics = score("molecule_generation", [([smiles("N[C@@H](C)C(=O)O")], ["N[C@H](C)C(=O)O"])])
    assert metrics["exact_match"] == 0.0
    assert metrics["fts"] == pytest.approx(1.0)  # Morgan without chirality, as the paper's code


def test_smiles_any_gold_matches():
    golds = ["CCN", "CCO", "not a smiles ((("]
    assert score("forward_synthesis", [([smiles("OCC")], golds)])["exact_match"] == 1.0
    assert score("forward_synthesis", [([smiles("CCC")], golds)])["exact_match"] == 0.0


def read_as(**settings):
    """SMolInstruct's table with its answers read as `settings` (the `scoring` config group) say."""
    return SMOLINSTRUCT.with_scoring(Scoring(**settings))


def test_smiles_validity_and_no_answer():
    samples = [
        ([smiles("CCO")], ["CCO"]),  # valid, right
        ([smiles("c1cccc1")], ["CCO"]),  # invalid (kekulization fails)
        ([smiles("C(C)(C)(C)(C)C")], ["CCO"]),  # invalid (valence)
        ([smiles("CC O")], ["CCO"]),  # whitespace inside a part: RDKit reads CC (named O), as officially: wrong
        ([smiles("CCO..O")], ["CCO.O"]),  # empty part: invalid
        (["I cannot answer that."], ["CCO"]),  # no answer
        ([], ["CCO"]),  # no prediction at all
        ([smiles("CCN")], ["CCO"]),  # valid, wrong
    ]
    metrics = score("name_conversion-i2s", samples)
    assert metrics["num_samples"] == 8
    assert metrics["num_no_answer"] == 2
    assert metrics["num_valid"] == 3
    assert metrics["validity"] == pytest.approx(3 / 6)
    assert metrics["exact_match"] == pytest.approx(1 / 8)  # over all samples
    # the stricter reading: whitespace inside a part is no SMILES
    assert score("name_conversion-i2s", samples, read_as(strict_smiles=True))["num_valid"] == 2


def test_smiles_fts_known_value():
    from rdkit import Chem, DataStructs
    from rdkit.Chem import MACCSkeys, rdFingerprintGenerator

    pred, gold = "CCOc1ccccc1", "CCNc1ccccc1"
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2)
    p, g = Chem.MolFromSmiles(pred), Chem.MolFromSmiles(gold)
    morgan = DataStructs.TanimotoSimilarity(gen.GetSparseCountFingerprint(p), gen.GetSparseCountFingerprint(g))
    maccs = DataStructs.TanimotoSimilarity(MACCSkeys.GenMACCSKeys(p), MACCSkeys.GenMACCSKeys(g))
    rdk = DataStructs.TanimotoSimilarity(Chem.RDKFingerprint(p), Chem.RDKFingerprint(g))
    # an invalid second sample must not enter the FTS mean; a perfect one enters with 1
    metrics = score(
        "forward_synthesis",
        [([smiles(pred)], [gold]), ([smiles("C1CC")], [gold]), ([smiles(gold)], [gold])],
    )
    assert metrics["fts"] == pytest.approx((morgan + 1) / 2)
    assert metrics["fts_maccs"] == pytest.approx((maccs + 1) / 2)
    assert metrics["fts_rdk"] == pytest.approx((rdk + 1) / 2)
    assert 0 < morgan < 1


def test_smiles_fts_best_gold_and_multifragment():
    # the best of several golds is used
    one = score("forward_synthesis", [([smiles("CCO")], ["c1ccccc1", "CCO"])])
    assert one["fts"] == pytest.approx(1.0)
    # multi-fragment: the fingerprint of the whole molecule, so a missing fragment lowers it
    partial = score("retrosynthesis", [([smiles("CCO")], ["CCO.c1ccccc1"])])
    assert 0 < partial["fts"] < 1


def test_smiles_topk():
    preds = [smiles("CCC"), smiles("CCN"), smiles("CCO"), smiles("C"), smiles("N")]
    metrics = score("retrosynthesis", [(preds, ["OCC"])])
    assert metrics["top1_exact_match"] == metrics["exact_match"] == 0.0
    assert metrics["top3_exact_match"] == 1.0
    assert metrics["top5_exact_match"] == 1.0
    assert "top10_exact_match" not in metrics  # only 5 predictions were given
    single = score("retrosynthesis", [([smiles("CCO")], ["CCO"])])
    assert set(k for k in single if k.startswith("top")) == {"top1_exact_match"}
    # samples with fewer predictions than k use all they have
    mixed = score("retrosynthesis", [(preds, ["OCC"]), ([smiles("CCO")], ["CCO"]), ([smiles("C")], ["CCO"])])
    assert mixed["top3_exact_match"] == pytest.approx(2 / 3)
    assert mixed["exact_match"] == pytest.approx(1 / 3)
    # only the first 10 predictions count
    many = [smiles("C")] * 10 + [smiles("CCO")]
    assert score("retrosynthesis", [(many, ["CCO"])])["top10_exact_match"] == 0.0


def test_parse_molecule_edge_cases():
    assert parse_molecule("") is None
    assert parse_molecule("C" * 5000) is None  # over the length cap
    assert parse_molecule("C\x00C") is None
    assert parse_molecule("*C") is not None  # dummy atom: parses, keyed by canonical SMILES
    assert parse_molecule("[Na+].[Cl-]").keys == parse_molecule("[Cl-];[Na+]").keys


# --------------------------------------------------------------------------- formula tasks


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("C2H6O", "H6C2O", True),
        ("C2H6O", "C2 H6 O", True),
        ("C2H6O", "CH3CH2OH", True),
        ("C3H9N", "(CH3)3N", True),
        ("C2H3O2-", "C2H3O2-1", True),
        ("C2H3O2-", "C2H3O2", False),  # charge matters
        ("Fe+3", "Fe+++", True),
        ("Fe+3", "Fe+2", False),
        ("C2H6O", "C2H6O2", False),
        ("CO", "Co", False),  # carbon monoxide is not cobalt
        ("CH4", "[13C]H4", False),  # an isotope is another atom
        ("CD4", "C[2H]4", True),
        ("C2H8O2", "C2H6O.H2O", True),
        ("C2H10O3", "C2H6O.2H2O", True),
        ("C2H6O", "C2H6ON0", True),  # a zero count drops out
    ],
)
def test_formula_matching(a, b, same):
    pa, pb = parse_formula(a), parse_formula(b)
    assert pa is not None and pb is not None
    assert (pa == pb) is same


@pytest.mark.parametrize("text", ["", "Xx2", "C2H6O(", "C2)H6", "c2h6o", "C2H6O!", "[0C]", "+", "2", "CCO;O", None])
def test_formula_unparseable(text):
    assert parse_formula(text) is None


def test_formula_task_metrics():
    task = "name_conversion-s2f"
    samples = [
        ([tagged(task, "H6C2O")], ["C2H6O"]),  # right, reordered
        ([tagged(task, "C2H6O2"), tagged(task, "OC2H6"), "x"], ["C2H6O"]),  # right at rank 2
        ([tagged(task, "C2 H6 O")], ["C2H6O"]),  # not the official syntax (spaces): invalid, wrong
        (["no tags"], ["C2H6O"]),  # no answer
    ]
    metrics = score(task, samples)
    assert metrics["exact_match"] == pytest.approx(1 / 4)
    assert "top3_exact_match" in metrics and metrics["top3_exact_match"] == pytest.approx(2 / 4)
    assert metrics["num_invalid"] == 1
    assert metrics["num_no_answer"] == 1
    assert score("name_conversion-i2f", [([tagged(task, "C2H6O")], ["C2H4O", "C2H6O"])])["exact_match"] == 1.0


# --------------------------------------------------------------------------- IUPAC


def test_iupac_set_matching():
    task = "name_conversion-s2i"
    gold = ["sodium;2-hydroxypropanoate"]
    assert score(task, [([tagged(task, "2-hydroxypropanoate;sodium")], gold)])["exact_match"] == 1.0
    assert score(task, [([tagged(task, " sodium ; 2-hydroxypropanoate ;")], gold)])["exact_match"] == 1.0
    assert score(task, [([tagged(task, "sodium;sodium;2-hydroxypropanoate")], gold)])["exact_match"] == 1.0
    assert score(task, [([tagged(task, "sodium")], gold)])["exact_match"] == 0.0
    assert score(task, [([tagged(task, "Sodium;2-hydroxypropanoate")], gold)])["exact_match"] == 0.0
    assert score(task, [([tagged(task, "ethanol")], ["methanol", "ethanol"])])["exact_match"] == 1.0
    top = score(task, [([tagged(task, "methanol"), tagged(task, "x"), tagged(task, "ethanol")], ["ethanol"])])
    assert top["exact_match"] == 0.0 and top["top3_exact_match"] == 1.0


# --------------------------------------------------------------------------- numbers


def test_rmse_known_value():
    task = "property_prediction-esol"
    samples = [
        ([tagged(task, "-1.0")], ["-2.0"]),  # error 1
        ([tagged(task, "3")], ["1"]),  # error 2
        ([tagged(task, "\u22120.5")], ["-0.5"]),  # Unicode minus, error 0
        ([tagged(task, "about 3")], ["1"]),  # invalid
        ([tagged(task, "nan")], ["1"]),  # not finite: invalid
        ([tagged(task, "1e999")], ["1"]),  # overflows to inf: invalid
        ([tagged(task, "-inf")], ["1"]),
        (["I do not know"], ["1"]),  # no answer
    ]
    metrics = score(task, samples)
    assert metrics["rmse"] == pytest.approx(math.sqrt((1 + 4 + 0) / 3))
    assert metrics["num_valid"] == 3
    assert metrics["num_invalid"] == 4
    assert metrics["num_no_answer"] == 1
    assert metrics["num_valid"] + metrics["num_invalid"] + metrics["num_no_answer"] == metrics["num_samples"]


def test_a_nan_gold_is_an_invalid_gold_not_an_invalid_answer():
    task = "property_prediction-esol"
    metrics = score(task, [([tagged(task, "-1.5")], ["NaN"]), ([tagged(task, "2")], ["inf"]),
                           ([tagged(task, "1.0")], ["-1.0"])])
    assert metrics["num_invalid_gold"] == 2 and metrics["num_invalid"] == 0 and metrics["num_valid"] == 1
    assert metrics["rmse"] == pytest.approx(2.0)  # the one sample with a gold
    # A NaN among golds is skipped: the other gold scores the answer.
    assert score(task, [([tagged(task, "-1.5")], ["nan", "-1.0"])])["rmse"] == pytest.approx(0.5)


def test_the_rmse_of_finite_errors_is_finite_exact_and_silent():
    """Three answers of 1e154 each have a finite squared error whose plain sum is inf: once an RMSE of inf
    (null in JSON), then counted as overflows. Summed in two scales, their RMSE is theirs, with no warning
    from the scorer or the bootstrap."""
    import warnings

    from llasmol.metrics.intervals import bootstrap_intervals, per_sample_statistics

    task = "property_prediction-lipo"
    records = [{"task": task, "input": f"C{i}", "gold": "2.0", "predictions": [tagged(task, "1e154")]}
               for i in range(3)]
    records.append({"task": task, "input": "CCC", "gold": "2.0", "predictions": [tagged(task, "2.5")]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = score_records(records)[task]
        intervals = bootstrap_intervals(per_sample_statistics(records), resamples=50)[task]
    # Each square is finite (1e308), only their plain sum overflows: the RMSE is finite, as the errors are.
    assert metrics["num_overflow"] == 0 and metrics["num_invalid"] == 0 and metrics["num_valid"] == 4
    assert metrics["rmse"] == pytest.approx(1e154 * math.sqrt(3 / 4), rel=1e-12)  # the 2.5 is below its precision
    assert math.isfinite(intervals["rmse"][0]) and math.isfinite(intervals["rmse"][1])
    three = score(task, [([tagged(task, "1.2e154")], ["0"])] * 3)
    assert three["num_valid"] == 3 and three["rmse"] == pytest.approx(1.2e154, rel=1e-12)
    # Small and large errors together, and the largest float: exact to rounding, never inf.
    mixed = score(task, [([tagged(task, "3")], ["0"]), ([tagged(task, "4e200")], ["0"])])
    assert mixed["rmse"] == pytest.approx(4e200 / math.sqrt(2), rel=1e-12)  # the 9 is below its precision
    assert score(task, [([tagged(task, "1.7e308")], ["0"])] * 5)["rmse"] == pytest.approx(1.7e308, rel=1e-12)
    small = score(task, [([tagged(task, "3")], ["0"]), ([tagged(task, "4")], ["0"])])
    assert small["rmse"] == pytest.approx(math.sqrt(12.5), rel=1e-15)
    # Only a difference float64 cannot hold is counted apart.
    overflow = score(task, [([tagged(task, "1.7e308")], ["-1.7e308"])])
    assert overflow["num_overflow"] == 1 and overflow["num_invalid"] == 1 and overflow["num_valid"] == 0


def test_rmse_closest_gold_and_no_valid():
    task = "property_prediction-lipo"
    assert score(task, [([tagged(task, "2.0")], ["0.0", "2.5"])])["rmse"] == pytest.approx(0.5)
    assert math.isnan(score(task, [([tagged(task, "x")], ["1"])])["rmse"])


# --------------------------------------------------------------------------- booleans


def test_classification_known_confusion():
    """Accuracy over all samples; F1 and MCC over the yes/no answers only, as the paper's code."""
    task = "property_prediction-bbbp"
    yes, no = tagged(task, "Yes"), tagged(task, "No")
    samples = (
        [([yes], ["Yes"])] * 3  # tp 3
        + [([no], ["Yes"])] * 1  # fn 1
        + [([tagged(task, "maybe")], ["Yes"])]  # invalid: wrong, outside the confusion counts
        + [([no], ["No"])] * 2  # tn 2
        + [([yes], ["No"])] * 1  # fp 1
        + [(["no tag here"], ["No"])]  # missing: wrong, outside the confusion counts
        + [([tagged(task, " yes. ")], ["Yes"])]  # a period: invalid, as officially (case and spaces are fine)
    )
    metrics = score(task, samples)
    assert (metrics["tp"], metrics["fn"], metrics["tn"], metrics["fp"]) == (3, 1, 2, 1)
    assert metrics["num_samples"] == 10
    assert metrics["num_invalid"] == 2
    assert metrics["num_no_answer"] == 1
    assert metrics["accuracy"] == pytest.approx(5 / 10)
    assert metrics["f1"] == pytest.approx(6 / 8)  # 2tp / (2tp + fp + fn)
    assert metrics["mcc"] == pytest.approx(5 / 12)  # (3*2 - 1*1) / sqrt(4*4*3*3)
    lenient = score(task, samples, read_as(lenient_booleans=True))  # one trailing period dropped: the last is a tp
    assert (lenient["tp"], lenient["num_invalid"], lenient["accuracy"]) == (4, 1, pytest.approx(6 / 10))
    assert lenient["mcc"] == pytest.approx(7 / 15)  # (4*2 - 1*1) / sqrt(5*5*3*3)


def test_sider_golds_are_per_target_not_pooled_over_the_molecule():
    """Two side effects of one molecule are two questions: a wrong answer to one is not made right
    by the other's label (the scorer pools golds only for the generation tasks)."""
    task = "property_prediction-sider"
    records = [
        {"task": task, "input": f"Does CCO cause {t}?", "raw_input": "CCO", "target": t, "gold": gold,
         "predictions": [tagged(task, "No" if gold == "Yes" else "Yes")]}
        for t, gold in (("Eye disorders", "Yes"), ("Hepatobiliary disorders", "No"))
    ]
    metrics = score_records(records)[task]
    assert metrics["accuracy"] == 0.0 and metrics["num_samples"] == 2
    # the same two records with the right answers are both right
    for r in records:
        r["predictions"] = [tagged(task, r["gold"])]
    assert score_records(records)[task]["accuracy"] == 1.0


def test_property_golds_are_each_samples_own_but_generation_golds_pool():
    esol = "property_prediction-esol"
    records = [
        {"task": esol, "input": "CCO", "gold": "1.0", "predictions": [tagged(esol, "3.0")]},
        {"task": esol, "input": "CCO", "gold": "3.0", "predictions": [tagged(esol, "3.0")]},
    ]
    assert score_records(records)[esol]["rmse"] == pytest.approx(math.sqrt(4 / 2))
    i2s = "name_conversion-i2s"
    records = [
        {"task": i2s, "input": "x", "raw_input": "ethanol", "gold": "CCO", "predictions": [smiles("OCC")]},
        {"task": i2s, "input": "y", "raw_input": "ethanol", "gold": "C(O)C", "predictions": [smiles("CCO")]},
        {"task": i2s, "input": "x", "raw_input": "methanol", "gold": "CO", "predictions": [smiles("CCO")]},
    ]
    assert score_records(records)[i2s]["exact_match"] == pytest.approx(2 / 3)


def test_a_prediction_matching_only_another_samples_gold_for_the_same_input_counts():
    """Generation tasks pool golds by input (FS: one reactant set, several recorded products): a prediction
    that is none of its own sample's golds but another's for the same input is right; a wrong prediction
    added to a pooled input never raises exact match."""
    fs = "forward_synthesis"
    records = [
        {"task": fs, "input": "A", "gold": "CCO", "predictions": [smiles("CCN")]},  # the other sample's gold
        {"task": fs, "input": "A", "gold": "CCN", "predictions": [smiles("C1CC1")]},  # wrong
        {"task": fs, "input": "B", "gold": "CCC", "predictions": [smiles("CCO")]},  # A's gold, not B's
    ]
    got = score_records(records)[fs]
    assert got["exact_match"] == pytest.approx(1 / 3)
    assert got["num_samples"] == 3
    more = records + [{"task": fs, "input": "A", "gold": "CO", "predictions": [smiles("CCCC")]}]
    assert score_records(more)[fs]["exact_match"] == pytest.approx(1 / 4)


def test_captions_are_scored_against_every_gold_of_the_input():
    task = "molecule_captioning"
    golds = ["The molecule is a toxic gas used in industry.",
             "The molecule is a primary alcohol that is ethane in which one hydrogen is replaced by a hydroxy group."]
    best = score(task, [([golds[1]], golds)])
    assert best["bleu4"] == pytest.approx(1.0) and best["rougeL"] == pytest.approx(1.0)
    assert best["meteor"] > 0.99
    first_only = score(task, [([golds[1]], golds[:1])])
    assert first_only["bleu4"] < 0.5 and first_only["rougeL"] < 0.5
    # Pooled across the samples sharing the input, as the other generation tasks.
    records = [{"task": task, "input": "CCO", "gold": golds[0], "predictions": [golds[1]]},
               {"task": task, "input": "CCO", "gold": golds[1], "predictions": [golds[0]]}]
    pooled = score_records(records)[task]
    assert pooled["rougeL"] == pytest.approx(1.0) and pooled["bleu4"] == pytest.approx(1.0)


def test_classification_degenerate():
    task = "property_prediction-hiv"
    metrics = score(task, [([tagged(task, "No")], ["No"])] * 5)
    assert metrics["accuracy"] == 1.0 and metrics["f1"] == 0.0 and metrics["mcc"] == 0.0
    # several golds: a match with any is correct
    assert score(task, [([tagged(task, "Yes")], ["No", "Yes"])])["accuracy"] == 1.0


# --------------------------------------------------------------------------- whole files, additivity

RECORDS = [
    {"task": "forward_synthesis", "input": "A", "gold": "CCO", "predictions": [smiles("OCC")]},
    {"task": "forward_synthesis", "input": "A", "gold": "CCN", "predictions": [smiles("CCN")]},
    {"task": "forward_synthesis", "input": "B", "gold": ["c1ccccc1"], "predictions": [smiles("C1=CC=CC=C1")]},
    {"task": "forward_synthesis", "input": "C", "gold": "CCO", "predictions": ["nothing"]},
    {"task": "retrosynthesis", "input": "A", "gold": "CCO.O", "predictions": [smiles("CC"), smiles("O.CCO")]},
    {"task": "molecule_generation", "input": "d", "gold": "CC", "predictions": [smiles("C1CC")]},
    {"task": "name_conversion-i2s", "input": "n", "gold": "CC", "predictions": [smiles("CC")]},
    {"task": "name_conversion-i2f", "input": "ethanol", "gold": "C2H6O", "predictions": [tagged("name_conversion-i2f", "OH6C2")]},
    {"task": "name_conversion-s2f", "input": "CCO", "gold": "C2H6O", "predictions": [tagged("name_conversion-s2f", "C2H6")]},
    {"task": "name_conversion-s2i", "input": "CCO", "gold": "ethanol", "predictions": [tagged("name_conversion-s2i", "ethanol")]},
    {"task": "property_prediction-esol", "input": "CCO", "gold": "0.5", "predictions": [tagged("property_prediction-esol", "1.5")]},
    {"task": "property_prediction-lipo", "input": "CCO", "gold": "-1.4", "predictions": [tagged("property_prediction-lipo", "x")]},
    {"task": "property_prediction-bbbp", "input": "CCO", "gold": "Yes", "predictions": [tagged("property_prediction-bbbp", "Yes")]},
    {"task": "property_prediction-clintox", "input": "CCO", "gold": "No", "predictions": [tagged("property_prediction-clintox", "Yes")]},
    {"task": "property_prediction-hiv", "input": "CCO", "gold": "No", "predictions": ["?"]},
    {"task": "property_prediction-sider", "input": "CCO", "gold": "Yes", "predictions": [tagged("property_prediction-sider", "yes")]},
    {"task": "molecule_captioning", "input": "CCO", "gold": "The molecule is ethanol.", "predictions": ["The molecule is ethanol."]},
    {"task": "molecule_captioning", "input": "CC", "gold": "The molecule is ethane, a gas.", "predictions": ["It is an alkane gas."]},
]


@pytest.mark.slow
def test_score_records_pools_golds_by_input():
    results = score_records(RECORDS)
    assert set(results) == {r["task"] for r in RECORDS}
    fs = results["forward_synthesis"]
    assert fs["num_samples"] == 4
    assert fs["exact_match"] == pytest.approx(3 / 4)
    assert fs["num_no_answer"] == 1
    assert fs["validity"] == 1.0
    assert results["retrosynthesis"]["top1_exact_match"] == 0.0
    assert "top3_exact_match" not in results["retrosynthesis"]  # 2 predictions only
    assert results["molecule_generation"]["validity"] == 0.0
    assert results["name_conversion-i2f"]["exact_match"] == 1.0
    assert results["name_conversion-s2f"]["exact_match"] == 0.0
    assert results["property_prediction-esol"]["rmse"] == pytest.approx(1.0)
    assert results["property_prediction-lipo"]["num_invalid"] == 1
    assert results["property_prediction-sider"]["accuracy"] == 1.0
    assert results["property_prediction-hiv"]["accuracy"] == 0.0
    for task, metrics in results.items():
        assert {"num_samples", "num_no_answer"} <= set(metrics)
        assert all(isinstance(v, float) for v in metrics.values()), task


def _sum(stats_list):
    total: dict[str, float] = {}
    for stats in stats_list:
        add_stats(total, stats)
    return total


def test_stats_of_halves_add_up_to_the_whole():
    golds = {}
    for r in RECORDS:
        golds.setdefault((r["task"], r["input"]), []).extend([r["gold"]] if isinstance(r["gold"], str) else r["gold"])
    per_sample = [(r["task"], sample_stats(r["task"], r["predictions"], golds[(r["task"], r["input"])])) for r in RECORDS]
    for stats_task, stats in per_sample:
        assert tuple(stats) == STATS[stats_task]
    whole = score_records(RECORDS)
    for task in whole:
        mine = [s for t, s in per_sample if t == task]
        first, second = _sum(mine[::2]), _sum(mine[1::2])
        merged = add_stats(dict(first), second)
        assert merged == pytest.approx(_sum(mine))
        got = finalize(task, merged)
        for key, value in whole[task].items():
            assert got[key] == pytest.approx(value, nan_ok=True), (task, key)


def test_unknown_task_raises():
    with refused("'nope'"):
        sample_stats("nope", ["x"], ["y"])
    with refused("'nope'"):
        finalize("nope", {})


def test_finalize_with_no_samples_is_zero_not_an_error():
    """No sample: every count is 0, every rate 0.0 (no ZeroDivisionError), RMSE and FTS NaN (nothing to average:
    the official scorer's np.mean of no valid answer is NaN too)."""
    from llasmol.metrics.scoring import family

    for task in STATS:
        metrics = finalize(task, {})
        assert {"num_samples", "num_no_answer", "num_skipped"} <= set(metrics) <= (
            set(family(task).metric_names) | {"num_samples", "num_no_answer", "num_skipped"}), task
        for name, value in metrics.items():
            if name == "tokenizer_scibert":
                continue  # which tokenizer scored captions, not a count
            if name == "rmse" or name.startswith("fts"):
                assert math.isnan(value), (task, name)
            else:
                assert value == 0.0, (task, name)


def test_each_family_declares_what_it_reports_and_what_kind_it_is():
    """Tables, charts and W&B summaries read a family's names, counts and directions from its object."""
    from llasmol.metrics.families import COMMON_STATS, FAMILIES

    for fam in FAMILIES.values():
        stats = dict.fromkeys(COMMON_STATS + fam.stats, 1.0)
        if fam.name == "smiles":
            stats["num_no_answer"] = 0.0
        reported = set(fam.metrics(stats))
        assert reported <= set(fam.metric_names), (fam.name, reported - set(fam.metric_names))
        assert fam.counts <= set(fam.metric_names) and fam.lower_is_better <= set(fam.metric_names)
    assert FAMILIES["number"].score_lower_is_better and not FAMILIES["smiles"].score_lower_is_better


def test_each_family_judges_a_top1_answer_as_the_failure_tables_count_it():
    from llasmol.metrics.families import FAMILIES

    def judged(task, prediction, gold):
        return FAMILIES[get_task(task).family].judge(sample_stats(task, [prediction], [gold]))[0]

    fs = "forward_synthesis"
    assert judged(fs, "<SMILES> CCO </SMILES>", "OCC") == "correct"
    assert judged(fs, "<SMILES> CCN </SMILES>", "OCC") == "wrong"  # a molecule, not the gold one
    assert judged(fs, "<SMILES> C1CC </SMILES>", "OCC") == "invalid"  # does not parse
    assert judged("name_conversion-s2f", "<MOLFORMULA> C2H6O </MOLFORMULA>", "C2H6O") == "correct"
    assert judged("name_conversion-s2f", "<MOLFORMULA> CH4 </MOLFORMULA>", "C2H6O") == "wrong"
    assert judged("property_prediction-bbbp", "<BOOLEAN> No </BOOLEAN>", "Yes") == "wrong"
    assert judged("property_prediction-bbbp", "<BOOLEAN> maybe </BOOLEAN>", "Yes") == "invalid"
    assert judged("property_prediction-esol", "<NUMBER> -1.0 </NUMBER>", "-1.5") == "scored"
    assert judged("property_prediction-esol", "<NUMBER> about two </NUMBER>", "-1.5") == "invalid"

    def scored(task, prediction, gold):
        return FAMILIES[get_task(task).family].judge(sample_stats(task, [prediction], [gold]))

    # ... with the per-sample score the worst-examples tables sort by
    assert scored(fs, "<SMILES> CCO </SMILES>", "OCC") == ("correct", 1.0)  # FTS of the molecule with itself
    assert scored(fs, "<SMILES> C1CC </SMILES>", "OCC") == ("invalid", None)
    outcome, fts = scored(fs, "<SMILES> CCN </SMILES>", "OCC")
    assert outcome == "wrong" and 0.0 < fts < 1.0
    assert scored("name_conversion-s2f", "<MOLFORMULA> C2H6O </MOLFORMULA>", "C2H6O") == ("correct", None)
    assert scored("name_conversion-s2f", "<MOLFORMULA> 2x </MOLFORMULA>", "C2H6O") == ("invalid", None)
    assert scored("name_conversion-s2i", "<IUPAC> ethanol </IUPAC>", "ethanol") == ("correct", None)
    assert scored("name_conversion-s2i", "<IUPAC> methanol </IUPAC>", "ethanol") == ("wrong", None)
    assert scored("property_prediction-esol", "<NUMBER> -1.0 </NUMBER>", "-1.5") == ("scored", pytest.approx(0.5))
    # A gold that is no number: the answer may be fine, there is no error to give it
    assert scored("property_prediction-esol", "<NUMBER> -1.0 </NUMBER>", "n/a") == ("scored", None)
    assert scored("property_prediction-bbbp", "<BOOLEAN> Yes </BOOLEAN>", "Yes") == ("correct", None)
    caption = scored("molecule_captioning", "<CAPTION> The molecule is an alcohol. </CAPTION>",
                     "The molecule is an alcohol.")
    stats = sample_stats("molecule_captioning", ["<CAPTION> The molecule is an alcohol. </CAPTION>"],
                         ["The molecule is an alcohol."])
    assert caption == ("scored", FAMILIES["caption"].metrics(stats)["meteor"]) and caption[1] > 0.5  # its METEOR
    assert scored("molecule_captioning", "<CAPTION> zzz </CAPTION>", "The molecule is an alcohol.") == ("scored", 0.0)


def test_tables_list_every_score_before_every_count():
    from llasmol.metrics.families import COUNTS, FAMILIES, METRIC_ORDER

    everything = {m for f in FAMILIES.values() for m in f.metric_names}
    assert everything <= set(METRIC_ORDER)
    first_count = min(i for i, m in enumerate(METRIC_ORDER) if m in COUNTS)
    assert all(m in COUNTS or m in ("num_samples", "num_no_answer", "num_skipped") for m in METRIC_ORDER[first_count:])
    assert METRIC_ORDER[0] not in COUNTS and "exact_match" in METRIC_ORDER[:first_count]


def test_isotope_counts_default_to_one_and_labelled_atoms_differ_from_natural_ones():
    assert parse_formula("[13C]H4") == parse_formula("[13C]1H4") != parse_formula("CH4")
    assert parse_formula("[1H]2O") != parse_formula("H2O")  # an explicit mass is a label, not the natural mix
    assert parse_formula("[2H]2O") == parse_formula("D2O")
    # inside a group, a labelled atom is multiplied with the group, as any atom is
    assert parse_formula("C([13C]H3)2") == parse_formula("C[13C]2H6") != parse_formula("C[13C]H6")


def test_the_atom_bound_admits_300_atoms_and_refuses_301():
    from llasmol.metrics.molecules import MAX_ATOMS, too_complex

    assert MAX_ATOMS == 300
    assert not too_complex("C" * 300) and too_complex("C" * 301)
    stats = sample_stats("forward_synthesis", ["<SMILES> " + "C" * 301 + " </SMILES>"], ["CCO"])
    assert stats["num_too_complex"] == 1 and stats["num_valid"] == 0


def test_without_a_task_the_first_closed_tag_pair_gives_the_answer():
    from llasmol.metrics.extract import any_answer

    assert any_answer("It is <NUMBER> -1.2 </NUMBER> mol/L") == "-1.2"
    assert any_answer("<SMILES> CCO </SMILES> and <NUMBER> 3 </NUMBER>") == "CCO"
    assert any_answer("<NUMBER> 3 </NUMBER> then <SMILES> CCO </SMILES>") == "3"
    assert any_answer("<SMILES> CCO and no closing tag") is None
    assert any_answer("no tags at all") is None
    assert any_answer(None) is None


def test_molecules_without_an_inchi_share_the_empty_one_unless_smiles_are_read_strictly():
    # InChI has no attachment points: officially every '*' part has the empty InChI, so all of them match
    # (utils/metrics.py get_molecule_id); strictly they are keyed by canonical SMILES.
    assert parse_molecule("*CC").keys == parse_molecule("*CCC").keys == frozenset({""})
    assert parse_molecule("*C.CCO").keys == parse_molecule("*CC.OCC").keys != parse_molecule("*C").keys
    assert sample_stats("forward_synthesis", ["<SMILES> *CCC </SMILES>"], ["*CC"])["hit_top1"] == 1.0
    strict = read_as(strict_smiles=True)
    assert parse_molecule("*CC", strict=True).keys == parse_molecule("CC*", strict=True).keys == frozenset({"smiles:*CC"})
    assert parse_molecule("*CC", strict=True).keys != parse_molecule("*CCC", strict=True).keys
    assert sample_stats("forward_synthesis", ["<SMILES> CC* </SMILES>"], ["*CC"], tasks=strict)["hit_top1"] == 1.0
    assert sample_stats("forward_synthesis", ["<SMILES> *CCC </SMILES>"], ["*CC"], tasks=strict)["hit_top1"] == 0.0
    # Every rank of the top-k reads as the table says, not the first alone.
    lower = ["<SMILES> C </SMILES>", "<SMILES> CC O </SMILES>"]  # officially ethane named O; strictly none
    assert sample_stats("forward_synthesis", lower, ["CC"])["hit_top3"] == 1.0
    assert sample_stats("forward_synthesis", lower, ["CC"], tasks=strict)["hit_top3"] == 0.0
    # Both readings live side by side (each cached apart): the official one is unchanged by the strict one.
    assert parse_molecule("*CC").keys == frozenset({""})
    assert sample_stats("forward_synthesis", ["<SMILES> *CCC </SMILES>"], ["*CC"])["hit_top1"] == 1.0


def test_a_number_answer_of_up_to_1000_characters_is_read_and_a_longer_one_is_no_number():
    from llasmol.metrics.families import parse_number

    assert parse_number("0" * 999 + "7") == 7.0
    assert parse_number("0" * 1000 + "7") is None  # bounded before float() sees it
    assert parse_number(" \u22122.5 ") == -2.5  # a typographic minus, spaces around
    assert parse_number("1e400") is None and parse_number("nan") is None


def test_a_formula_of_up_to_1000_characters_is_read_by_both_forms_and_a_longer_one_by_neither():
    from llasmol.metrics.formula import parse_formula_official

    for parse in (parse_formula, parse_formula_official):
        at_bound, over = "CH4" * 333 + "O", "CH4" * 333 + "O2"  # 1000 and 1001 characters
        assert parse(at_bound) is not None and parse(over) is None, parse


def test_the_ring_bound_admits_40_ring_closures_and_refuses_41():
    """Closures are bonds - atoms + 1 a molecule: 40 cyclopropanes in a chain have 40 (and 120 atoms)."""
    from llasmol.metrics.molecules import MAX_RING_CLOSURES, too_complex

    assert MAX_RING_CLOSURES == 40
    rings = lambda n: "C1CC1" * n  # noqa: E731
    assert not too_complex(rings(40)) and too_complex(rings(41))
    assert not too_complex(".".join([rings(20), rings(20)]))  # counted per molecule, summed
    assert too_complex(".".join([rings(20), rings(21)]))


# --------------------------------------------------------------------------- bounds and branches the tables rely on


def test_top1_is_reported_even_when_no_sample_has_a_prediction():
    """top1_exact_match is always a column (k=1 needs no sample with a prediction); top3 and up only when a
    sample had that many (App. A.4)."""
    for samples in ([([], ["CCO"]), ([], ["CCC"])],  # every prompt skipped: not one prediction
                    [([], ["CCO"]), (["no answer here"], ["CCO"])]):
        metrics = score("retrosynthesis", samples)
        assert metrics["top1_exact_match"] == 0.0 and metrics["exact_match"] == 0.0
        assert not any(k in metrics for k in ("top3_exact_match", "top5_exact_match", "top10_exact_match"))
    assert finalize("retrosynthesis", {})["top1_exact_match"] == 0.0  # nothing scored at all: still a column


def test_a_right_answer_at_rank_two_counts_for_top3_only():
    # The second prediction is judged by its own molecule, not by the top-1 answer's.
    preds = [smiles("CCC"), smiles("OCC"), smiles("N")]
    metrics = score("retrosynthesis", [(preds, ["CCO"])])
    assert metrics["top1_exact_match"] == 0.0 and metrics["top3_exact_match"] == 1.0
    # a sample with exactly 3 predictions reports top3 (len >= k), not top5
    assert "top5_exact_match" not in metrics


def test_a_valid_answer_against_golds_that_do_not_parse_has_similarity_zero():
    """App. A.4: a gold that does not parse counts as 0 in the FTS mean; the answer is still valid."""
    metrics = score("forward_synthesis", [([smiles("CCO")], ["((("])])
    assert metrics["num_valid"] == 1 and metrics["validity"] == 1.0 and metrics["exact_match"] == 0.0
    assert metrics["fts"] == 0.0 and metrics["fts_maccs"] == 0.0 and metrics["fts_rdk"] == 0.0


def test_a_too_complex_answer_is_counted_once_and_only_when_unparsed():
    big = smiles("C" * 301)
    metrics = score("forward_synthesis", [([big], ["CCO"]), ([smiles("CCO")], ["CCO"]), (["none"], ["CCO"])])
    assert metrics["num_too_complex"] == 1.0 and metrics["num_valid"] == 1.0
    assert metrics["validity"] == pytest.approx(1 / 2)  # too complex counts as not valid, of 2 answered


def test_mcc_with_a_denominator_of_one_is_computed_not_zeroed():
    # tp=1, tn=1, fp=fn=0: sqrt(1*1*1*1) = 1, MCC = (1*1 - 0) / 1 = 1
    task = "property_prediction-bbbp"
    metrics = score(task, [([tagged(task, "Yes")], ["Yes"]), ([tagged(task, "No")], ["No"])])
    assert (metrics["tp"], metrics["tn"], metrics["fp"], metrics["fn"]) == (1, 1, 0, 0)
    assert metrics["mcc"] == 1.0 and metrics["f1"] == 1.0 and metrics["accuracy"] == 1.0


def test_a_yes_no_answer_to_a_sample_without_a_yes_no_gold_is_wrong_and_not_invalid():
    task = "property_prediction-bbbp"
    metrics = score(task, [([tagged(task, "Yes")], ["unknown"])])
    assert metrics["accuracy"] == 0.0 and metrics["num_invalid"] == 0.0
    assert (metrics["tp"], metrics["fp"], metrics["tn"], metrics["fn"]) == (0, 0, 0, 0)


def test_boolean_answers_accept_case_and_spaces_and_leniently_one_trailing_period():
    from llasmol.metrics.families import parse_boolean

    assert parse_boolean(" YES ") == "Yes" and parse_boolean("No\n") == "No"
    assert parse_boolean("no.") is parse_boolean("No .") is parse_boolean("Yes!") is None  # as officially
    assert parse_boolean("no.", True) == "No" and parse_boolean("No .", True) == "No"
    assert parse_boolean("yes..", True) is None and parse_boolean("y") is None and parse_boolean(None) is None
    assert parse_boolean("Yes", True) == "Yes"  # no period: nothing cut


def test_iupac_parts_drop_empty_parts_and_an_empty_name_is_no_name():
    from llasmol.metrics.families import iupac_parts

    assert iupac_parts(" b ; a ;") == frozenset({"a", "b"})
    assert iupac_parts(" ; ") is None and iupac_parts(None) is None


def test_bleu2_and_bleu4_are_the_orders_their_names_say():
    """A 4-word answer sharing its first 3 words with a 4-word gold: unigram precision 3/4, bigram 2/3,
    trigram 1/2, 4-gram 0. BLEU-2 = sqrt(3/4 * 2/3) (no brevity penalty: equal lengths); BLEU-4 is 0
    (the paper's corpus BLEU has no smoothing)."""
    task = "molecule_captioning"
    metrics = score(task, [(["alpha beta gamma delta"], ["alpha beta gamma epsilon"])])
    assert metrics["bleu2"] == pytest.approx(math.sqrt(3 / 4 * 2 / 3))
    assert metrics["bleu4"] == pytest.approx(0.0, abs=1e-9)


def test_the_scoring_settings_default_to_the_official_readings_and_travel_with_the_table():
    from conftest import compose_config

    from llasmol.core.schema import check_config
    from llasmol.core.tasks import OFFICIAL
    from llasmol.metrics.families import FAMILIES, families

    every = {"lenient_formulas": True, "lenient_booleans": True, "strict_smiles": True}
    assert Scoring.of(every) == Scoring(True, True, True) and Scoring.of({}) == Scoring.of(None) == OFFICIAL
    assert Scoring.of({"lenient_formulas": True}) == Scoring(lenient_formulas=True)
    relaxed = families(Scoring.of(every))
    assert relaxed["formula"].scoring.lenient_formulas and relaxed["smiles"].scoring.strict_smiles
    assert FAMILIES["formula"].scoring == FAMILIES["boolean"].scoring == OFFICIAL  # the shared ones stay official
    assert families(Scoring.of(every)) is relaxed  # made once per reading
    # A command's table reads as its config says; the next command's, as its own says.
    words = ["paths.output_dir=/x", "predictions=/x.jsonl"]
    strict = check_config(compose_config([*words, "scoring.strict_smiles=true"], "evaluate")).tasks
    plain = check_config(compose_config(words, "evaluate")).tasks
    assert strict.scoring == Scoring(strict_smiles=True) and plain.scoring == OFFICIAL and plain is SMOLINSTRUCT
    assert strict.with_declared({"own": {"family": "number"}}).scoring == strict.scoring  # kept as runs are read


def test_sample_stats_counts_a_skipped_sample_only_when_told():
    from llasmol.metrics.scoring import is_skipped, judge

    plain = sample_stats("forward_synthesis", [smiles("CCO")], ["CCO"])
    assert plain["num_skipped"] == 0.0 and plain["num_samples"] == 1.0 and plain["num_no_answer"] == 0.0
    skipped = sample_stats("forward_synthesis", None, ["CCO"], skipped=True)
    assert skipped["num_skipped"] == 1.0 and skipped["num_no_answer"] == 1.0 and skipped["num_samples"] == 1.0
    assert is_skipped({"skipped": True, "predictions": ["x"]}) and is_skipped({"predictions": None})
    assert not is_skipped({"skipped": False, "predictions": []})
    # judge: skipped first, then no answer, then the family's own word
    assert judge("forward_synthesis", [smiles("CCO")], ["CCO"]) == ("correct", 1.0)
    assert judge("forward_synthesis", [smiles("CCO")], ["CCO"], skipped=True) == ("skipped", None)
    assert judge("forward_synthesis", ["nothing"], ["CCO"]) == ("no_answer", None)


def test_a_task_sample_without_rows_has_no_units():
    import numpy as np

    from llasmol.metrics.scoring import STATS as ALL_STATS, TaskSample

    empty = TaskSample("forward_synthesis", np.zeros((0, len(ALL_STATS["forward_synthesis"]))), np.zeros(0, dtype=np.int64))
    assert empty.n_units == 0
    three = TaskSample("forward_synthesis", np.zeros((3, len(ALL_STATS["forward_synthesis"]))), np.array([0, 1, 1]))
    assert three.n_units == 2


def test_a_closing_tag_just_before_the_opening_one_is_not_a_pair():
    assert extract_answer("forward_synthesis", "</SMILES><SMILES> CCO </SMILES>") == "CCO"
    assert extract_answer("forward_synthesis", "<SMILES></SMILES>") is None


def test_generation_tasks_pool_golds_by_input_and_property_tasks_do_not():
    """LLM4Chem's TASKS_WITH_READING_GOLD_FROM_DATASET: the 8 generation tasks pool the golds of samples that
    share a core input (one resampling unit per input); the 6 property tasks score each sample alone."""
    from llasmol.metrics.scoring import per_sample_statistics

    generation = {"forward_synthesis", "retrosynthesis", "molecule_captioning", "molecule_generation",
                  "name_conversion-i2f", "name_conversion-i2s", "name_conversion-s2f", "name_conversion-s2i"}
    records = [{"task": t, "input": f"prompt {j}", "raw_input": "same molecule", "gold": "x", "predictions": None,
                "skipped": True} for t in TASK_NAMES for j in range(2)]
    units = {t: s.n_units for t, s in per_sample_statistics(records).items()}
    assert units == {t: 1 if t in generation else 2 for t in TASK_NAMES}


def test_the_task_table_is_read_only_and_check_tasks_refuses_empty_repeated_or_unknown_lists():
    import dataclasses

    from llasmol.core.tasks import SMOLINSTRUCT

    check_tasks = SMOLINSTRUCT.check
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_task("forward_synthesis").pooled = False
    with pytest.raises(TypeError):  # the table itself is a value: no entry is set or removed
        SMOLINSTRUCT["mine"] = get_task("forward_synthesis")
    assert check_tasks(("retrosynthesis", "forward_synthesis")) == ["retrosynthesis", "forward_synthesis"]
    with refused("data.tasks", "forward_synthesis"):
        check_tasks([])
    with refused("data.tasks", "['retrosynthesis', 'retrosynthesis']"):
        check_tasks(["retrosynthesis", "retrosynthesis"])
    with refused("'nope'", "here", "forward_synthesis"):
        check_tasks(["retrosynthesis", "nope"], "here")
    assert get_task("property_prediction-esol").input_tag == "SMILES"
    assert get_task("molecule_generation").input_tag is None


@pytest.mark.parametrize("spelt", ["\uff46orward_synthesis", "forward_synthesis\u200b", "Forward_Synthesis",
                                   "forward_synthesis "])
def test_task_names_that_only_look_alike_never_count_as_one_or_as_two(tmp_path, spelt):
    """A full-width letter, a zero-width space, another case or a trailing space: each is refused with its
    escaped spelling and the name it resembles, in a predictions file and in data.tasks, so no two spellings
    split one task's samples into two rows (or pool them as one)."""
    import json

    from conftest import compose_config

    from llasmol.core.schema import check_config
    from llasmol.inference.predictions import read_predictions

    path = tmp_path / "p.jsonl"
    lines = [{"task": task, "input": "CCO", "gold": "CCO", "predictions": ["CCO"]} for task in ("forward_synthesis", spelt)]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    with refused(f"{path} line 2", ascii(spelt), "looks like forward_synthesis", untouched=tmp_path):
        read_predictions(path)
    with refused("data.tasks", ascii(spelt), "write forward_synthesis"):
        check_config(compose_config(["paths.output_dir=/x", f"data.tasks=[forward_synthesis,'{spelt}']"]))


def _key(charge=0, **counts):
    """A lenient formula key written out: `C=2, H_2=1` is two natural carbons and one hydrogen-2."""
    atoms = frozenset(((sym.split("_")[0], int(sym.split("_")[1]) if "_" in sym else 0), n)
                      for sym, n in counts.items())
    return atoms, charge


@pytest.mark.parametrize("text, expected", [
    ("C2H6O", _key(C=2, H=6, O=1)),
    ("C 2 H6\tO", _key(C=2, H=6, O=1)),
    ("C10", _key(C=10)),
    ("D2O", _key(H_2=2, O=1)),
    ("HT", _key(H=1, H_3=1)),
    ("[13C]H4", _key(C_13=1, H=4)),
    ("[1H]2O", _key(H_1=2, O=1)),
    ("([13C]H3)2", _key(C_13=2, H=6)),
    ("(CH3)3N", _key(C=3, H=9, N=1)),
    ("(CH3)N", _key(C=1, H=3, N=1)),
    ("((CH2)2)3", _key(C=6, H=12)),
    ("2H2O", _key(H=4, O=2)),
    ("C2H6O.2H2O", _key(C=2, H=10, O=3)),
    ("C2H6O·H2O", _key(C=2, H=8, O=2)),
    ("C0H4", _key(H=4)),
    ("C2H3O2-", _key(-1, C=2, H=3, O=2)),
    ("Fe+3", _key(3, Fe=1)),
    ("Fe+", _key(1, Fe=1)),
    ("Fe++", _key(2, Fe=1)),
    ("PO4-3", _key(-3, P=1, O=4)),
    ("Fe+10", _key(10, Fe=1)),
    ("2Cl-", _key(-2, Cl=2)),
    ("Na+.Cl-", _key(0, Na=1, Cl=1)),
    ("Ca+2.2Cl-", _key(0, Ca=1, Cl=2)),
])
def test_lenient_formula_keys_written_out(text, expected):
    """Every rule of the lenient syntax (module docstring) with the key written by hand."""
    from llasmol.metrics.formula import formula_key

    assert parse_formula(text) == expected
    assert formula_key(text, lenient=True) == expected


@pytest.mark.parametrize("text", ["", "  ", "2", ".", "C0", "[0C]", "[13Xx]", "Xx", "(CH3", "CH3)", "C2H6O!",
                                  "C.", None, 12])
def test_lenient_formula_rejects(text):
    assert parse_formula(text) is None


@pytest.mark.parametrize("text, expected", [
    ("C2H6O", {"C": 2, "H": 6, "O": 1}),
    ("CH3CH2OH", {"C": 2, "H": 6, "O": 1}),
    ("C2H6ON0", {"C": 2, "H": 6, "O": 1, "N": 0}),
    ("Xx2", {"Xx": 2}),
    ("c2h6o", {}),
    ("C2H3O2-", {"C": 2, "H": 3, "O": 2, "-": 1}),
    ("C2H3O2-1", {"C": 2, "H": 3, "O": 2, "-": 1}),
    ("C2H3O2-2", {"C": 2, "H": 3, "O": 2, "-": 2}),
    ("Fe+3", {"Fe": 1, "+": 3}),
    ("Fe+2-1", {"Fe": 1, "+": 2}),  # the first charge only
    ("C12", {"C": 12}),
])
def test_official_formula_keys_written_out(text, expected):
    """LLM4Chem's parse_molecule, as the module's docstring describes it, with the keys written by hand; a
    formula_key without `lenient` is this one."""
    from llasmol.metrics.formula import formula_key, parse_formula_official

    assert parse_formula_official(text) == frozenset(expected.items())
    assert formula_key(text) == frozenset(expected.items())


@pytest.mark.parametrize("text", ["", "C2 H6", "(CH3)2", "2H2O", "C2H6O.H2O", "+", None])
def test_official_formula_rejects(text):
    from llasmol.metrics.formula import parse_formula_official

    assert parse_formula_official(text) is None


def test_molecule_parsing_edges_and_whole_molecule_fingerprints():
    """A one-atom molecule is valid, ';' reads as '.', and a dotted answer's fingerprints are those of the
    whole dotted molecule (not of its first part)."""
    from rdkit import Chem, DataStructs

    from llasmol.metrics.molecules import best_tanimoto, molecule_keys, parse_gold_molecule

    assert parse_molecule("C") is not None and parse_molecule("[Na+]") is not None
    assert parse_molecule("CCO;O") == parse_molecule("O.CCO") != parse_molecule("CCO")
    for bad in (None, "", "CCO.", "C1CC", 7, "  ", " CC O", "CCO. O x"):
        assert parse_molecule(bad) is None and molecule_keys(bad) is None, bad
    # RDKit's reading, as officially: up to a part's first whitespace, unless the part starts with it
    assert parse_molecule("CC O").keys == parse_molecule("CC").keys == parse_molecule("CC\tethane").keys
    assert parse_molecule("CCO (ethanol).O", fingerprints=True) == parse_molecule("CCO.O", fingerprints=True)
    assert molecule_keys("OCC") == parse_molecule("CCO").keys == frozenset({"InChI=1S/C2H6O/c1-2-3/h3H,2H2,1H3"})
    assert parse_molecule("CCO").fingerprints is None
    whole = Chem.MolFromSmiles("CCO.c1ccccc1")
    fps = parse_gold_molecule("CCO.c1ccccc1").fingerprints
    assert set(fps) == {"morgan", "maccs", "rdk"}
    assert fps["rdk"] == Chem.RDKFingerprint(whole) != Chem.RDKFingerprint(Chem.MolFromSmiles("CCO"))
    assert fps["maccs"] == parse_molecule("c1ccccc1.CCO", fingerprints=True).fingerprints["maccs"]
    assert DataStructs.TanimotoSimilarity(fps["morgan"], parse_gold_molecule("CCO").fingerprints["morgan"]) < 1
    one = parse_gold_molecule("CCO").fingerprints
    assert best_tanimoto(one["morgan"], [one["morgan"]]) == 1.0
    assert 0.0 < best_tanimoto(one["morgan"], [fps["morgan"]]) < 1.0
    assert best_tanimoto(one["morgan"], [fps["morgan"], one["morgan"]]) == 1.0  # the best of them
    assert best_tanimoto(one["morgan"], []) == 0.0


def test_tanimoto_is_clamped_and_zero_when_rdkit_cannot_say(monkeypatch):
    """Each similarity is clamped to [0, 1] and NaN counts 0.0, in the bulk call and in the one-by-one fallback
    it takes when RDKit refuses the bulk call; what RDKit cannot compare at all is 0.0."""
    from llasmol.metrics import molecules

    assert molecules.best_tanimoto(None, ["not a fingerprint"]) == 0.0
    for rdkit_says, expected in (([float("nan")], 0.0), ([1.5, 0.2], 1.0), ([-0.25], 0.0), ([0.5, float("nan")], 0.5),
                                 ([0.25, 0.75, 0.5], 0.75)):
        monkeypatch.setattr(molecules.DataStructs, "BulkTanimotoSimilarity", lambda a, bs, v=rdkit_says: v)
        assert molecules.best_tanimoto(1, [2] * len(rdkit_says)) == expected

        def refused(a, bs):
            raise TypeError("no bulk")
        monkeypatch.setattr(molecules.DataStructs, "BulkTanimotoSimilarity", refused)
        says = iter(rdkit_says)
        monkeypatch.setattr(molecules.DataStructs, "TanimotoSimilarity", lambda a, b: next(says))
        assert molecules.best_tanimoto(1, [2] * len(rdkit_says)) == expected


def test_reading_a_bad_smiles_writes_nothing_to_stderr(capfd):
    """RDKit's parse errors are silenced (a scoring run reads thousands of bad answers)."""
    import llasmol.metrics.molecules  # noqa: F401  (importing it silences RDKit)
    from rdkit import Chem

    capfd.readouterr()
    assert Chem.MolFromSmiles("C1CC(") is None
    assert capfd.readouterr().err == ""


def test_each_score_says_how_many_samples_it_stands_on():
    """`support`: a share of all samples stands on all; validity on the answered, fingerprint similarity on the
    valid molecules, RMSE on the numbers, F1/MCC on the yes/no answers, caption scores on the non-empty ones;
    counts on nothing. Every score of every family has one, so a new metric cannot be shown without it."""
    from llasmol.metrics.families import COUNTS, FAMILIES
    from llasmol.metrics.support import support, support_note

    def smi(s):
        return f"<SMILES> {s} </SMILES>"

    records = ([{"task": "forward_synthesis", "input": str(i), "gold": "CCO", "predictions": [p]}
                for i, p in enumerate([smi("OCC"), smi("C1CC"), "no answer", smi("CC")] * 3)]
               + [{"task": "molecule_captioning", "input": str(i), "gold": "An alcohol.", "predictions": [p]}
                  for i, p in enumerate(["It is an alcohol.", "  ", "An acid."] * 4)])
    metrics = score_records(records)
    fs, mc = metrics["forward_synthesis"], metrics["molecule_captioning"]
    assert [support("forward_synthesis", m, fs) for m in ("exact_match", "validity", "fts", "fts_rdk", "num_valid")] \
        == [(12, 12), (9, 12), (6, 12), (6, 12), None]
    assert [support("molecule_captioning", m, mc) for m in ("meteor", "rougeL", "tokenizer_scibert")] \
        == [(8, 12), (8, 12), None]
    assert support_note("forward_synthesis", "fts", fs) == "n=6 of 12, too few"
    assert support_note("forward_synthesis", "validity", fs) == "n=9 of 12, too few"
    assert support_note("forward_synthesis", "exact_match", fs) == ""  # 12 of 12: enough, all of them
    assert support_note("forward_synthesis", "exact_match", {**fs, "num_samples": 4.0}) == "n=4, too few"
    assert support("no_such_task", "exact_match", fs) is None and support_note("forward_synthesis", "fts", {}) == ""
    for family in FAMILIES.values():
        for name in family.metric_names:
            counted = family.basis(name, {k: 1.0 for k in COUNTS} | {"num_samples": 3.0})
            assert (counted is None) == (name in COUNTS or name == "tokenizer_scibert"), (family.name, name)


def test_a_counted_value_is_a_float_that_keeps_its_note_through_copies_and_pickles():
    import copy
    import json
    import pickle

    from llasmol.metrics.support import Counted, with_support

    shown = with_support("property_prediction-esol", {"rmse": 0.63, "num_valid": 1.0, "num_samples": 30.0})
    value = shown["rmse"]
    assert isinstance(value, Counted) and value == 0.63 and value.note == "n=1 of 30, too few"
    assert shown["num_valid"] == 1.0 and not isinstance(shown["num_valid"], Counted)  # counts carry no note
    for again in (copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert again == 0.63 and again.note == value.note
    assert json.dumps(shown) == '{"rmse": 0.63, "num_valid": 1.0, "num_samples": 30.0}'  # files keep plain numbers


@pytest.mark.parametrize("n, total, note", [(9, 9, "n=9, too few"), (10, 10, ""), (11, 11, ""), (9, 30, "n=9 of 30, too few"),
                                            (10, 30, "n=10 of 30"), (11, 30, "n=11 of 30"), (0, 0, "n=0, too few")])
def test_too_few_begins_just_under_ten_samples_on_both_sides_of_the_bound(n, total, note):
    from llasmol.metrics.support import FEWEST_TO_COMPARE, note_of

    assert FEWEST_TO_COMPARE == 10
    assert note_of((n, total)) == note


def test_an_ordinary_and_a_huge_error_in_one_regression_file_sum_exactly():
    """RMSE over errors 1, 1e200 and 0: sqrt((1 + 1e400) / 3) = 1e200 / sqrt(3), with no overflow to inf in the
    squared sum (1e400 is past float64); infinite and NaN answers are invalid, not errors of their own."""
    from llasmol.metrics.scoring import score_records

    def rows(*answers):
        return [{"task": "property_prediction-esol", "input": "C" * i, "gold": ["1.0"],
                 "predictions": [f"<NUMBER> {a} </NUMBER>"]} for i, a in enumerate(answers, 1)]

    got = score_records(rows("2.0", "1e200", "1.0"))["property_prediction-esol"]
    assert got["rmse"] == pytest.approx(1e200 / 3 ** 0.5, rel=1e-12) and got["num_valid"] == 3
    got = score_records(rows("2.0", "1e400", "nan", "-inf"))["property_prediction-esol"]
    assert (got["rmse"], got["num_valid"], got["num_invalid"]) == (1.0, 1, 3)


WATER_AND_ETHANOL = frozenset({"InChI=1S/C2H6O/c1-2-3/h3H,2H2,1H3", "InChI=1S/H2O/h1H2"})
ETHANOL = frozenset({"InChI=1S/C2H6O/c1-2-3/h3H,2H2,1H3"})


@pytest.mark.parametrize("text, official, strict", [
    ("CCO . O", WATER_AND_ETHANOL, WATER_AND_ETHANOL),  # spaces around the parts: both readings strip them
    ("CCO.\tO", WATER_AND_ETHANOL, WATER_AND_ETHANOL),
    ("\tCCO\n", ETHANOL, ETHANOL),
    ("CCO .O x", WATER_AND_ETHANOL, None),  # a space inside the last part: RDKit's name officially, none strictly
    ("CC O", frozenset({"InChI=1S/C2H6/c1-2/h1-2H3"}), None),
    (" CC O", None, None),  # a name after leading whitespace: unreadable either way
    ("CCO . ", None, None),  # a part of whitespace only
])
def test_whitespace_around_and_inside_smiles_parts_under_both_readings(text, official, strict):
    for reading, wanted in ((False, official), (True, strict)):
        mol = parse_molecule(text, strict=reading)
        assert (mol.keys if mol is not None else None) == wanted, reading
