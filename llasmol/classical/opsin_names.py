"""`method=opsin`: IUPAC names parsed by OPSIN (through py2opsin, which bundles the OPSIN jar and needs Java):
the rule-based name parser the field uses as the reference for name-to-structure. Answers
name_conversion-i2s with the structure in SMolInstruct's SMILES form (`llasmol.core.smiles`) and
name_conversion-i2f with its RDKit formula. A name OPSIN cannot parse gets no answer."""

from __future__ import annotations

import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Optional

from llasmol.classical.common import Baseline, Examples
from llasmol.classical.rdkit_formula import smiles_formula
from llasmol.core.errors import UserError
from llasmol.core.tasks import Task
from llasmol.core.smiles import canonical_kekule

log = logging.getLogger(__name__)

INSTALL = "pip install 'llasmol[opsin]' (py2opsin==1.2.0) and a Java runtime (e.g. apt-get install default-jre-headless)"


def opsin_smiles(names: list[str]) -> list[Optional[str]]:
    """OPSIN's SMILES of each name (None where it cannot parse it), from one Java call for all names."""
    if shutil.which("java") is None:
        raise UserError(f"method=opsin runs OPSIN on Java, and no java is on PATH: {INSTALL}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # py2opsin warns at import when it cannot run java itself
            from py2opsin import py2opsin
    except ImportError:
        raise UserError(f"method=opsin needs the py2opsin package: {INSTALL}") from None
    if not names:
        return []
    # One name a line: a line break inside a name would shift every answer after it.
    lines = [" ".join(name.split()) or "-" for name in names]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # py2opsin warns once per unparsable name; they are counted below
        out = py2opsin(lines, tmp_fpath=str(Path(tmp) / "names.txt"))
    if out is False or len(out) != len(lines):
        got = "nothing" if out is False else f"{len(out)} lines"
        raise RuntimeError(f"OPSIN returned {got} for {len(lines)} names")
    return [smiles.strip() or None for smiles in out]


class OpsinNames(Baseline):
    name = "opsin"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._parsed: dict[str, Optional[str]] = {}  # name -> OPSIN's SMILES, shared by i2s and i2f

    def why_not(self, task: Task) -> Optional[str]:
        if task.input_kind != "iupac" or task.family not in ("smiles", "formula"):
            return "it reads IUPAC names into structures (and their formulas) only"
        return None

    def predict(self, task: str, test: Examples, k: int) -> list[list[str]]:
        todo = list(dict.fromkeys(x for x in test.inputs if x not in self._parsed))
        self._parsed.update(zip(todo, opsin_smiles(todo)))
        failed = sum(self._parsed[x] is None for x in test.inputs)
        if failed:
            log.info("opsin: %s: OPSIN cannot parse %d of %d names (no answer)", task, failed, len(test))
        convert = smiles_formula if self.tasks.task(task).family == "formula" else canonical_kekule
        answers = []
        for name in test.inputs:
            smiles = self._parsed[name]
            answer = convert(smiles) if smiles else None
            answers.append([answer] if answer else [])
        return answers
