"""SMILES written the way SMolInstruct writes them: RDKit canonical, isomeric, **Kekulé**, parts sorted.

SMolInstruct's SMILES come from LLM4Chem's `canonicalize_molecule_smiles` (utils/smiles_canonicalization.py,
lines 64-104, defaults `kekulization=True, sort_things=True, isomeric=True`), and `canonical_kekule` gives
what it gives (tests/data/kekule_official.json holds its outputs on a few hundred molecules). Each
'.'-separated part loses its atom maps and goes through canonical aromatic SMILES three times (lines
75-83); then it is rebuilt atom by atom (`canonicalize`, lines 9-61): element and charge are copied, and
explicit hydrogens only on aromatic atoms that carry them (`[nH]`), so isotope labels go and every other
atom takes its default valence's hydrogens: radicals close (`[CH2]C` is `CC`, `[O]` is `O`), as do odd
hydrogen counts (`[SiH3]` is `[SiH4]`). Bond orders, bond directions and tetrahedral tags are kept; the
result is written canonically, read back and written in Kekulé form (lines 89-92); the parts are sorted.
So a LlaSMol model has seen `CN(C)C1=CC=NC=C1`, never `CN(C)c1ccncc1`, and never an isotope label.
"""

from __future__ import annotations

from typing import Optional

MAX_SMILES_CHARS = 4096
"""The longest SMILES read anywhere (answers, golds, table rows, questions): no SMolInstruct molecule comes close,
and past some 10,000 atoms RDKit's writer overflows the C stack (a 20,000-carbon chain ends the process with a
segmentation fault, RDKit 2025.09): text past this bound is not given to RDKit at all."""


def _rebuilt(mol):
    """The official `canonicalize`'s clean copy of `mol` (read unsanitised): atoms from element and charge,
    the same bonds, tetrahedral tags where the copy can still be a centre."""
    from rdkit import Chem

    copy = Chem.RWMol()
    for atom in mol.GetAtoms():
        new = Chem.Atom(atom.GetSymbol())
        new.SetFormalCharge(atom.GetFormalCharge())
        if atom.GetIsAromatic() and atom.GetNoImplicit():
            new.SetNumExplicitHs(atom.GetNumExplicitHs())
        copy.AddAtom(new)
    for bond in mol.GetBonds():
        begin, end = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        copy.AddBond(begin, end, bond.GetBondType())
        new_bond = copy.GetBondBetweenAtoms(begin, end)
        new_bond.SetBondDir(bond.GetBondDir())
        new_bond.SetStereo(bond.GetStereo())
    # rdchiral's copy_chirality, which the official code calls: no tag where the copy cannot be a centre
    # (fewer than 3 bonds, or 3 with a multiple one); the neighbour order is the source's, so no inversion.
    for new in copy.GetAtoms():
        bonds = new.GetBonds()
        if len(bonds) < 3 or (len(bonds) == 3 and any(b.GetBondType() != Chem.BondType.SINGLE for b in bonds)):
            continue
        new.SetChiralTag(mol.GetAtomWithIdx(new.GetIdx()).GetChiralTag())
    return copy


def canonical_part(part: str) -> Optional[str]:
    """One '.'-free part in the official form; None when RDKit cannot read it, or it is longer than
    `MAX_SMILES_CHARS` (may raise on odd input)."""
    from rdkit import Chem
    from rdkit.Chem.AllChem import AssignStereochemistry

    mol = Chem.MolFromSmiles(part) if part and len(part) <= MAX_SMILES_CHARS else None
    if mol is None:
        return None
    for atom in mol.GetAtoms():
        atom.SetAtomMapNum(0)
    text = Chem.MolToSmiles(mol)
    for _ in range(2):  # the official code writes and reads it back twice before rebuilding
        mol = Chem.MolFromSmiles(text)
        if mol is None:
            return None
        text = Chem.MolToSmiles(mol)
    raw = Chem.MolFromSmiles(text, sanitize=False)
    raw.UpdatePropertyCache()
    copy = _rebuilt(raw)
    flags = Chem.SanitizeFlags
    Chem.SanitizeMol(copy, sanitizeOps=flags.SANITIZE_SETAROMATICITY | flags.SANITIZE_PROPERTIES
                     | flags.SANITIZE_ADJUSTHS, catchErrors=True)
    AssignStereochemistry(copy, cleanIt=False, force=True, flagPossibleStereoCenters=True)
    kekule = Chem.MolFromSmiles(Chem.MolToSmiles(copy))
    return None if kekule is None else Chem.MolToSmiles(kekule, kekuleSmiles=True)


def canonical_kekule(smiles: str) -> Optional[str]:
    """`smiles` in SMolInstruct's form, or None when a part is empty, longer than `MAX_SMILES_CHARS` or unreadable
    by RDKit."""
    from rdkit import RDLogger

    RDLogger.DisableLog("rdApp.*")
    parts = []
    for part in smiles.split("."):
        try:
            canonical = canonical_part(part)
        except Exception:  # the official function returns None for any error in a part
            return None
        if canonical is None:
            return None
        parts.append(canonical)
    return ".".join(sorted(parts))


SMILES_OPEN, SMILES_CLOSE = "<SMILES>", "</SMILES>"


def _tag_span(query: str) -> Optional[tuple[int, int]]:
    """Where a query's first ``<SMILES>`` and first ``</SMILES>`` start; None without that pair in that order."""
    left, right = query.find(SMILES_OPEN), query.find(SMILES_CLOSE)
    return None if left == -1 or right < left else (left, right)


def tagged_smiles(query: str) -> Optional[str]:
    """The SMILES between a query's first ``<SMILES>`` and the first ``</SMILES>``, stripped; None without that pair."""
    span = _tag_span(query)
    return None if span is None else query[span[0] + len(SMILES_OPEN): span[1]].strip()


def canonicalize_query(query: str) -> str:
    """The query as the official LlaSMol generation prepares it (generation.py `canonicalize_smiles_in_text`,
    called by `create_sample`): the SMILES between the first ``<SMILES>`` and the first ``</SMILES>`` written
    as SMolInstruct writes it (canonical Kekulé, parts sorted: the form the model was trained on), with one
    space on each side of it inside the tags, one before the opening tag (unless it starts the query or
    follows a space) and exactly one after the closing tag; any later tag pair stays as written. Where the
    official function stops with an error instead (a SMILES RDKit cannot read, ``;`` in it, a closing tag
    missing or before the opening one) the query is left as written (docs/deviations.md)."""
    span = _tag_span(query)
    if span is None:
        return query
    left, right = span
    written = canonical_kekule(query[left + len(SMILES_OPEN): right].strip())
    if written is None:
        return query
    before = "" if left == 0 or query[left - 1] == " " else " "
    rest = query[right + len(SMILES_CLOSE):].lstrip()
    return f"{query[:left]}{before}{SMILES_OPEN} {written} {SMILES_CLOSE} {rest}"
