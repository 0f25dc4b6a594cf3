"""SMILES parsing, molecule identity and fingerprint similarity (RDKit).

Rules (LlaSMol paper, Appendix A.4), as the official scorer (LLM4Chem utils/metrics.py) reads an answer:

- ``';'`` is read as ``'.'`` (config.py `TASKS_WITH_SEMICOLON_REPLACE`: every SMILES task); the answer is
  split on ``'.'`` into parts. The answer is *valid* when every part parses with RDKit (with sanitisation,
  i.e. valence rules) into a molecule with at least one atom. Each part goes to RDKit as it is, as the
  official `canonicalize_molecule_smiles` passes it (smiles_canonicalization.py line 73): RDKit reads up to
  the first whitespace and takes the rest as the molecule's name, so ``"CCO (ethanol)"`` is ethanol (but
  ``" CCO (ethanol)"``, with a leading space, is unreadable, `_read_part`). An empty part (``"CCO..O"``,
  ``"CCO."``), a whitespace-only one or an answer longer than `MAX_SMILES_CHARS` is invalid.
- Identity: the set of standard InChI strings of the parts (utils/metrics.py `get_molecule_id`). A part
  RDKit can write no InChI for (dummy atoms ``*``) has the empty InChI, so ``*C`` and ``*CC`` match there.
  So Kekulé vs aromatic spelling, fragment order, repeated fragments and the tautomers and protonation
  states standard InChI merges (2-pyridone and 2-hydroxypyridine; zwitterionic and neutral glycine) do
  not matter; stereo and net charge do. A part is first put in the official form (`llasmol.core.smiles`)
  where that changes the molecule, for identity and fingerprints alike, as the official scorer does: it
  canonicalises every answer and gold (utils/metrics.py lines 158 and 170) by rebuilding each atom from its
  element and charge (utils/smiles_canonicalization.py lines 16-17) before comparing InChI
  (utils/metrics.py lines 57-62), so ``[13CH4]`` is methane and the radical ``[CH2]C`` is ethane there.
- `scoring.strict_smiles=true` (off by default; the `strict` argument, `llasmol.core.tasks.Scoring`) is the
  stricter reading: whitespace inside a part makes the answer invalid (``"CC O"`` is no SMILES), and a part without an InChI is keyed by
  its canonical SMILES, so ``*C`` and ``*CC`` differ.
- Fingerprints are of the whole (dotted) molecule: Morgan radius 2 unfolded count fingerprint
  (rdFingerprintGenerator's sparse count fingerprint, the same as the legacy
  ``GetMorganFingerprint(mol, 2)``), MACCS keys, and ``RDKFingerprint``; similarity is
  RDKit's Tanimoto.

Parsing is cached by text (``lru_cache``; InChI keys and fingerprints only, molecules are not
kept): golds repeat across samples and ranks, and answers repeat across beams, samples and golds
(a right answer is usually the gold string itself).  RDKit's log is silenced on import of this module.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from rdkit import Chem, DataStructs, RDLogger
from rdkit.Chem import MACCSkeys, rdFingerprintGenerator

from llasmol.core.smiles import MAX_SMILES_CHARS
from llasmol.core.smiles import canonical_part as _canonical_part

RDLogger.DisableLog("rdApp.*")

# Answers longer than `MAX_SMILES_CHARS` (llasmol.core.smiles: the bound on every SMILES read) are invalid
# without parsing.

# Fingerprints cost what a molecule's graph makes them cost, not what its text length says: 64 sulfur atoms
# bonded six ways in a 3-D grid (680 characters, valid for RDKit) take RDKit minutes of path enumeration
# and SMARTS matching. Answers past these bounds are refused before any fingerprint (counted as invalid,
# and as `num_too_complex`); SMolInstruct's molecules are small ones (the paper: up to ~100 atoms).
MAX_ATOMS = 300
MAX_RING_CLOSURES = 40  # bonds - atoms + fragments: 31 for C60, 129 for that sulfur grid
# Size is not cost: RDKFingerprint hashes every connected set of 1 to `RDK_MAX_PATH` bonds (its default
# branched paths), about 2 us each, and a dense small graph has tens of millions (ten metal atoms all bonded
# to each other, 45 bonds, 31 s). So the number of such sets is bounded itself: 36,519 for C60, 2,070 for a
# steroid, 3 for ethanol; past the bound an answer is invalid (`num_too_complex`) before any fingerprint.
# Only parses that make fingerprints (golds, top-1 answers) count them: identity alone stays cheap.
RDK_MAX_PATH = 7
MAX_SUBGRAPHS = 50_000

FINGERPRINTS: tuple[str, ...] = ("morgan", "maccs", "rdk")

_MORGAN = rdFingerprintGenerator.GetMorganGenerator(radius=2)


class Molecule(NamedTuple):
    """A parsed SMILES answer: identity keys and, when asked for, fingerprints."""

    keys: frozenset[str]
    fingerprints: dict[str, object] | None


def count_bond_sets(mol: Chem.Mol, limit: int = 10**9) -> int:
    """How many connected sets of 1..`RDK_MAX_PATH` bonds RDKFingerprint enumerates in `mol`; counting stops
    at `limit + 1`, so its time is bounded whatever the graph. Each set is grown from its lowest-numbered
    bond by adding neighbours numbered above it (ESU enumeration on the line graph): every set is reached
    once, and the work is proportional to the count."""
    neighbours: list[list[int]] = [[] for _ in range(mol.GetNumBonds())]
    for atom in mol.GetAtoms():
        bonds = [b.GetIdx() for b in atom.GetBonds()]
        for i in bonds:
            neighbours[i].extend(j for j in bonds if j != i)
    count = 0
    for root in range(len(neighbours)):
        # a stack of (size, frontier the set may still grow into, bonds already in or next to the set)
        stack = [(1, [j for j in neighbours[root] if j > root], {root, *neighbours[root]})]
        while stack:
            size, frontier, seen = stack.pop()
            count += 1
            if count > limit:
                return count
            if size == RDK_MAX_PATH:
                continue
            while frontier:
                bond = frontier.pop()
                new = [j for j in neighbours[bond] if j > root and j not in seen]
                stack.append((size + 1, frontier + new, seen | set(new)))
    return count


def _too_complex(mols: list, fingerprints: bool = True) -> bool:
    atoms = sum(m.GetNumAtoms() for m in mols)
    closures = sum(m.GetNumBonds() - m.GetNumAtoms() + 1 for m in mols)
    if atoms > MAX_ATOMS or closures > MAX_RING_CLOSURES:
        return True
    if not fingerprints:
        return False  # identity alone (InChI) is cheap on such graphs; counting would triple an audit's time
    budget = MAX_SUBGRAPHS
    for mol in mols:  # the whole answer's fingerprint enumerates each part's sets
        budget -= count_bond_sets(mol, budget)
        if budget < 0:
            return True
    return False


def too_complex(text: str | None, strict: bool = False) -> bool:
    """Whether `text` is a SMILES RDKit reads (strictly, `strict`) but too large, too ring-dense or too costly to
    fingerprint to score (`MAX_ATOMS`, `MAX_RING_CLOSURES`, `MAX_SUBGRAPHS`); no fingerprints."""
    if not isinstance(text, str) or not text or len(text) > MAX_SMILES_CHARS:
        return False
    mols = []
    for part in text.replace(";", ".").split("."):
        mol = _read_part(part, strict)
        if mol is None:
            return False
        mols.append(mol)
    return _too_complex(mols)


def _read_part(part: str, strict: bool) -> Chem.Mol | None:
    """One '.'-free part as RDKit reads it (None: not a molecule). Officially the part goes to RDKit as it is:
    RDKit skips leading whitespace, reads up to the next whitespace and takes the rest as a name, unless the
    part started with whitespace (then a name makes it unreadable: ``" CCO x"``). Strictly
    (`strict`, scoring.strict_smiles), the part is stripped and whitespace left inside it makes it no SMILES."""
    if strict:
        part = part.strip()
        if any(ch.isspace() for ch in part):
            return None
    if not part.strip():
        return None  # officially an empty part is an error, a whitespace-only one unreadable
    try:
        mol = Chem.MolFromSmiles(part)
    except Exception:
        return None
    return mol if mol is not None and mol.GetNumAtoms() > 0 else None


def _needs_official_rebuild(mol: Chem.Mol) -> bool:
    """Whether the official scorer's canonicalisation changes `mol`'s structure: it rebuilds every atom from
    element and charge (`llasmol.core.smiles`), so isotope labels go, radicals close and a bracket atom's
    stated hydrogens give way to its default valence's (aromatic ``[nH]`` keeps its own; a stereocentre's
    ``[C@H]`` gets the same one back)."""
    for atom in mol.GetAtoms():
        if atom.GetIsotope() or atom.GetNumRadicalElectrons():
            return True
        if (atom.GetNoImplicit() and not atom.GetIsAromatic() and atom.GetNumExplicitHs()
                and atom.GetChiralTag() == Chem.ChiralType.CHI_UNSPECIFIED):
            return True
    return False


def _part_key(mol: Chem.Mol, strict: bool) -> str:
    try:
        inchi = Chem.MolToInchi(mol)
    except Exception:
        inchi = ""
    if inchi or not strict:
        return inchi  # officially every part without an InChI has the same, empty one
    return "smiles:" + Chem.MolToSmiles(mol)


def _fingerprints(mol: Chem.Mol) -> dict[str, object]:
    return {
        "morgan": _MORGAN.GetSparseCountFingerprint(mol),
        "maccs": MACCSkeys.GenMACCSKeys(mol),
        "rdk": Chem.RDKFingerprint(mol),
    }


def parse_molecule(text: str | None, fingerprints: bool = False, strict: bool = False) -> Molecule | None:
    """Parse a SMILES answer (strictly: `strict`); ``None`` when it is not valid (see the module docstring)."""
    if not isinstance(text, str) or not text or len(text) > MAX_SMILES_CHARS:
        return None
    mols, texts = [], []
    for part in text.replace(";", ".").split("."):
        mol = _read_part(part, strict)
        if mol is None:
            return None
        if any(ch.isspace() for ch in part):
            part = Chem.MolToSmiles(mol)  # what RDKit read: the whole answer's fingerprint is made from the parts
        if _needs_official_rebuild(mol):
            try:
                part = _canonical_part(part)  # the official form: the official scorer scores that molecule
            except Exception:
                return None
            mol = Chem.MolFromSmiles(part) if part else None
            if mol is None:
                return None
        mols.append(mol)
        texts.append(part)
    if _too_complex(mols, fingerprints):
        return None
    try:
        keys = frozenset(_part_key(mol, strict) for mol in mols)
        fps = None
        if fingerprints:
            whole = mols[0] if len(mols) == 1 else Chem.MolFromSmiles(".".join(texts))
            if whole is None:
                return None
            fps = _fingerprints(whole)
    except Exception:
        return None
    return Molecule(keys, fps)


@functools.lru_cache(maxsize=16384)
def parse_gold_molecule(text: str, strict: bool = False) -> Molecule | None:
    """`parse_molecule` with fingerprints, cached (each reading apart): for golds and top-1 answers (they are
    often equal)."""
    return parse_molecule(text, fingerprints=True, strict=strict)


@functools.lru_cache(maxsize=65536)
def heavy_atom_count(text: str | None) -> int | None:
    """The heavy atoms of a SMILES answer read strictly (whitespace inside is no SMILES), every '.'-part together;
    None when it is no molecule or past the scorer's bounds (its size is what the RL stage's validity term
    compares with a gold's)."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_SMILES_CHARS:
        return None
    count = 0
    for part in text.replace(";", ".").split("."):
        mol = _read_part(part, strict=True)
        if mol is None:
            return None
        count += mol.GetNumHeavyAtoms()
    return count if 0 < count <= MAX_ATOMS else None


@functools.lru_cache(maxsize=65536)
def molecule_keys(text: str | None, strict: bool = False) -> frozenset[str] | None:
    """The identity keys of `parse_molecule(text)` (None when invalid), cached (each reading apart): for
    lower-ranked answers."""
    mol = parse_molecule(text, strict=strict)
    return None if mol is None else mol.keys


def best_tanimoto(fingerprint: object, others: list) -> float:
    """The highest RDKit Tanimoto similarity of `fingerprint` to any of `others`, each clamped to [0, 1] (NaN
    and what RDKit cannot compute count 0.0); 0.0 for none. One bulk call: a pooled input's hundreds of golds
    cost microseconds, not a Python call each."""
    if not others:
        return 0.0
    try:
        values = DataStructs.BulkTanimotoSimilarity(fingerprint, others)
    except Exception:
        values = [_tanimoto_or_zero(fingerprint, other) for other in others]
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    return float(np.clip(values.max(), 0.0, 1.0)) if values.size else 0.0  # clamping the best = the best clamped


def _tanimoto_or_zero(a: object, b: object) -> float:
    try:
        return float(DataStructs.TanimotoSimilarity(a, b))
    except Exception:
        return 0.0
