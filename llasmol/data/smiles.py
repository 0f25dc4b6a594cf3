"""SMILES written the way SMolInstruct writes them (canonical, isomeric, Kekulé, parts sorted): the data's
name for `llasmol.core.smiles`, which holds the official form once for the data and the scorer alike."""

from llasmol.core.smiles import canonical_kekule, canonical_part

__all__ = ["canonical_kekule", "canonical_part"]
