"""A small SMolInstruct copy in the official archive layout, written into a test's temporary folder.

Values are deterministic functions of the molecule so tests can recompute what a sample must say.
"""

from __future__ import annotations

import json
from pathlib import Path

from rdkit import Chem
from rdkit.Chem.rdMolDescriptors import CalcMolFormula

from llasmol.core.tasks import get_task
from llasmol.core.smiles import canonical_kekule

MOLECULES = [
    "CCO", "CC(=O)O", "c1ccccc1", "CCN(CC)CC", "O=C(O)c1ccccc1O", "CC(C)O", "CCCCCC", "c1ccncc1",
    "CC(=O)Nc1ccc(O)cc1", "ClCCl", "CCOC(C)=O", "OCC(O)CO", "C1CCOC1", "CS(C)=O", "N#Cc1ccccc1",
    "CC(C)(C)O", "Oc1ccccc1", "Cc1ccccc1", "CCCCO", "O=C1CCCCC1", "CN1CCCC1", "Brc1ccccc1",
    "CCOCC", "NC(=O)N", "C=CC(=O)O", "CC#N", "OC1CCCCC1", "Fc1ccccc1", "CCCl", "COc1ccccc1",
    "CC(N)C(=O)O", "NCC(=O)O", "C1CCNCC1", "CC(C)=O", "CCCC(=O)O", "c1ccc2ccccc2c1", "CNC", "ICC",
    "CCS", "OCCO",
]

# The fixture's tasks; their core tags (`core_tag/<task>.json`) come from the task table.
TASKS = ("forward_synthesis", "name_conversion-s2f", "property_prediction-esol", "property_prediction-bbbp",
         "property_prediction-sider")

TEMPLATES = {
    "forward_synthesis": [
        {"input": "What is the product of <INPUT> ?", "output": "The product is <OUTPUT> ."},
        {"input": "Predict the outcome: <INPUT>", "output": "<OUTPUT>"},
    ],
    "name_conversion-s2f": [
        {"input": "Give the formula of <INPUT> .", "output": "Its formula is <OUTPUT> ."},
        {"input": "<INPUT> has which molecular formula?", "output": "<OUTPUT>"},
    ],
    "property_prediction-esol": [
        {"input": "How soluble is <INPUT> ?", "output": "Its log solubility is <OUTPUT> mol/L."},
    ],
    "property_prediction-bbbp": [
        {"input": "Does <INPUT> cross the blood-brain barrier?", "output": "<OUTPUT>"},
    ],
    "property_prediction-sider": [
        {"input": "Does <INPUT> cause hepatobiliary disorders?", "output": "<OUTPUT>"},
        {"input": "Is <INPUT> linked to eye disorders?", "output": "<OUTPUT>"},
    ],
}

# Tasks that the paper splits together with others (FS with RS, MC with MG, the NC tasks), for the leakage
# audit's tests: `write_smolinstruct(root, tasks=tuple(TASKS) + tuple(RELATED_TASKS))`.
RELATED_TASKS = ("retrosynthesis", "molecule_captioning", "molecule_generation", "name_conversion-i2f",
                 "name_conversion-i2s", "name_conversion-s2i")
TEMPLATES.update({task: [{"input": "Answer for <INPUT> :", "output": "<OUTPUT>"}] for task in RELATED_TASKS})

SPLITS = ("train", "dev", "test")


def name_of(k: int) -> str:
    """Molecule k's name in the name-conversion tasks (a stand-in for its IUPAC name)."""
    return f"fixture-compound-{k}"


def caption_of(k: int, smiles: str) -> str:
    return f"The molecule is fixture compound {k}, {CalcMolFormula(Chem.MolFromSmiles(smiles))}."


def core_pair(task: str, smiles: str, k: int):
    """The (input, output) raw record of molecule `smiles` for `task`."""
    if task == "forward_synthesis":
        return f"{smiles}.O", smiles
    if task == "name_conversion-s2f":
        return smiles, CalcMolFormula(Chem.MolFromSmiles(smiles))
    if task == "property_prediction-esol":
        return smiles, f"{-0.25 * len(smiles):.2f}"
    if task == "property_prediction-bbbp":
        return smiles, "Yes" if k % 2 else "No"
    if task == "retrosynthesis":  # the forward reaction read backwards: product -> reactants
        return smiles, f"{smiles}.O"
    if task == "molecule_captioning":
        return smiles, caption_of(k, smiles)
    if task == "molecule_generation":
        return caption_of(k, smiles), smiles
    if task == "name_conversion-i2f":
        return name_of(k), CalcMolFormula(Chem.MolFromSmiles(smiles))
    if task == "name_conversion-i2s":
        return name_of(k), smiles
    if task == "name_conversion-s2i":
        return smiles, name_of(k)
    # SIDER's raw output is a dict of targets; each sample picks one.
    return smiles, {"Hepatobiliary disorders": "Yes" if k % 3 else "No", "Eye disorders": "No" if k % 2 else "Yes"}


def split_of(k: int) -> str:
    return "dev" if k % 5 == 3 else "test" if k % 5 == 4 else "train"


def write_smolinstruct(root: Path, tasks=tuple(TASKS)) -> Path:
    """Write the fixture; returns `root`. Molecule k goes to split `split_of(k)` in every task."""
    root = Path(root)
    for task in tasks:
        (root / "core_tag").mkdir(parents=True, exist_ok=True)
        (root / "core_tag" / f"{task}.json").write_text(json.dumps(get_task(task).core_tags()))
        (root / "template" / "instruction_tuning").mkdir(parents=True, exist_ok=True)
        (root / "template" / "instruction_tuning" / f"{task}.json").write_text(json.dumps(TEMPLATES[task]))
        for split in SPLITS:
            lines, samples = [], []
            for k, smi in enumerate(MOLECULES):
                if split_of(k) != split:
                    continue
                core_in, core_out = core_pair(task, canonical_kekule(smi), k)  # the archive's Kekule SMILES
                lines.append(json.dumps({"input": core_in, "output": core_out, "task": task, "split": split}))
                target = ("Hepatobiliary disorders" if k % 2 else "Eye disorders") if isinstance(core_out, dict) else None
                samples.append({"idx": len(lines) - 1, "template_id": k % len(TEMPLATES[task]), "target": target})
            raw = root / "raw" / split
            raw.mkdir(parents=True, exist_ok=True)
            (raw / f"{task}.jsonl").write_text("\n".join(lines) + "\n")
            sdir = root / "sample" / "instruction_tuning" / split
            sdir.mkdir(parents=True, exist_ok=True)
            record = {"task": task, "split": split, "template_name": "instruction_tuning", "samples": samples}
            (sdir / f"{task}.json").write_text(json.dumps(record))
            if split == "test":  # v1.2.0's test subset: every other test sample, indexing raw/test
                subset = {**record, "split": "test_subset", "samples": samples[::2]}
                (sdir.parent / "test_subset").mkdir(exist_ok=True)
                (sdir.parent / "test_subset" / f"{task}.json").write_text(json.dumps(subset))
    return root


def add_record(root: Path, task: str, split: str, core_in: str, core_out) -> int:
    """Append one raw record (and its sample) to `task`'s files in `split`; returns its raw line number (1-based)."""
    raw = Path(root) / "raw" / split / f"{task}.jsonl"
    with raw.open("a") as fh:
        fh.write(json.dumps({"input": core_in, "output": core_out, "task": task, "split": split}) + "\n")
    line = len(raw.read_text().splitlines())
    listing = Path(root) / "sample" / "instruction_tuning" / split / f"{task}.json"
    record = json.loads(listing.read_text())
    record["samples"].append({"idx": line - 1, "template_id": 0, "target": None})
    listing.write_text(json.dumps(record))
    return line
