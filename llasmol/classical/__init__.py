"""Non-LLM baselines for SMolInstruct (`python -m llasmol.baseline method=<name>`): one class per method,
named here, the only list of them."""

from __future__ import annotations

from llasmol.classical.common import Baseline, Examples
from llasmol.classical.forest import FingerprintForest
from llasmol.classical.nearest import NearestNeighbor
from llasmol.classical.opsin_names import OpsinNames
from llasmol.classical.rdkit_formula import RDKitFormula
from llasmol.core.errors import UserError

METHODS: dict[str, type[Baseline]] = {m.name: m for m in (RDKitFormula, OpsinNames, FingerprintForest, NearestNeighbor)}


def get_method(name) -> type[Baseline]:
    """The class of method `name`; one line naming the methods when there is no such method."""
    if not isinstance(name, str) or name not in METHODS:
        said = "no method given" if name is None else f"unknown method={name!r}"
        raise UserError(f"{said}: pass method=<name>, one of " + ", ".join(METHODS))
    return METHODS[name]


__all__ = ["METHODS", "Baseline", "Examples", "get_method"]
