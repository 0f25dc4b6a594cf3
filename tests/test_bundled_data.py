"""Checks on the committed sample dataset (llasmol/data/bundled).

These tests read the files directly with json so that they also guard the
data independently of the loader in the llasmol package.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest
from rdkit import Chem, RDLogger

from llasmol.core.tasks import get_task
from llasmol.core.smiles import canonical_kekule

RDLogger.DisableLog("rdApp.*")

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "llasmol" / "data" / "bundled"
BUILDER = ROOT / "scripts" / "build_bundled_data.py"

SPLITS = ("train", "dev", "test")
TASKS = (
    "forward_synthesis",
    "retrosynthesis",
    "name_conversion-i2f",
    "name_conversion-i2s",
    "name_conversion-s2f",
    "name_conversion-s2i",
    "property_prediction-esol",
    "property_prediction-lipo",
    "property_prediction-bbbp",
    "property_prediction-clintox",
    "property_prediction-hiv",
)
NAME_TASKS = [t for t in TASKS if t.startswith("name_conversion-")]
PROPERTY_TASKS = [t for t in TASKS if t.startswith("property_prediction-")]
TAG_PATTERN = re.compile(r"</?[A-Z]+>")


@cache
def raw_rows(split: str, task: str) -> tuple[dict, ...]:
    path = BUNDLED / "raw" / split / f"{task}.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line) for line in lines)


def load_json(*parts: str) -> object:
    return json.loads((BUNDLED.joinpath(*parts)).read_text(encoding="utf-8"))


def core_tags(task: str) -> dict[str, list[str]]:
    return load_json("core_tag", f"{task}.json")  # type: ignore[return-value]


@cache
def inchikey(smiles: str) -> str:
    mol = Chem.MolFromSmiles(smiles)
    assert mol is not None, smiles
    key = Chem.MolToInchiKey(mol)
    assert key, smiles
    return key


def provenance_counts() -> dict[str, dict[str, int]]:
    lines = (BUNDLED / "PROVENANCE.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| task | train | dev | test |")
    counts: dict[str, dict[str, int]] = {}
    for line in lines[start + 2:]:  # skip header and |---| row
        if not line.startswith("|"):
            break
        task, *numbers = [cell.strip() for cell in line.strip("|").split("|")]
        counts[task] = dict(zip(SPLITS, map(int, numbers), strict=True))
    return counts


# ---------------------------------------------------------------- layout


@pytest.mark.parametrize("task", TASKS)
def test_task_files_present_for_all_splits(task: str) -> None:
    assert (BUNDLED / "core_tag" / f"{task}.json").is_file()
    assert (BUNDLED / "template" / "instruction_tuning" / f"{task}.json").is_file()
    for split in SPLITS:
        assert (BUNDLED / "raw" / split / f"{task}.jsonl").is_file()
        assert (BUNDLED / "sample" / "instruction_tuning" / split / f"{task}.json").is_file()
        assert raw_rows(split, task), f"{split}/{task} is empty"


def test_no_unexpected_tasks() -> None:
    found = {p.stem for p in (BUNDLED / "raw" / "train").glob("*.jsonl")}
    assert found == set(TASKS)


def test_counts_match_provenance() -> None:
    table = provenance_counts()
    assert set(table) == set(TASKS)
    for task in TASKS:
        for split in SPLITS:
            assert len(raw_rows(split, task)) == table[task][split], (task, split)
            samples = load_json("sample", "instruction_tuning", split, f"{task}.json")["samples"]
            assert len(samples) == table[task][split], (task, split)


@pytest.mark.parametrize("task", TASKS)
def test_raw_records(task: str) -> None:
    output_tag = core_tags(task)["output"][0]
    for split in SPLITS:
        for row in raw_rows(split, task):
            assert list(row) == ["input", "output", "task", "split"]
            assert row["task"] == task and row["split"] == split
            assert row["input"].strip() == row["input"] and row["input"]
            assert row["output"].strip() == row["output"] and row["output"]
            assert not TAG_PATTERN.search(row["input"] + row["output"])
            if output_tag == "<BOOLEAN>":
                assert row["output"] in ("Yes", "No")
            elif output_tag == "<NUMBER>":
                float(row["output"])


@pytest.mark.parametrize("task", TASKS)
def test_core_tags(task: str) -> None:
    assert core_tags(task) == get_task(task).core_tags()


def test_the_task_table_gives_the_archives_core_tags_of_the_tasks_left_out():
    # Written out on purpose, an independent check of core/tasks.py for the three tasks the bundled excerpt
    # lacks (the bundled core_tag files check the others): the official archive's core_tag/<task>.json.
    assert get_task("molecule_captioning").core_tags() == {"input": ["<SMILES>", "</SMILES>"], "output": [None, None]}
    assert get_task("molecule_generation").core_tags() == {"input": [None, None], "output": ["<SMILES>", "</SMILES>"]}
    assert get_task("property_prediction-sider").core_tags() == {"input": ["<SMILES>", "</SMILES>"],
                                                                  "output": ["<BOOLEAN>", "</BOOLEAN>"]}


@pytest.mark.parametrize("task", TASKS)
def test_templates(task: str) -> None:
    templates = load_json("template", "instruction_tuning", f"{task}.json")
    assert isinstance(templates, list) and 5 <= len(templates) <= 8
    for template in templates:
        assert set(template) == {"input", "output"}
        text = template["input"] + "\n" + template["output"]
        assert template["input"].count("<INPUT>") == 1
        assert template["output"].count("<OUTPUT>") == 1
        assert "<OUTPUT>" not in template["input"] and "<INPUT>" not in template["output"]
        leftover = text.replace("<INPUT>", "").replace("<OUTPUT>", "")
        assert not TAG_PATTERN.search(leftover), template


# Queries published with SMolInstruct and the paper (examples), reduced to words: our templates are our
# own wording, so none of them may read as one of these.
PUBLISHED_QUERIES = (
    "is <INPUT> toxic",
    "can <INPUT> penetrate the blood-brain barrier",
    "what is the molecular formula of <INPUT>",
    "how soluble is <INPUT>",
    "identify possible reactants that could have been used to create the specified product",
)


def _words(text: str) -> str:
    return " ".join(re.findall(r"<INPUT>|[\w-]+", text.lower().replace("<input>", "<INPUT>")))


def test_templates_are_not_published_wording() -> None:
    published = {_words(q) for q in PUBLISHED_QUERIES}
    for task in TASKS:
        for template in load_json("template", "instruction_tuning", f"{task}.json"):
            assert _words(template["input"]) not in published, (task, template["input"])


@pytest.mark.parametrize("task", TASKS)
def test_sample_index_files(task: str) -> None:
    n_templates = len(load_json("template", "instruction_tuning", f"{task}.json"))
    for split in SPLITS:
        data = load_json("sample", "instruction_tuning", split, f"{task}.json")
        assert data["task"] == task and data["split"] == split
        assert data["template_name"] == "instruction_tuning"
        n_raw = len(raw_rows(split, task))
        for sample in data["samples"]:
            assert set(sample) == {"idx", "template_id", "target"}
            assert 0 <= sample["idx"] < n_raw
            assert 0 <= sample["template_id"] < n_templates
            assert sample["target"] is None


# ---------------------------------------------------------------- chemistry


# An aromatic atom: a lower-case element outside brackets (b c n o p s) or first inside them ([nH], [se]).
AROMATIC_ATOM = re.compile(r"\[\d*[a-z]|(?<![A-Z\[])[bcnops](?![a-z])")


@pytest.mark.parametrize("task", TASKS)
def test_smiles_are_canonical_kekule_as_in_smolinstruct(task: str) -> None:
    """SMolInstruct writes canonical Kekule SMILES, parts sorted (LLM4Chem canonicalize_molecule_smiles)."""
    tags = core_tags(task)
    for side in ("input", "output"):
        if tags[side][0] != "<SMILES>":
            continue
        for split in SPLITS:
            for row in raw_rows(split, task):
                smiles = row[side]
                parts = smiles.split(".")
                # Checked with RDKit alone, then against the package's helper (what generate uses).
                assert parts == sorted(parts), (split, smiles)
                for part in parts:
                    assert Chem.MolToSmiles(Chem.MolFromSmiles(part), kekuleSmiles=True) == part, (split, smiles)
                assert canonical_kekule(smiles) == smiles, (split, smiles)
                assert not AROMATIC_ATOM.search(smiles), (split, smiles)


def test_the_aromatic_atom_pattern_sees_aromatic_smiles() -> None:
    for aromatic in ("c1ccccc1", "C[nH]1cccc1", "CN(C)c1ccncc1", "[se]1cccc1", "O=c1[nH]cccc1"):
        assert AROMATIC_ATOM.search(aromatic), aromatic
    for kekule in ("C1=CC=CC=C1", "CN(C)C1=CC=NC=C1", "ClCBr", "[Na+].[Cl-]", "OS(=O)(=O)O", "CSC", "CPOC"):
        assert not AROMATIC_ATOM.search(kekule), kekule


@pytest.mark.parametrize("task", TASKS)
def test_inputs_do_not_cross_splits(task: str) -> None:
    seen: dict[str, str] = {}
    for split in SPLITS:
        for row in raw_rows(split, task):
            assert seen.setdefault(row["input"], split) == split, row["input"]


def assert_single_split(key_to_splits: dict[str, set[str]]) -> None:
    crossing = {key: s for key, s in key_to_splits.items() if len(s) > 1}
    assert not crossing, f"molecules in more than one split: {sorted(crossing)[:5]}"


def test_name_conversion_shares_one_split() -> None:
    # Map IUPAC names to molecules through the tasks that pair them with
    # SMILES, then require every molecule (and name) to sit in one split.
    name_to_smiles: dict[str, str] = {}
    for split in SPLITS:
        for row in raw_rows(split, "name_conversion-i2s"):
            name_to_smiles[row["input"]] = row["output"]
        for row in raw_rows(split, "name_conversion-s2i"):
            name_to_smiles[row["output"]] = row["input"]
    key_splits: dict[str, set[str]] = defaultdict(set)
    for split in SPLITS:
        for task in NAME_TASKS:
            for row in raw_rows(split, task):
                if task in ("name_conversion-s2f", "name_conversion-s2i"):
                    smiles = row["input"]
                else:
                    assert row["input"] in name_to_smiles, row["input"]
                    smiles = name_to_smiles[row["input"]]
                key_splits[inchikey(smiles)].add(split)
    assert_single_split(key_splits)


def test_name_conversion_tasks_use_the_same_molecules() -> None:
    for split in SPLITS:
        by_smiles = {
            task: sorted(row["input"] for row in raw_rows(split, task))
            for task in ("name_conversion-s2f", "name_conversion-s2i")
        }
        by_name = {
            task: sorted(row["input"] for row in raw_rows(split, task))
            for task in ("name_conversion-i2f", "name_conversion-i2s")
        }
        assert by_smiles["name_conversion-s2f"] == by_smiles["name_conversion-s2i"]
        assert by_name["name_conversion-i2f"] == by_name["name_conversion-i2s"]


@pytest.mark.parametrize("task", PROPERTY_TASKS)
def test_property_molecules_do_not_cross_splits(task: str) -> None:
    key_splits: dict[str, set[str]] = defaultdict(set)
    for split in SPLITS:
        for row in raw_rows(split, task):
            key_splits[inchikey(row["input"])].add(split)
    assert_single_split(key_splits)


def test_reaction_tasks_share_split_by_product() -> None:
    key_splits: dict[str, set[str]] = defaultdict(set)
    for split in SPLITS:
        for row in raw_rows(split, "forward_synthesis"):
            key_splits[inchikey(row["output"])].add(split)
        for row in raw_rows(split, "retrosynthesis"):
            key_splits[inchikey(row["input"])].add(split)
    assert_single_split(key_splits)


# ---------------------------------------------------------------- rebuild


def load_builder():
    spec = importlib.util.spec_from_file_location("build_bundled_data", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up in sys.modules while the class is built.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_rebuild_is_byte_identical(tmp_path: Path) -> None:
    # A rebuild takes minutes: run on purpose (the build-bundled extra installed), not whenever pyarrow happens to
    # be there (TRL, a test dependency, brings it)
    if os.environ.get("LLASMOL_TEST_REBUILD") != "1":
        pytest.skip("set LLASMOL_TEST_REBUILD=1 (with pip install -e '.[build-bundled]') to rebuild the excerpt")
    pytest.importorskip("py2opsin")
    pytest.importorskip("pyarrow")
    if shutil.which("java") is None:
        pytest.skip("OPSIN needs a Java runtime")
    # Canonical SMILES can change between RDKit releases, so a rebuild is only
    # comparable with the pinned version (recorded in PROVENANCE.md).
    rdkit_version = importlib.metadata.version("rdkit")
    provenance = (BUNDLED / "PROVENANCE.md").read_text(encoding="utf-8")
    if not re.search(rf"\brdkit {re.escape(rdkit_version)}(?![\w.])", provenance):
        pytest.skip(f"rdkit {rdkit_version} is not the version the sample was built with")

    builder = load_builder()
    wheel_dir = Path(
        os.environ.get(
            "LLASMOL_SAMPLE_WHEEL_DIR", Path.home() / ".cache" / "llasmol-build-bundled"
        )
    )
    try:
        builder.fetch_wheels(wheel_dir)
    except (subprocess.CalledProcessError, OSError) as error:
        pytest.skip(f"source wheels unavailable: {error}")

    out = tmp_path / "sample"
    builder.build(out, wheel_dir)

    def files(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    assert files(out) == files(BUNDLED)
    for relative in files(BUNDLED):
        assert (out / relative).read_bytes() == (BUNDLED / relative).read_bytes(), relative
