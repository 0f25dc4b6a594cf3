"""The data-leakage audit of a SMolInstruct copy (`python -m llasmol.audit`): it reads the raw files, not runs.

    from llasmol.leakage import audit, to_markdown
    result = audit(SMolInstructSource.from_config(cfg.data))   # findings, invalid SMILES, counts vs Table 1
    to_markdown(result)                                         # the report the command writes as audit.md

`checks.py` finds the leaks, `sample_keys.py` turns a raw record's fields into 8-byte structure keys,
`audit_report.py` renders the result; `corpus.py` checks a pretraining corpus against the held-out splits.
"""

from llasmol.leakage.audit_report import summary_lines, to_markdown
from llasmol.leakage.checks import CHECKS, audit
from llasmol.leakage.corpus import corpus_overlap

__all__ = ["CHECKS", "audit", "corpus_overlap", "summary_lines", "to_markdown"]
