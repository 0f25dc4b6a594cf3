"""The RL stage's rewards are the scorer's own per-sample statistics, gated (llasmol/metrics/rewards.py): summed over
well-formed completions they give back the paper's metrics, every term of a gold response is earned, no exploit the
demo's GRPO run found earns as much as a plausible wrong answer of the right size, DAPO's overlong punishment is
TRL's, a user's own function is weighted beside the terms, bad weights are one line, and no model output raises."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from refusals import refused

from llasmol.core.config import CONFIG_DIR
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.data.source import BUNDLED_DATA, SMolInstructSource
from llasmol.metrics.rewards import (TERMS, Rewards, formula_heavy_atoms, name_overlap, overlong_penalty,
                                     well_formed)
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


def test_summed_over_well_formed_completions_the_terms_give_back_the_papers_metrics(samples):
    """What a held-out check does: the logged rewards against the scorer's own statistics, on completions that are
    well formed (one tagged answer; the gate is tested below), a molecule's validity scaled by its size."""
    from rdkit import Chem

    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ONE_PER_FAMILY)
    wrong = {"forward_synthesis": ["<SMILES> CCO </SMILES>", "<SMILES> C1CC </SMILES>", "<SMILES> CC(=O)NC1=CC=CC=C1 </SMILES>"],
             "name_conversion-s2f": ["<MOLFORMULA> C2H6O </MOLFORMULA>", "<MOLFORMULA> C2H6Oq( </MOLFORMULA>"],
             "name_conversion-s2i": ["<IUPAC> ethanol </IUPAC>"],
             "property_prediction-esol": ["<NUMBER> -1.5 </NUMBER>", "<NUMBER> lots </NUMBER>", "<NUMBER> nan </NUMBER>"],
             "property_prediction-bbbp": ["<BOOLEAN> Yes </BOOLEAN>", "<BOOLEAN> No </BOOLEAN>", "<BOOLEAN> Yes. </BOOLEAN>"]}
    for task, completions in wrong.items():
        sample = samples[task]
        completions = [sample["output"], *completions]
        records = [{"task": task, "gold": sample["raw_output"], "predictions": [c]} for c in completions]
        metrics = score_records(records, SMOLINSTRUCT)[task]
        terms = [rewards.terms(task, c, sample["raw_output"]) for c in completions]
        total = {t: sum(row[t] for row in terms) for t in terms[0]}
        n = len(completions)
        assert total["format"] == n - metrics["num_no_answer"] == n, task
        if "exact" in total:
            assert total["exact"] / n == pytest.approx(metrics["exact_match"]), task
        if task == "forward_synthesis":
            gold_atoms = Chem.MolFromSmiles(sample["raw_output"]).GetNumHeavyAtoms()
            # CCO (3 atoms), C1CC (a ring never closed: no molecule), acetanilide (10 atoms)
            sizes = [1.0, 3 / gold_atoms, 0.0, min(10, gold_atoms) / max(10, gold_atoms)]
            assert [row["validity"] for row in terms] == pytest.approx(sizes)
            assert total["similarity"] / metrics["num_valid"] == pytest.approx(metrics["fts"])
        if task == "property_prediction-bbbp":
            assert total["label"] / n == pytest.approx(metrics["accuracy"])
            assert total["validity"] == metrics["tp"] + metrics["fp"] + metrics["tn"] + metrics["fn"]
        if task == "property_prediction-esol":  # one valid wrong answer: its error is the RMSE of it alone
            wrong_one = score_records(records[1:2], SMOLINSTRUCT)[task]["rmse"]
            assert terms[1]["error"] == pytest.approx(1 / (1 + wrong_one))
            assert total["validity"] == metrics["num_valid"] and terms[2]["error"] == terms[3]["error"] == 0


GOLD = "COC1=CC=C(CN(CSC(C)(C)C)C(=O)[C@@H](Br)[C@@H](C)O)C=C1"  # 23 heavy atoms
# Per family: a plausible wrong answer of the right size, and the exploits the README's GRPO run found (answers of
# water, tags scattered through a ramble, a short answer followed by junk, the answer repeated, no end).
EXPLOITS = {
    "forward_synthesis": (GOLD, "The product is <SMILES> COC1=CC=C(CN(CSC(C)(C)C)C(=O)[C@@H](Cl)CCO)C=C1 </SMILES> .", [
        ("<SMILES> O </SMILES>", True), ("<SMILES> C </SMILES> so <SMILES> CC </SMILES> then <SMILES> CCC", True),
        ("<SMILES> CC more words here </SMILES>", True), (f"<SMILES> {GOLD} </SMILES> <SMILES> {GOLD} </SMILES>", True),
        (f"The product is <SMILES> {GOLD} </SMILES>", False), ("<SMILES> CCCCCCCCCCCCCCCCCCCCCC </SMILES>", True)]),
    "name_conversion-s2f": ("C14H16N2", "<MOLFORMULA> C15H18N2 </MOLFORMULA>", [
        ("<MOLFORMULA> H2O </MOLFORMULA>", True), ("<MOLFORMULA> C14H16N2 junk </MOLFORMULA>", True),
        ("<MOLFORMULA> C </MOLFORMULA> <MOLFORMULA> C2 </MOLFORMULA>", True), ("<MOLFORMULA> C14H16N2 </MOLFORMULA>", False)]),
    "name_conversion-s2i": ("2-(4-chlorophenyl)-N-methylethanamine", "<IUPAC> 2-(4-bromophenyl)-N-ethylethanamine </IUPAC>", [
        ("<IUPAC> methane </IUPAC>", True), ("<IUPAC> a </IUPAC> and <IUPAC> b </IUPAC>", True),
        ("<IUPAC> 2-(4-chlorophenyl)-N-methylethanamine </IUPAC>", False), ("<IUPAC> water", True)]),
    "property_prediction-esol": ("-2.5", "<NUMBER> -3.1 </NUMBER>", [
        ("<NUMBER> -2.5 and more </NUMBER>", True), ("<NUMBER> -2.5 </NUMBER> <NUMBER> -2.5 </NUMBER>", True),
        ("<NUMBER> -2.5 </NUMBER>", False), ("<NUMBER> lots </NUMBER>", True)]),
    "property_prediction-bbbp": ("Yes", "<BOOLEAN> No </BOOLEAN>", [
        ("<BOOLEAN> Yes </BOOLEAN> <BOOLEAN> Yes </BOOLEAN>", True), ("<BOOLEAN> Yes </BOOLEAN>", False),
        ("<BOOLEAN> Yes indeed </BOOLEAN>", True), ("Yes", True)]),
    "molecule_captioning": (CAPTION, "The molecule is a primary alcohol found in wine.", [
        (CAPTION, False), ("", True), ("<unk></s>", True)]),
}


@pytest.mark.parametrize("task", list(EXPLOITS))
def test_every_exploit_earns_less_than_a_plausible_wrong_answer_of_the_right_size(task):
    gold, plausible, exploits = EXPLOITS[task]
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, [task])
    honest, _ = rewards(task, plausible, [gold])
    assert honest > DEFAULTS["families"][SMOLINSTRUCT.task(task).family]["format"]  # more than its form
    for completion, ended in exploits:
        earned, terms = rewards(task, completion, [gold], ended)
        assert earned < honest, (completion, ended, terms)


@pytest.mark.parametrize("completion, ended, answer", [
    ("The product is <SMILES> CCO </SMILES> .", True, "CCO"),
    ("<SMILES> CCO </SMILES>", False, None),  # cut at its bound
    ("<SMILES> CCO </SMILES> <SMILES> CCO </SMILES>", True, None),  # twice
    ("<SMILES> CCO <SMILES> CC </SMILES>", True, None),  # opened twice
    ("</SMILES> CCO <SMILES>", True, None),  # closed before opened
    ("<SMILES>  </SMILES>", True, None),  # empty
    ("<SMILES> CCO", True, None),  # never closed
    ("<think> the tag <SMILES> would count </think> <SMILES> CCO </SMILES>", True, "CCO"),  # a reasoning block
])
def test_a_completion_is_well_formed_only_when_it_ended_with_one_tagged_answer(completion, ended, answer):
    assert well_formed(completion, "SMILES", ended) == answer
    assert well_formed("  a caption </s><unk> ", None, True) == "a caption"
    assert well_formed("<unk></s>", None, True) is None and well_formed("a caption", None, False) is None


def test_a_molecules_validity_is_its_size_over_the_closest_golds_and_text_after_it_earns_nothing():
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ["forward_synthesis"])
    water = rewards.terms("forward_synthesis", "<SMILES> O </SMILES>", [GOLD, "CCO"])
    assert water["validity"] == pytest.approx(1 / 3)  # the closer gold, ethanol (3 atoms), not the 23-atom one
    assert rewards.terms("forward_synthesis", "<SMILES> O </SMILES>", [GOLD])["validity"] == pytest.approx(1 / 23)
    big = rewards.terms("forward_synthesis", f"<SMILES> {GOLD}.CCCC </SMILES>", [GOLD])  # 27 atoms: too big
    assert big["validity"] == pytest.approx(23 / 27)
    junk = rewards.terms("forward_synthesis", f"<SMILES> {GOLD} (the product) </SMILES>", [GOLD])
    assert junk == {"format": 1.0, "validity": 0.0, "similarity": 0.0, "exact": 0.0}  # the scorer reads it as the gold
    assert formula_heavy_atoms("C14H16N2") == 16 and formula_heavy_atoms("H2O") == 1 and formula_heavy_atoms("x(") is None


def test_a_names_similarity_is_the_dice_overlap_of_its_character_trigrams():
    assert name_overlap("ethanol", ["ethanol"]) == 1.0
    # "  ethanol " has 8 trigrams, "  methanol " 9; they share eth, tha, han, ano, nol and "ol "
    assert name_overlap("ethanol", ["methanol", "propane"]) == pytest.approx(2 * 6 / (8 + 9))
    assert name_overlap("x" * 2000, ["x" * 2000]) == 0.0  # past the bound: not computed


@pytest.mark.parametrize("length, expected", [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0), (17, -1.0)])
def test_the_soft_overlong_punishment_is_dapos_and_trls(length, expected):
    from trl.rewards import get_soft_overlong_punishment

    assert overlong_penalty(length, 16, 4) == pytest.approx(expected)
    assert overlong_penalty(length, 16, 4) == pytest.approx(get_soft_overlong_punishment(16, 4)([[0] * length])[0])
    assert overlong_penalty(17, 16, 0) == 0.0  # no cache: off


def short_answers(completion: str, gold: str, task: str) -> float:
    """A user's reward function (the tests below name it by its dotted path)."""
    return 1.0 / (1.0 + len(completion)) if task == "forward_synthesis" else 0.5


def not_a_number(completion: str, gold: str, task: str):
    return "high"


def raises(completion: str, gold: str, task: str) -> float:
    raise KeyError(gold)


NOT_CALLABLE = 3


def test_a_users_reward_function_is_weighted_beside_the_terms_and_gated_as_they_are():
    weights = {**DEFAULTS, "custom": {"short": {"_target_": "test_rewards.short_answers", "weight": 2.0}}}
    rewards = Rewards(weights, SMOLINSTRUCT, ["forward_synthesis"])
    completion = f"<SMILES> {GOLD} </SMILES>"
    total, terms = rewards("forward_synthesis", completion, [GOLD])
    assert terms["short"] == pytest.approx(1 / (1 + len(completion)))
    assert total == pytest.approx(1.6 + 2.0 * terms["short"])
    assert rewards("forward_synthesis", completion, [GOLD], ended=False) == (0.0, dict.fromkeys(terms, 0.0))
    rewards.probe({"forward_synthesis": (completion, [GOLD])})  # a number: passes


@pytest.mark.parametrize("spec, named", [
    ({"_target_": "test_rewards.nope", "weight": 1}, ("reward.custom.mine._target_=test_rewards.nope", "cannot be imported")),
    ({"_target_": "test_rewards.NOT_CALLABLE", "weight": 1}, ("is a int, not a function",)),
    ({"weight": 1}, ("reward.custom.mine names no _target_",)),
    ({"_target_": "test_rewards.short_answers", "weight": -1}, ("reward.custom.mine.weight=-1", "from 0 up")),
    ({"_target_": "test_rewards.short_answers"}, ("reward.custom.mine.weight=None",)),
    ({"_target_": "test_rewards.short_answers", "weight": 1, "scale": 2}, ("reward.custom.mine.scale",)),
])
def test_a_bad_reward_function_is_one_line_before_training(spec, named):
    with refused(*named):
        Rewards({**DEFAULTS, "custom": {"mine": spec}}, SMOLINSTRUCT, ["forward_synthesis"])


@pytest.mark.parametrize("target, named", [("test_rewards.not_a_number", "returned 'high'"),
                                           ("test_rewards.raises", "raised KeyError")])
def test_a_reward_function_that_gives_no_number_is_one_line_at_its_probe(target, named):
    rewards = Rewards({**DEFAULTS, "custom": {"mine": {"_target_": target, "weight": 1}}}, SMOLINSTRUCT,
                      ["forward_synthesis"])
    with refused("reward.custom.mine", named):
        rewards.probe({"forward_synthesis": (f"<SMILES> {GOLD} </SMILES>", [GOLD])})


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
                                        "<SMILES> [Zz] </SMILES>", "\x00\ud800", "<BOOLEAN> yes </BOOLEAN>" * 3,
                                        "<SMILES> " + "C" * 400 + " </SMILES>", "<IUPAC> " + "x" * 1001 + " </IUPAC>"])
def test_no_completion_raises_and_every_term_stays_in_0_1(completion, samples):
    rewards = Rewards(DEFAULTS, SMOLINSTRUCT, ONE_PER_FAMILY)
    for task, sample in samples.items():
        total, terms = rewards(task, completion, sample["raw_output"])
        assert all(0.0 <= v <= 1.0 for v in terms.values()), (task, terms)
