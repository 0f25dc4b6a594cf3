"""The scorer and the SMILES form against the official LLM4Chem functions (OSU-NLP-Group/LLM4Chem): the
expected values in tests/data/ were obtained by running the official functions once on these inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import compose_config
from refusals import refused
from llasmol.core.tasks import SMOLINSTRUCT, Scoring
from llasmol.metrics.families import FAMILIES
from llasmol.metrics.formula import formula_key, parse_formula_official
from llasmol.metrics.scoring import score_records

DATA = Path(__file__).parent / "data"
I2F = "name_conversion-i2f"


def _load(name: str):
    return json.loads((DATA / name).read_text())


@pytest.fixture
def lenient_formulas():
    """SMolInstruct's table with formulas read leniently (`scoring.lenient_formulas=true`)."""
    return SMOLINSTRUCT.with_scoring(Scoring(lenient_formulas=True))


# --------------------------------------------------------------------------- formulas (#23 item 3)


@pytest.mark.parametrize("case", _load("formula_official.json"), ids=lambda c: c["prediction"])
def test_formula_validity_and_match_are_the_official_scorers(case):
    """utils/metrics.py count_element_match on one prediction and gold, run as the official code."""
    key = parse_formula_official(case["prediction"])
    assert (key is None) is case["invalid"]
    assert (key is not None and key == formula_key(case["gold"])) is case["match"]


def _i2f_records(cases) -> list[dict]:
    # Answers inside tags: extraction strips them, so only answers without outer spaces carry over as they are.
    return [{"task": I2F, "input": f"name {i}", "gold": c["gold"], "predictions": [f"<MOLFORMULA> {c['prediction']} "
             "</MOLFORMULA>"]} for i, c in enumerate(cases) if c["prediction"] == c["prediction"].strip()]


def test_the_paper_configuration_scores_formulas_as_the_official_code_and_lenient_is_a_setting(tmp_path):
    cases = [c for c in _load("formula_official.json") if c["prediction"] == c["prediction"].strip()]
    official_match = sum(c["match"] for c in cases) / len(cases)
    official_invalid = sum(c["invalid"] for c in cases)
    assert FAMILIES["formula"].scoring.lenient_formulas is False  # the default
    metrics = score_records(_i2f_records(cases))[I2F]
    assert metrics["exact_match"] == pytest.approx(official_match)
    assert metrics["num_invalid"] == official_invalid == 9

    # The same file through the command's config: the default, then the declared lenient setting.
    path = tmp_path / "i2f.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _i2f_records(cases)))
    from llasmol.evaluate import evaluate

    for lenient, invalid in ((False, official_invalid), (True, 7)):
        cfg = compose_config([f"predictions={path}", "intervals.resamples=0", f"paths.output_dir={tmp_path}",
                              f"scoring.lenient_formulas={str(lenient).lower()}"], "evaluate")
        got = evaluate(cfg)["metrics"][I2F]
        assert got["num_invalid"] == invalid, lenient
        if lenient:  # spaces, parentheses, hydrates and D/T now match: more right answers, fewer invalid
            assert got["exact_match"] > official_match
        else:
            assert got["exact_match"] == pytest.approx(official_match)


def test_lenient_formulas_reads_what_the_official_syntax_refuses(lenient_formulas):
    records = [{"task": I2F, "input": str(i), "gold": gold, "predictions": [f"<MOLFORMULA> {p} </MOLFORMULA>"]}
               for i, (p, gold) in enumerate([("C2 H6 O", "C2H6O"), ("(CH3)2O", "C2H6O"), ("C2H6O.2H2O", "C2H10O3"),
                                               ("Na Cl", "ClNa"), ("c2h6o", "C2H6O")])]
    metrics = score_records(records, lenient_formulas)[I2F]
    assert metrics["exact_match"] == pytest.approx(4 / 5) and metrics["num_invalid"] == 1  # c2h6o: no element
    assert score_records(records)[I2F]["exact_match"] < 4 / 5  # the official reading, beside it in one process


# --------------------------------------------------------------------------- Kekulé form (#23 item 4)


def test_the_kekule_form_is_the_official_functions_on_hundreds_of_molecules():
    """utils/smiles_canonicalization.py canonicalize_molecule_smiles (defaults), run once on each input:
    radicals, charges, isotopes, stereo, salts, aromatic heterocycles, atom maps, the bundled data's
    SMILES in Kekulé, aromatic and random spellings, and inputs it refuses (None)."""
    from llasmol.core.smiles import canonical_kekule

    cases = _load("kekule_official.json")
    assert len(cases) > 500 and sum(c["official"] is None for c in cases) == 10
    differences = [(c["input"], c["official"], got) for c in cases if (got := canonical_kekule(c["input"])) != c["official"]]
    assert differences == []


@pytest.mark.parametrize("smiles, official", [
    ("[CH2]C", "CC"),  # a radical closes: the official rebuild gives every atom its default valence's hydrogens
    ("c1cc[c]cc1", "C1=CC=CC=C1"),
    ("[13CH3]", "C"),  # the isotope label goes, then the radical closes
    ("[O-][O]", "[O-]O"),
    ("C[C@H](N)C(=O)O", "C[C@H](N)C(=O)O"),
    ("c1cc[nH]c1", "C1=CNC=C1"),
])
def test_radicals_and_isotopes_take_the_official_form(smiles, official):
    from llasmol.core.smiles import canonical_kekule

    assert canonical_kekule(smiles) == official


# Official utils/metrics.py calculate_smiles_metrics(preds, golds, metrics=('exact_match', 'fingerprint')) on
# these ten answers, run once: num_t1_exact_match 10, num_t1_invalid 0, t1_morgan_fps 1.0, t1_maccs_fps 1.0,
# t1_rdk_fps 0.7 (RDKit's path fingerprint of a one- or two-atom molecule is empty: similarity 0).
RADICAL_ANSWERS = [("[CH2]C", "CC"), ("CC", "CC"), ("[13CH4]", "C"), ("C[O]", "CO"), ("[SiH3]C", "C[SiH3]"),
                   ("[SH4]", "S"), ("CCO", "CCO"), ("C[N+]", "C[NH3+]"), ("[NH4+]", "[NH4+]"),
                   ("c1ccccc1[CH2]", "CC1=CC=CC=C1")]


def test_radical_and_isotope_answers_score_as_the_official_scorer_scores_them():
    records = [{"task": "forward_synthesis", "input": str(i), "gold": gold,
                "predictions": [f"<SMILES> {answer} </SMILES>"]} for i, (answer, gold) in enumerate(RADICAL_ANSWERS)]
    metrics = score_records(records)["forward_synthesis"]
    assert metrics["exact_match"] == 1.0 and metrics["validity"] == 1.0  # before: 0.5, radicals kept open
    assert (metrics["fts"], metrics["fts_maccs"], metrics["fts_rdk"]) == pytest.approx((1.0, 1.0, 0.7))


# --------------------------------------------------------------------------- LLM4Chem output files (#23 item 2)

CAPTION_GOLD = ("The molecule is a monocarboxylic acid anion that is the conjugate base of acetic acid. It has a role "
                "as a human metabolite. It is a conjugate base of an acetic acid.")
CAPTION = ("The molecule is a monocarboxylic acid anion that is the conjugate base of acetic acid. It is a conjugate "
           "base of an acetic acid.")


def _llm4chem_folder(root: Path, outputs: dict[str, list[dict]]) -> Path:
    """A folder as generate_on_dataset.py writes it: <task>.jsonl, lines with input, gold, output, task."""
    root.mkdir()
    for task, lines in outputs.items():
        (root / f"{task}.jsonl").write_text("".join(json.dumps({"task": task, "split": "test", "target": None,
                                                                **line}) + "\n" for line in lines))
    return root


def test_llm4chem_captions_lose_end_and_padding_tokens_as_the_official_reader_strips_them(tmp_path):
    from llasmol.inference.predictions import read_predictions

    task = "molecule_captioning"
    plain = [{"input": "CC(=O)[O-]", "gold": CAPTION_GOLD, "output": [CAPTION]}]
    decoded = [{"input": "CC(=O)[O-]", "gold": CAPTION_GOLD, "output": [CAPTION + "</s>"]},
               {"input": "C", "gold": CAPTION_GOLD, "output": ["<unk><unk> " + CAPTION + " </s><unk>"]}]
    clean = score_records(read_predictions(_llm4chem_folder(tmp_path / "plain", {task: plain})))[task]
    records = read_predictions(_llm4chem_folder(tmp_path / "decoded", {task: decoded}))
    assert [r["predictions"] for r in records] == [[CAPTION + "</s>"], ["<unk><unk> " + CAPTION + " </s><unk>"]]
    got = score_records(records)[task]
    for metric in ("meteor", "bleu2", "bleu4", "rouge1", "rouge2", "rougeL"):
        assert got[metric] == pytest.approx(clean[metric]), metric
    # Any predictions file is read so: a caption line of ours or another system's loses them too.
    line = tmp_path / "ours.jsonl"
    line.write_text(json.dumps({"task": task, "input": "x", "gold": CAPTION_GOLD,
                                "predictions": [CAPTION + "</s><unk><unk>"]}) + "\n")
    ours = score_records(read_predictions(line))[task]
    plain_ours = score_records([{"task": task, "input": "x", "gold": CAPTION_GOLD, "predictions": [CAPTION]}])[task]
    assert ours == plain_ours
    bare = score_records([{"task": task, "input": "x", "gold": CAPTION_GOLD, "predictions": ["</s><unk>"]}])[task]
    assert bare["num_no_answer"] == 1 and bare["num_scored"] == 0


def test_llm4chem_tagged_answers_are_read_between_their_tags_with_nothing_else_stripped(tmp_path):
    from llasmol.inference.predictions import read_predictions

    outputs = {"forward_synthesis": [{"input": "CCO.O", "gold": "CCO", "output": ["<SMILES> CCO </SMILES></s><unk>"]},
                                     {"input": "CC", "gold": "CC", "output": ["<SMILES> C<unk>C </SMILES></s>"]}],
               "name_conversion-s2f": [{"input": "CCO", "gold": "C2H6O", "output": ["<MOLFORMULA> C2H6O </MOLFORMULA></s>"]}]}
    records = read_predictions(_llm4chem_folder(tmp_path / "eval", outputs))
    assert records[0]["predictions"] == ["<SMILES> CCO </SMILES></s><unk>"]  # the tag pair leaves the tokens out
    metrics = score_records(records)
    # extract_prediction.py 'tag' mode keeps "C<unk>C" between the tags: an invalid SMILES there as here.
    assert metrics["forward_synthesis"]["exact_match"] == 0.5 and metrics["forward_synthesis"]["validity"] == 0.5
    assert metrics["name_conversion-s2f"]["exact_match"] == 1.0


def _data_with_a_second_gold(root: Path) -> tuple[Path, dict, str]:
    """The bundled data with one more forward-synthesis test sample: the first sample's input, another product."""
    import shutil

    from llasmol.core.config import PACKAGE_DIR

    shutil.copytree(PACKAGE_DIR / "data" / "bundled", root)
    raw = root / "raw" / "test" / "forward_synthesis.jsonl"
    lines = raw.read_text().splitlines()
    first = json.loads(lines[0])
    other = "CC(C)=O"
    assert other != first["output"]
    raw.write_text("\n".join(lines + [json.dumps({**first, "output": other})]) + "\n")
    index = root / "sample" / "instruction_tuning" / "test" / "forward_synthesis.json"
    samples = json.loads(index.read_text())
    samples["samples"].append({"idx": len(lines), "template_id": 0, "target": None})
    index.write_text(json.dumps(samples))
    return root, first, other


def test_a_partial_llm4chem_file_gets_the_golds_of_the_whole_split_with_pool_golds_split(tmp_path):
    from llasmol.evaluate import evaluate

    data, first, other = _data_with_a_second_gold(tmp_path / "data")
    # Only the first sample was generated (an interrupted run); its answer is the other sample's gold.
    line = {"input": first["input"], "gold": first["output"], "output": [f"<SMILES> {other} </SMILES></s>"]}
    folder = _llm4chem_folder(tmp_path / "eval", {"forward_synthesis": [line]})
    common = [f"predictions={folder}", f"data.path={data}", "intervals.resamples=0", f"paths.output_dir={tmp_path}",
              f"output={tmp_path / 'metrics.json'}"]
    by_file = evaluate(compose_config(common, "evaluate"))["metrics"]["forward_synthesis"]
    by_split = evaluate(compose_config([*common, "pool_golds=split"], "evaluate"))["metrics"]["forward_synthesis"]
    assert (by_file["exact_match"], by_split["exact_match"]) == (0.0, 1.0)

    stray = _llm4chem_folder(tmp_path / "stray", {"forward_synthesis": [{**line, "input": "CCCCCCCCCCCC"}]})
    with refused("forward_synthesis", "'CCCCCCCCCCCC'", "data.split=test", data):
        evaluate(compose_config([*common[1:], f"predictions={stray}", "pool_golds=split"], "evaluate"))
    with refused("pool_golds='whole'", "file, split"):
        evaluate(compose_config([*common, "pool_golds=whole"], "evaluate"))


def test_split_golds_come_first_then_the_files_own_and_only_for_pooled_tasks(tmp_path):
    """pool_golds=split: a pooled task's record gets every gold the split gives its input, in the split's order,
    then any gold of its own the split lacks; a task whose golds do not pool keeps its record as it is."""
    from llasmol.core.tasks import SMOLINSTRUCT, get_task
    from llasmol.inference.jobs import with_split_golds

    data, first, other = _data_with_a_second_gold(tmp_path / "data")
    cfg = compose_config([f"data.path={data}", f"paths.output_dir={tmp_path}", "pool_golds=split"], "evaluate")
    assert get_task("forward_synthesis").pooled and not get_task("property_prediction-bbbp").pooled
    records = [{"task": "forward_synthesis", "input": first["input"], "gold": [other, "CCCCCCCC"], "predictions": []},
               {"task": "property_prediction-bbbp", "input": "not in the split", "gold": ["Yes"], "predictions": []}]
    out = with_split_golds(records, cfg, SMOLINSTRUCT)
    assert [r["gold"] for r in out] == [[first["output"], other, "CCCCCCCC"], ["Yes"]]
    # The default data (the bundled excerpt, named by an interpolation) is found as the command finds it.
    default = compose_config([f"paths.output_dir={tmp_path}", "pool_golds=split"], "evaluate")
    record = {"task": "forward_synthesis", "input": first["input"], "gold": ["CCCCCCCC"], "predictions": []}
    assert with_split_golds([record], default, SMOLINSTRUCT)[0]["gold"] == [first["output"], "CCCCCCCC"]


@pytest.mark.parametrize("smiles, official", [
    ("C[S@@](=O)c1ccccc1", "CS(=O)C1=CC=CC=C1"),  # 3 bonds, one double: rdchiral's copy cannot be a centre
    ("C[S@](=O)CC", "CCS(C)=O"),
    ("N[C@@H](C)C(=O)O", "C[C@H](N)C(=O)O"),  # 3 single bonds (and its H): kept
    ("[C@H](F)(Cl)Br", "F[C@@H](Cl)Br"),
])
def test_a_chiral_tag_is_copied_only_where_the_rebuilt_atom_can_be_a_centre(smiles, official):
    from llasmol.core.smiles import canonical_kekule

    assert canonical_kekule(smiles) == official


# --------------------------------------------------------------------------- base answers and odd SMILES (#37)

DATA = Path(__file__).parent / "data"
STYLE_OF_RULES = {"gal": "galactica", "mol": "molinst"}


def _outcome(task: str, stats: dict, answer):
    """[no_answer, invalid, correct] of one sample as the official scorer counts them (numbers: the error,
    captions: the text scored; SMILES: the three similarities after them)."""
    no = int(stats["num_no_answer"])
    if "fts_morgan_sum" in stats:
        sims = [round(stats[f"fts_{n}_sum"], 9) for n in ("morgan", "maccs", "rdk")]
        return [no, int(not no and not stats["num_valid"]), int(stats["hit_top1"])] + sims
    if "tp" in stats:
        return [no, int(stats["num_invalid"]), int(stats["tp"] + stats["tn"])]
    if "sq_err_sum" in stats:
        return [no, int(stats["num_invalid"]), stats["sq_err_sum"] ** 0.5 if stats["num_valid"] else None]
    if "num_invalid" in stats:
        return [no, int(stats["num_invalid"]), int(stats["hit_top1"])]
    if "hit_top1" in stats:
        return [no, 0, int(stats["hit_top1"])]
    return [no, 0, answer.strip() or None if isinstance(answer, str) else None]


def test_base_answers_are_scored_exactly_as_the_official_pipeline_scores_the_rules_output():
    """305 crafted outputs of the five rule sets (tests/data/base_answers_official.json, from the official
    extract_pred and scorer): the answer each rule reads from the output as generated (Galactica's and Molinst's
    after the query), and how it is scored. A rule's answer holding the task's tags is scored whole (Mistral's
    `<SMILES> CC(C)O </SMILES>` is invalid), Galactica's `\\nYes` is no answer, a whitespace-only answer is one,
    a think block stays in a caption."""
    from llasmol.inference.prompting import Protocol, read_answers
    from llasmol.metrics.scoring import given_answers, record_stats

    cases = json.loads((DATA / "base_answers_official.json").read_text())["cases"]
    seen = set()
    for case in cases:
        task, rules = case["task"], case["rules"]
        protocol = Protocol(STYLE_OF_RULES.get(rules, "icl"), 0, rules, 0)
        record = {"index": 0, "task": task, "predictions": [case["response"]], "gold": [case["gold"]]}
        record = read_answers(protocol, [record], {0: case["query"]})[0]
        assert record["answers"] == [case["official_answer"] or None], case
        assert given_answers(record) == record["answers"]
        got = _outcome(task, record_stats(record), record["answers"][0])[:3]  # (no similarities kept here)
        want = case["official"]
        if isinstance(want[2], float) and isinstance(got[2], float):
            assert got[:2] == want[:2] and got[2] == pytest.approx(want[2]), case
        else:
            assert got == want, case
        seen.add((rules, case["response"], tuple(want[:2])))
    assert len({r for r, _, _ in seen}) == 5 and len(cases) == 305
    assert ("mistral", "<SMILES> CC(C)O </SMILES>", (0, 1)) in seen  # the whole string, which RDKit cannot read
    assert ("gal", "\nYes", (1, 0)) in seen and ("gal", "  ", (0, 1)) in seen


def test_a_rules_answer_is_not_read_again_between_tags_when_a_predictions_file_is_scored(tmp_path):
    """Re-scoring a base run's file scores its `answers` (the `extraction` it names), not its predictions'
    tags; a file without a rule set's name is read between its tags."""
    from llasmol.inference.predictions import read_predictions

    line = {"task": "forward_synthesis", "input": "q", "gold": ["CC(C)O"], "predictions": ["<SMILES> CC(C)O </SMILES>"],
            "answers": ["<SMILES> CC(C)O </SMILES>"], "extraction": "mistral"}
    path = tmp_path / "base.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "extraction": "tags"}) + "\n")
    first, second = read_predictions(path)
    assert score_records([first])["forward_synthesis"]["validity"] == 0.0
    assert score_records([second])["forward_synthesis"]["exact_match"] == 1.0


def test_odd_smiles_and_yes_no_answers_are_scored_as_the_official_scorer_scores_them():
    """483 tagged answers (tests/data/scorer_official.json, from the official reader and scorer): SMILES with a
    name, a tab or a newline after them (RDKit reads the part before), with a leading space and a name
    (unreadable), dummy atoms (the empty InChI matches every other), ';' parts; `Yes.` and `yes .` invalid."""
    from llasmol.metrics.scoring import sample_stats

    cases = json.loads((DATA / "scorer_official.json").read_text())["cases"]
    for case in cases:
        stats = sample_stats(case["task"], [case["response"]], [case["gold"]])
        assert _outcome(case["task"], stats, None) == case["official"], case
    outcomes = {(c["response"], c["gold"]): c["official"][:3] for c in cases}
    assert outcomes[("The product is <SMILES> CCO (ethanol) </SMILES> .", "CCO")] == [0, 0, 1]
    assert outcomes[("The product is <SMILES> *C </SMILES> .", "*CC")] == [0, 0, 1]
    assert outcomes[("<BOOLEAN> Yes. </BOOLEAN>", "Yes")] == [0, 1, 0]


def test_the_stricter_and_kinder_readings_are_settings_off_by_default():
    from llasmol.metrics.scoring import sample_stats

    def hit(answer, gold, task="forward_synthesis", tasks=SMOLINSTRUCT):
        stats = sample_stats(task, None, [gold], answers=[answer], tasks=tasks)
        return stats["hit_top1"] if "hit_top1" in stats else stats["tp"] + stats["tn"]

    cfg = compose_config(["paths.output_dir=/x", "predictions=/x.jsonl"], "evaluate")
    assert dict(cfg.scoring) == {"lenient_formulas": False, "lenient_booleans": False, "strict_smiles": False}
    assert hit("CCO (ethanol)", "CCO") == hit("*C", "*CC") == 1 and hit("Yes.", "Yes", "property_prediction-bbbp") == 0
    other = SMOLINSTRUCT.with_scoring(Scoring(strict_smiles=True, lenient_booleans=True))
    assert (hit("CCO (ethanol)", "CCO", tasks=other) == hit("*C", "*CC", tasks=other) == 0
            and hit("Yes.", "Yes", "property_prediction-bbbp", other) == 1)
