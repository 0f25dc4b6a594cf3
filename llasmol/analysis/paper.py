"""Numbers the LlaSMol paper (Yu et al. 2024, arXiv 2402.09391) reports, for comparison with runs.

Metric values are on the paper's *test* split and are given here as fractions in [0, 1] (the
paper prints percentages; MCC and METEOR are printed as fractions already and kept as printed).
Only numbers that read unambiguously from the paper's tables are here; left out: ESOL/Lipo RMSE
(Table 12) and captioning BLEU/ROUGE (Table 9), whose cells do not survive text extraction, and
formula "validity" (no such metric in this package).  Metric names are this package's
(`llasmol.metrics.scoring`): ``fts`` is Morgan FTS.
"""

from __future__ import annotations

from typing import Optional


def _pct(*values: float) -> tuple[float, ...]:
    """Paper percentages as fractions."""
    return tuple(round(v / 100.0, 6) for v in values)


def _smiles(em1, em3, em5, maccs, rdk, morgan, valid) -> dict[str, float]:
    # Column order of Tables 5, 8, 10, 11: exact match top-1/3/5, FTS MACCS/RDK/Morgan, validity.
    em1, em3, em5, maccs, rdk, morgan, valid = _pct(em1, em3, em5, maccs, rdk, morgan, valid)
    return {
        "exact_match": em1,
        "top1_exact_match": em1,
        "top3_exact_match": em3,
        "top5_exact_match": em5,
        "fts_maccs": maccs,
        "fts_rdk": rdk,
        "fts": morgan,
        "validity": valid,
    }


def _topk(*values: float) -> dict[str, float]:
    # Tables 4, 6 (top-1, top-3) and 7 (top-1, top-3, top-5).
    fractions = _pct(*values)
    out = {"exact_match": fractions[0]}
    out.update({f"top{k}_exact_match": v for k, v in zip((1, 3, 5), fractions)})
    return out


def _boolean(f1, mcc, acc) -> dict[str, float]:
    # Table 13 column order per task: F1 (%), MCC (fraction), accuracy (%).
    return {"f1": round(f1 / 100.0, 6), "mcc": mcc, "accuracy": round(acc / 100.0, 6)}


PAPER_RESULTS: dict[str, dict[str, dict[str, float]]] = {
    "LlaSMol-Mistral": {
        "name_conversion-i2f": _topk(89.8, 94.6),  # Table 4 (EM 89.8 also in Table 2)
        "name_conversion-i2s": _smiles(70.1, 77.8, 80.1, 96.6, 90.1, 89.1, 99.6),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(94.5, 97.2),  # Table 6
        "name_conversion-s2i": _topk(29.0, 45.3, 50.5),  # Table 7
        "molecule_generation": _smiles(19.2, 29.2, 33.7, 84.1, 70.3, 61.7, 99.8),  # Table 8 (and Table 3)
        "molecule_captioning": {"meteor": 0.452},  # Table 3
        "forward_synthesis": _smiles(63.5, 75.6, 79.1, 91.8, 87.2, 85.0, 99.8),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(32.9, 49.6, 55.4, 83.0, 75.1, 70.4, 100.0),  # Table 11 (and Table 3)
        "property_prediction-bbbp": _boolean(83.7, 0.340, 74.6),  # Table 13
        "property_prediction-clintox": _boolean(0.0, 0.000, 93.1),  # Table 13
        "property_prediction-hiv": _boolean(4.3, 0.111, 96.7),  # Table 13
        "property_prediction-sider": _boolean(79.9, 0.429, 70.7),  # Table 13
    },
    "LlaSMol-Llama 2": {
        "name_conversion-i2f": _topk(74.6, 86.6),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(41.8, 52.7, 56.5, 91.1, 76.8, 75.4, 99.1),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(86.7, 93.9),  # Table 6
        "name_conversion-s2i": _topk(10.3, 18.7, 21.7),  # Table 7
        "molecule_generation": _smiles(4.8, 9.0, 10.6, 71.7, 52.7, 44.2, 99.9),  # Table 8 (and Table 3)
        "molecule_captioning": {"meteor": 0.366},  # Table 3
        "forward_synthesis": _smiles(44.2, 58.4, 62.5, 85.8, 78.4, 75.3, 99.7),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(22.4, 35.5, 41.1, 79.8, 70.4, 65.2, 99.9),  # Table 11 (and Table 3)
        "property_prediction-bbbp": _boolean(81.3, -0.048, 68.5),  # Table 13
        "property_prediction-clintox": _boolean(0.0, 0.000, 93.1),  # Table 13
        "property_prediction-hiv": _boolean(2.9, 0.120, 96.7),  # Table 13
        "property_prediction-sider": _boolean(78.2, 0.360, 65.7),  # Table 13
    },
}

PAPER_MODELS: tuple[str, ...] = tuple(PAPER_RESULTS)

# The paper's model trained on each of our bases (`model=`), for putting a run's test numbers beside it.
PAPER_MODEL_OF_BASE: dict[str, str] = {"mistral": "LlaSMol-Mistral", "llama2": "LlaSMol-Llama 2"}

# Section 5.4 (the LoRA ablation, all on Llama-2-7B except `large` on Llama-2-13B): trainable
# parameters and their share of all parameters, keyed by this package's `lora=` names.
# `percent` is in percent, like params.json's "percent" (0.12 means 0.12 %).
PAPER_TRAINABLE: dict[str, dict[str, float]] = {
    "lite": {"trainable": 8.4e6, "percent": 0.12},  # LlaSMol Lite: q, v
    "attn": {"trainable": 16.8e6, "percent": 0.25},  # LlaSMol Attn: q, k, v, o
    "ffn": {"trainable": 23.2e6, "percent": 0.34},  # LlaSMol FFN: gate, up, down
    "full": {"trainable": 40.0e6, "percent": 0.59},  # LlaSMol: attention + FFN (also Section 5.3)
    "plus": {"trainable": 171.0e6, "percent": 2.48},  # LlaSMol Plus: full + lm_head
    "large": {"trainable": 62.6e6, "percent": 0.48},  # LlaSMol Large: full on Llama-2-13B
}


def paper_metric(model: str, task: str, metric: str) -> Optional[float]:
    """A reported value (fraction), or None when the paper's number is not here."""
    return PAPER_RESULTS.get(model, {}).get(task, {}).get(metric)
