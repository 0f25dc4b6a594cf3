"""The LlaSMol paper's chemistry metrics: answer extraction, additive per-sample statistics,
corpus-level metrics from their sums, and a torchmetrics wrapper for DDP.

`ChemistryMetrics` is imported lazily (it pulls in torch); everything else is pure Python plus
RDKit, with NLTK/WordNet/rouge-score loaded only when captioning is scored.
"""

from __future__ import annotations

from llasmol.metrics.extract import any_answer, extract_answer
from llasmol.metrics.families import FAMILIES
from llasmol.metrics.scoring import STATS, add_stats, finalize, sample_stats, score_records

__all__ = [
    "FAMILIES",
    "STATS",
    "any_answer",
    "ChemistryMetrics",
    "add_stats",
    "extract_answer",
    "finalize",
    "sample_stats",
    "score_records",
]


def __getattr__(name: str):
    if name == "ChemistryMetrics":
        from llasmol.metrics.reducer import ChemistryMetrics  # lazy: torch, torchmetrics (6 s)

        return ChemistryMetrics
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
