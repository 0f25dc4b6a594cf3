"""The RL stage's rewards are the scorer's own per-sample statistics (llasmol/metrics/rewards.py): summed over
completions they give back the paper's metrics, every term of a gold response is earned, bad weights are one
line, and no model output raises."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from refusals import refused

from llasmol.core.config import CONFIG_DIR
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.data.source import BUNDLED_DATA, SMolInstructSource
from llasmol.metrics.rewards import TERMS, Rewards
from llasmol.metrics.scoring import score_records

DEFAULTS = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "reward" / "default.yaml"))
# the bundled excerpt has no captioning task (its PROVENANCE.md): captions are tested on a sentence of their own
ONE_PER_FAMILY = ["forward_synthesis", "name_conversion-s2f", "name_conversion-s2i", "property_prediction-esol",
                  "property_prediction-bbbp"]
CAPTION = "The molecule is a primary alcohol that is ethane in which a hydrogen is substituted by a hydroxy group."


@pytest.fixture(scope="module")
def samples():
    split = SMolInstructSource(path=str(BUNDLED_DATA), tasks=ONE_PER_FAMILY).split("test")
    firsts = {}
    for i in range(len(split)):
        firsts.setdefault(split[i]["task"], split[i])
    return firsts


def test_the_default_weights_name_every_familys_terms_and_each_has_its_reason():
    assert set(DEFAULTS["families"]) == set(TERMS)
    for name, terms in DEFAULTS["families"].items():
        assert set(terms) == set(TERMS[name]), name
    text = (CONFIG_DIR / "reward" / "default.yaml").read_text().splitlines()
    weighted = [line for line in text if line.startswith("    ") and ":" in line]
    assert weighted and all("#" in line for line in weighted)  # a sentence each on why


def test_a_gold_response_earns_every_exact_term(samples):
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ONE_PER_FAMILY)
    for task, sample in samples.items():
        total, terms = rewards(task, sample["output"], sample["raw_output"])
        kind = SMOLINSTRUCT.task(task).family
        for term in ("format", "validity", "exact", "label", "similarity", "error"):
            if term in terms:
                assert terms[term] == pytest.approx(1.0), (task, term)
        assert total == pytest.approx(sum(DEFAULTS["families"][kind][t] * v for t, v in terms.items()))


def test_a_caption_earns_its_meteor_and_a_poor_one_less():
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ["molecule_captioning"])
    same = rewards.terms("molecule_captioning", CAPTION, CAPTION)
    other = rewards.terms("molecule_captioning", "The molecule is a dye.", CAPTION)
    assert same["format"] == other["format"] == 1.0 and same["meteor"] > 0.9 > other["meteor"] > 0
    record = {"task": "molecule_captioning", "gold": CAPTION, "predictions": ["The molecule is a dye."]}
    assert other["meteor"] == pytest.approx(score_records([record], SMOLINSTRUCT)["molecule_captioning"]["meteor"])


def test_summed_over_completions_the_terms_give_back_the_papers_metrics(samples):
    """What a held-out check does: the logged rewards against the scorer's own statistics."""
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ONE_PER_FAMILY)
    wrong = {"forward_synthesis": ["<SMILES> CCO </SMILES>", "<SMILES> C1CC </SMILES>", "CCO", "<SMILES> </SMILES>"],
             "name_conversion-s2f": ["<MOLFORMULA> C2H6O </MOLFORMULA>", "<MOLFORMULA> C2H6Oq( </MOLFORMULA>", "H2O"],
             "name_conversion-s2i": ["<IUPAC> ethanol </IUPAC>", "ethanol"],
             "property_prediction-esol": ["<NUMBER> -1.5 </NUMBER>", "<NUMBER> lots </NUMBER>", "<NUMBER> nan </NUMBER>"],
             "property_prediction-bbbp": ["<BOOLEAN> Yes </BOOLEAN>", "<BOOLEAN> No </BOOLEAN>", "<BOOLEAN> Yes. </BOOLEAN>",
                                          "maybe"]}
    for task, completions in wrong.items():
        sample = samples[task]
        completions = [sample["output"], *completions]
        records = [{"task": task, "gold": sample["raw_output"], "predictions": [c]} for c in completions]
        metrics = score_records(records, SMOLINSTRUCT)[task]
        terms = [rewards.terms(task, c, sample["raw_output"]) for c in completions]
        total = {t: sum(row[t] for row in terms) for t in terms[0]}
        n = len(completions)
        assert total["format"] == n - metrics["num_no_answer"], task
        if "exact" in total:
            assert total["exact"] / n == pytest.approx(metrics["exact_match"]), task
        if task == "forward_synthesis":
            assert total["validity"] == metrics["num_valid"]
            assert total["similarity"] / metrics["num_valid"] == pytest.approx(metrics["fts"])
        if task == "property_prediction-bbbp":
            assert total["label"] / n == pytest.approx(metrics["accuracy"])
            assert total["validity"] == metrics["tp"] + metrics["fp"] + metrics["tn"] + metrics["fn"]
        if task == "property_prediction-esol":  # one valid wrong answer: its error is the RMSE of it alone
            wrong_one = score_records(records[1:2], SMOLINSTRUCT)[task]["rmse"]
            assert terms[1]["error"] == pytest.approx(1 / (1 + wrong_one))
            assert total["validity"] == metrics["num_valid"] and terms[2]["error"] == terms[3]["error"] == 0


def test_a_declared_task_takes_its_familys_rewards_and_a_task_weight_wins():
    table = TaskTable({"ring": {"family": "boolean"}})
    rewards = Rewards({**DEFAULTS, "tasks": {"ring": {"format": 0.0, "label": 2.0}}}, table, ["ring", "forward_synthesis"])
    assert rewards.weights["ring"] == {"validity": 0.2, "label": 2.0}  # format 0: left out; label: the task's
    assert rewards.weights["forward_synthesis"] == DEFAULTS["families"]["smiles"]
    total, terms = rewards("ring", "<BOOLEAN> No </BOOLEAN>", "No")
    assert terms == {"validity": 1.0, "label": 1.0} and total == pytest.approx(2.2)


@pytest.mark.parametrize("weights, named", [
    ({"families": {"smile": {"exact": 1}}}, ("reward.families.smile", "smiles, formula")),
    ({"families": {"smiles": {"exactt": 1}}}, ("reward.families.smiles.exactt", "format, validity, similarity, exact")),
    ({"families": {"smiles": {"exact": -1}}}, ("reward.families.smiles.exact=-1", "from 0 up")),
    ({"families": {"smiles": {"exact": True}}}, ("reward.families.smiles.exact=True",)),
    ({"families": {"smiles": {"exact": 0, "format": 0}}}, ("task forward_synthesis", "reward.families.smiles.format=0.1")),
    ({"families": {}, "tasks": {"forward_synthesis": {"label": 1}}}, ("reward.tasks.forward_synthesis.label",)),
    ({"families": {}, "tasks": {"forward_synth": {"exact": 1}}}, ("forward_synth", "reward.tasks.forward_synth")),
    ({"families": {"smiles": {"exact": 1}}, "tasks": {"forward_synthesis": {"exact": -2}}},
     ("reward.tasks.forward_synthesis.exact=-2", "from 0 up")),  # a task's own weight is named as the task's
    # A family or task this run does not train (forward_synthesis only): a misspelt term is still a mistake.
    ({"families": {"smiles": {"exact": 1}, "number": {"errr": 1}}},
     ("reward.families.number.errr", "number family", "format, validity, error")),
    ({"families": {"smiles": {"exact": 1}}, "tasks": {"property_prediction-esol": {"exact": 1}}},
     ("reward.tasks.property_prediction-esol.exact", "number family (property_prediction-esol)")),
])
def test_bad_weights_are_one_line_naming_the_setting(weights, named):
    from llasmol.core.schema import RewardSchema, check_group

    with refused(*named):
        check_group({"tasks": {}, **weights}, RewardSchema, "reward.")  # the numbers: the config check's
        Rewards(weights, SMOLINSTRUCT, ["forward_synthesis"])  # the names: the task table's


@pytest.mark.parametrize("completion", ["", "<SMILES>", "</SMILES> <SMILES>", "<SMILES> " + "C" * 5000 + " </SMILES>",
                                        "<SMILES> [Zz] </SMILES>", "\x00\ud800", "<BOOLEAN> yes </BOOLEAN>" * 3])
def test_no_completion_raises_and_every_term_stays_in_0_1(completion, samples):
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ONE_PER_FAMILY)
    for task, sample in samples.items():
        total, terms = rewards(task, completion, sample["raw_output"])
        assert all(0.0 <= v <= 1.0 for v in terms.values()), (task, terms)
