"""SMILES written the way SMolInstruct writes them: RDKit canonical, isomeric, **Kekulé**, parts sorted.

SMolInstruct's SMILES come from LLM4Chem's `canonicalize_molecule_smiles` (utils/smiles_canonicalization.py,
lines 64-104, defaults `kekulization=True, sort_things=True, isomeric=True`): each '.'-separated part loses
its atom maps, is rebuilt atom by atom (`canonicalize`, lines 9-61: element, charge and chirality are
copied, isotope labels are not), written canonically, read back and written in Kekulé form; the parts are
sorted. So a LlaSMol model has seen `CN(C)C1=CC=NC=C1`, never `CN(C)c1ccncc1`, and never an isotope label.
The Kekulé form is taken from the canonical aromatic SMILES read back, so it depends on the molecule only,
not on how it was spelled.
"""

from __future__ import annotations

from typing import Optional


def canonical_kekule(smiles: str) -> Optional[str]:
    """`smiles` in SMolInstruct's form, or None when a part is empty or RDKit cannot read it."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    parts = []
    for part in smiles.strip().split("."):
        mol = Chem.MolFromSmiles(part) if part else None
        if mol is None:
            return None
        for atom in mol.GetAtoms():
            atom.SetAtomMapNum(0)
            atom.SetIsotope(0)
        canonical = Chem.MolFromSmiles(Chem.MolToSmiles(mol))
        if canonical is None:
            return None
        parts.append(Chem.MolToSmiles(canonical, kekuleSmiles=True))
    return ".".join(sorted(parts))
