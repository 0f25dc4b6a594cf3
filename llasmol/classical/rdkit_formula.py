"""`method=rdkit`: the molecular formula of a SMILES input, computed by RDKit (the paper's RDKit row for
SMILES-to-formula): every task whose answer is a formula of its SMILES input, name_conversion-s2f in
SMolInstruct. The formula is `CalcMolFormula`'s, the function that wrote the bundled sample's golds."""

from __future__ import annotations

from typing import Optional

from llasmol.classical.common import Baseline, Examples
from llasmol.core.tasks import Task


def smiles_formula(smiles: str) -> Optional[str]:
    """The molecular formula of `smiles` (all its parts, charges included), or None when RDKit cannot read it."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem.rdMolDescriptors import CalcMolFormula

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) and smiles.strip() else None
    return CalcMolFormula(mol) if mol is not None else None


class RDKitFormula(Baseline):
    name = "rdkit"

    def why_not(self, task: Task) -> Optional[str]:
        if task.input_kind != "smiles" or task.family != "formula":
            return "it computes the formula of a SMILES input only"
        return None

    def predict(self, task: str, test: Examples, k: int) -> list[list[str]]:
        # Deterministic: one answer, whatever k the task scores.
        return [[formula] if (formula := smiles_formula(x)) else [] for x in test.inputs]
