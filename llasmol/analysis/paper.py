"""Numbers the LlaSMol paper (Yu et al. 2024, arXiv 2402.09391) reports, for comparison with runs.

Every system the paper's result tables report is here: the four LlaSMol models, the LLMs it compares
them with (GPT-4, Galactica, Llama 2, Code Llama, Mistral, Molinst) and the task-specific systems
(STOUT, STOUT+RDKit, RDKit, Uni-Mol, MolT5, Molecular Transformer, RSMILES).  `PAPER_SOURCES` says
for each what kind of system it is, which tables its numbers come from, what part of the test split
they were measured on, and the caveats the paper states.

Units: fractions in [0, 1] (the paper prints percentages); MCC, METEOR and BLEU are printed as
fractions already and are kept as printed.  Metric names are this package's
(`llasmol.metrics.families`): ``fts`` is Morgan FTS.  Where Table 2/3 and an appendix table print
the same cell, both agree unless listed below.

Tables: 2 (main results, NC and PP), 3 (main results, MC, MG, FS, RS), 4 (NC-I2F), 5 (NC-I2S),
6 (NC-S2F), 7 (NC-S2I), 8 (MG), 9 (MC), 10 (FS), 11 (RS), 12 (ESOL, Lipo), 13 (BBBP, ClinTox, HIV,
SIDER).

Left out, on purpose:

- ESOL and Lipo RMSE of every system (Table 12, and the same columns of Table 2): only the digit
  before the decimal point survives text extraction.
- Captioning ROUGE-1/2/L (Table 9) of every system, and Table 9's METEOR column: cut off by text
  extraction.  METEOR comes from Table 3 instead (not given there for the GPT-4 shot variants).
  BLEU-2 and BLEU-4 are read from the leading cells of each Table 9 row, which survive as
  ``0 | . | 461 | 0 | . | 366``: the same broken-up form as Table 2's leading cells, all of which
  equal the matching appendix numbers.
- Table 2 from its NC-S2F column on (S2F and S2I exact match, RMSE, accuracies): every row is cut
  off there.  The appendix tables give these numbers for every system except the main-table
  ``GPT-4`` row (see below), so that row has NC-I2F and NC-I2S only among the Table 2 tasks.
- Formula validity (Tables 4 and 6): this package has no such metric.
- Tables 4 and 6 have two GPT-4 rows besides the shot rows, labelled "GPT-4" (I2F 16.0/33.0,
  S2F 18.0/28.0) and "GPT-4 (zero-shot)" (I2F 16.0/35.0, S2F 16.0/27.0), that the paper does not
  explain and that differ from its "GPT-4 (0-shot)" row; they are not here.
- Two validity cells that the paper prints twice with different values: Galactica FS (Table 3:
  91.3, Table 10: 84.2) and Mistral FS (Table 3: 99.4, Table 10: 96.0).
- Claude 3 Opus and ChemLLM: the paper text this module was transcribed from (the version with
  Tables 2-13 as listed above) reports neither.

GPT-4 has two kinds of entries.  ``GPT-4`` is the row of the main tables (Section 5.3 reports GPT-4
0-shot): Table 2's readable cells (which equal the Table 4/5 0-shot numbers) and Table 3's row.
Table 3's GPT-4 row does not match the 0-shot rows of Tables 8, 10 and 11 (e.g. FS exact match 1.1
against 2.0) and the paper does not say why; both are kept as printed, under different names.
``GPT-4 (0-shot)`` ... ``GPT-4 (5-shot)`` are the appendix rows (Tables 4-11, 13).

Printed as is even where odd: Code Llama's RS top-3 exact match (0.1) above its top-5 (0.0), Table 11.

Every number here is tested against a second transcription that `scripts/transcribe_paper_tables.py` reads
from the paper's text (tests/data/paper_tables.json, tests/test_paper_transcription.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


def _pct(*values: Optional[float]) -> tuple[Optional[float], ...]:
    """Paper percentages as fractions (None, a "-" cell, stays None)."""
    return tuple(None if v is None else round(v / 100.0, 6) for v in values)


def _present(values: dict[str, Optional[float]]) -> dict[str, float]:
    return {k: v for k, v in values.items() if v is not None}


def _smiles(em1, em3, em5, maccs, rdk, morgan, valid) -> dict[str, float]:
    # Column order of Tables 5, 8, 10, 11: exact match top-1/3/5, FTS MACCS/RDK/Morgan, validity.
    # None: a cell the paper leaves empty ("-") or one left out (module docstring).
    em1, em3, em5, maccs, rdk, morgan, valid = _pct(em1, em3, em5, maccs, rdk, morgan, valid)
    return _present({
        "exact_match": em1,
        "top1_exact_match": em1,
        "top3_exact_match": em3,
        "top5_exact_match": em5,
        "fts_maccs": maccs,
        "fts_rdk": rdk,
        "fts": morgan,
        "validity": valid,
    })


def _main(em, morgan, valid) -> dict[str, float]:
    # Table 3 (and Table 2 for NC-I2S) column order: exact match (top-1), Morgan FTS, validity.
    return _smiles(em, None, None, None, None, morgan, valid)


def _topk(*values: float) -> dict[str, float]:
    # Tables 4, 6 (top-1, top-3) and 7 (top-1, top-3, top-5).
    fractions = _pct(*values)
    out = {"exact_match": fractions[0]}
    out.update({f"top{k}_exact_match": v for k, v in zip((1, 3, 5), fractions)})
    return out


def _boolean(f1, mcc, acc) -> dict[str, float]:
    # Table 13 column order per task: F1 (%), MCC (fraction), accuracy (%).
    return {"f1": round(f1 / 100.0, 6), "mcc": mcc, "accuracy": round(acc / 100.0, 6)}


def _caption(meteor=None, bleu2=None, bleu4=None) -> dict[str, float]:
    # METEOR from Table 3; BLEU-2, BLEU-4 from Table 9 (module docstring); all printed as fractions.
    return _present({"meteor": meteor, "bleu2": bleu2, "bleu4": bleu4})


def _pp(bbbp, clintox, hiv, sider) -> dict[str, dict[str, float]]:
    # One Table 13 row: (F1, MCC, accuracy) per task.
    return {
        "property_prediction-bbbp": _boolean(*bbbp),
        "property_prediction-clintox": _boolean(*clintox),
        "property_prediction-hiv": _boolean(*hiv),
        "property_prediction-sider": _boolean(*sider),
    }


PAPER_RESULTS: dict[str, dict[str, dict[str, float]]] = {
    # ------------------------------------------------------------------ the LlaSMol series
    "LlaSMol-Mistral": {
        "name_conversion-i2f": _topk(89.8, 94.6),  # Table 4 (EM 89.8 also in Table 2)
        "name_conversion-i2s": _smiles(70.1, 77.8, 80.1, 96.6, 90.1, 89.1, 99.6),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(94.5, 97.2),  # Table 6
        "name_conversion-s2i": _topk(29.0, 45.3, 50.5),  # Table 7
        "molecule_generation": _smiles(19.2, 29.2, 33.7, 84.1, 70.3, 61.7, 99.8),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.452, 0.414, 0.319),  # Tables 3, 9
        "forward_synthesis": _smiles(63.5, 75.6, 79.1, 91.8, 87.2, 85.0, 99.8),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(32.9, 49.6, 55.4, 83.0, 75.1, 70.4, 100.0),  # Table 11 (and Table 3)
        **_pp((83.7, 0.340, 74.6), (0.0, 0.000, 93.1), (4.3, 0.111, 96.7), (79.9, 0.429, 70.7)),  # Table 13
    },
    "LlaSMol-Llama 2": {
        "name_conversion-i2f": _topk(74.6, 86.6),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(41.8, 52.7, 56.5, 91.1, 76.8, 75.4, 99.1),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(86.7, 93.9),  # Table 6
        "name_conversion-s2i": _topk(10.3, 18.7, 21.7),  # Table 7
        "molecule_generation": _smiles(4.8, 9.0, 10.6, 71.7, 52.7, 44.2, 99.9),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.366, 0.292, 0.203),  # Tables 3, 9
        "forward_synthesis": _smiles(44.2, 58.4, 62.5, 85.8, 78.4, 75.3, 99.7),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(22.4, 35.5, 41.1, 79.8, 70.4, 65.2, 99.9),  # Table 11 (and Table 3)
        **_pp((81.3, -0.048, 68.5), (0.0, 0.000, 93.1), (2.9, 0.120, 96.7), (78.2, 0.360, 65.7)),  # Table 13
    },
    "LlaSMol-Galactica": {
        "name_conversion-i2f": _topk(81.0, 91.2),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(57.7, 69.2, 72.3, 95.5, 86.4, 84.7, 99.6),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(90.0, 94.8),  # Table 6
        "name_conversion-s2i": _topk(18.2, 30.6, 35.3),  # Table 7
        "molecule_generation": _smiles(7.8, 13.6, 17.2, 78.6, 61.0, 51.0, 99.8),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.394, 0.324, 0.232),  # Tables 3, 9
        "forward_synthesis": _smiles(52.7, 53.9, 70.6, 88.6, 82.3, 79.7, 99.8),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(25.3, 39.4, 45.4, 80.9, 71.9, 67.0, 99.8),  # Table 11 (and Table 3)
        **_pp((81.7, 0.000, 69.0), (0.0, 0.000, 93.1), (0.0, 0.000, 96.7), (79.9, 0.418, 67.9)),  # Table 13
    },
    "LlaSMol-Code Llama": {
        "name_conversion-i2f": _topk(79.2, 89.1),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(49.9, 60.1, 63.8, 93.1, 80.9, 80.0, 99.3),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(91.5, 96.0),  # Table 6
        "name_conversion-s2i": _topk(15.5, 26.2, 30.5),  # Table 7
        "molecule_generation": _smiles(6.5, 11.8, 14.2, 74.0, 55.9, 46.6, 99.8),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.366, 0.322, 0.226),  # Tables 3, 9
        "forward_synthesis": _smiles(52.3, 65.6, 69.3, 88.4, 82.1, 79.4, 99.8),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(25.7, 40.0, 45.7, 80.7, 71.7, 66.7, 100.0),  # Table 11 (and Table 3)
        **_pp((81.6, 0.042, 69.0), (0.0, 0.000, 93.1), (0.0, 0.000, 96.7), (79.1, 0.409, 69.9)),  # Table 13
    },
    # ------------------------------------------------------------------ GPT-4 (500 test samples, App. A.2.1)
    "GPT-4": {  # the main tables' row (0-shot, Section 5.2)
        "name_conversion-i2f": _topk(21.8),  # Table 2
        "name_conversion-i2s": _main(3.6, None, 84.2),  # Table 2 (EM, validity)
        "molecule_captioning": _caption(0.198),  # Table 3
        "molecule_generation": _main(3.4, 43.1, 43.1),  # Table 3
        "forward_synthesis": _main(1.1, 39.0, 92.0),  # Table 3
        "retrosynthesis": _main(1.2, 43.7, 81.0),  # Table 3
    },
    "GPT-4 (0-shot)": {
        "name_conversion-i2f": _topk(21.8, 35.6),  # Table 4
        "name_conversion-i2s": _smiles(3.6, 4.3, 5.2, 77.2, 51.2, 49.2, 84.2),  # Table 5
        "name_conversion-s2f": _topk(16.4, 28.8),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(2.8, 3.4, 4.0, 75.8, 55.8, 46.5, 93.0),  # Table 8
        "molecule_captioning": _caption(None, 0.107, 0.027),  # Table 9
        "forward_synthesis": _smiles(2.0, 2.4, 2.6, 60.7, 49.9, 41.1, 88.2),  # Table 10
        "retrosynthesis": _smiles(0.0, 0.2, 0.4, 60.9, 36.8, 35.2, 48.8),  # Table 11
        **_pp((69.8, 0.300, 64.0), (16.5, 0.125, 36.8), (9.2, 0.056, 56.6), (59.9, 0.169, 56.6)),  # Table 13
    },
    "GPT-4 (1-shot)": {
        "name_conversion-i2f": _topk(22.2, 36.2),  # Table 4
        "name_conversion-i2s": _smiles(3.3, 5.7, 6.9, 76.5, 49.6, 48.1, 85.8),  # Table 5
        "name_conversion-s2f": _topk(16.0, 26.0),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(4.9, 6.2, 7.9, 74.0, 52.9, 42.8, 81.8),  # Table 8
        "molecule_captioning": _caption(None, 0.166, 0.061),  # Table 9
        "forward_synthesis": _smiles(1.1, 2.2, 2.6, 61.4, 49.6, 41.2, 90.8),  # Table 10
        "retrosynthesis": _smiles(0.3, 0.8, 1.4, 66.6, 42.5, 40.9, 79.6),  # Table 11
        **_pp((70.5, 0.378, 66.0), (15.7, 0.131, 25.7), (9.6, 0.087, 39.4), (45.0, -0.084, 43.2)),  # Table 13
    },
    "GPT-4 (3-shot)": {
        "name_conversion-i2f": _topk(20.6, 34.6),  # Table 4
        "name_conversion-i2s": _smiles(3.6, 5.9, 6.9, 76.5, 48.8, 46.9, 84.4),  # Table 5
        "name_conversion-s2f": _topk(13.4, 21.6),  # Table 6
        "name_conversion-s2i": _topk(0.2, 0.2, 0.2),  # Table 7
        "molecule_generation": _smiles(5.9, 8.2, 8.9, 74.8, 53.5, 43.3, 85.2),  # Table 8
        "molecule_captioning": _caption(None, 0.202, 0.092),  # Table 9
        "forward_synthesis": _smiles(0.2, 2.2, 2.6, 62.2, 51.5, 42.9, 91.8),  # Table 10
        "retrosynthesis": _smiles(0.5, 1.2, 1.6, 68.2, 45.6, 42.2, 87.8),  # Table 11
        **_pp((63.5, 0.344, 60.9), (17.9, 0.175, 36.1), (8.5, 0.040, 48.0), (40.2, -0.143, 39.8)),  # Table 13
    },
    "GPT-4 (5-shot)": {
        "name_conversion-i2f": _topk(21.2, 35.0),  # Table 4
        "name_conversion-i2s": _smiles(2.4, 4.7, 6.1, 75.6, 47.5, 46.2, 84.8),  # Table 5
        "name_conversion-s2f": _topk(12.8, 23.2),  # Table 6
        "name_conversion-s2i": _topk(0.2, 0.2, 0.2),  # Table 7
        "molecule_generation": _smiles(4.0, 5.9, 7.1, 73.6, 52.8, 43.1, 85.2),  # Table 8
        "molecule_captioning": _caption(None, 0.214, 0.103),  # Table 9
        "forward_synthesis": _smiles(1.3, 2.0, 3.0, 63.4, 52.2, 44.3, 93.6),  # Table 10
        "retrosynthesis": _smiles(0.2, 0.8, 1.2, 68.3, 46.0, 43.1, 84.4),  # Table 11
        **_pp((59.1, 0.319, 57.9), (11.1, -0.047, 33.3), (9.1, 0.052, 55.8), (55.4, 0.022, 50.4)),  # Table 13
    },
    # ------------------------------------------------------------------ LLMs not tuned on SMolInstruct
    "Galactica": {
        "name_conversion-i2f": _topk(24.7, 28.1),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(9.7, 11.1, 12.5, 81.5, 58.1, 53.4, 95.6),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(8.8, 9.0),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(0.0, 0.0, 0.0, 22.7, 11.8, 11.6, 94.7),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.050, 0.018, 0.002),  # Tables 3, 9
        # Validity left out: Table 3 prints 91.3, Table 10 84.2.
        "forward_synthesis": _smiles(0.0, 0.0, 0.0, 40.2, 33.2, 25.8, None),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(0.0, 0.0, 0.0, 48.9, 38.3, 34.6, 93.0),  # Table 11 (and Table 3)
        **_pp((81.7, 0.000, 69.0), (0.0, -0.023, 92.4), (0.0, 0.000, 96.7), (70.9, 0.364, 68.1)),  # Table 13
    },
    "Llama 2": {
        "name_conversion-i2f": _topk(0.9, 1.4),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(0.0, 0.0, 0.0, 29.5, 18.8, 11.3, 18.1),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(0.3, 0.7),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(0.0, 0.0, 0.0, 18.3, 11.8, 4.8, 93.6),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.150, 0.110, 0.047),  # Tables 3, 9
        "forward_synthesis": _smiles(0.0, 0.0, 0.0, 33.5, 24.4, 13.7, 97.7),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(0.0, 0.0, 0.0, 46.5, 35.0, 27.5, 87.7),  # Table 11 (and Table 3)
        **_pp((72.0, -0.043, 58.9), (15.2, 0.070, 45.1), (1.4, -0.020, 93.3), (71.2, 0.177, 61.9)),  # Table 13
    },
    "Code Llama": {
        "name_conversion-i2f": _topk(0.4, 1.1),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(0.0, 0.0, 0.0, 30.7, 20.0, 12.0, 81.0),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(0.1, 0.6),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(0.0, 0.0, 0.0, 26.5, 15.1, 8.5, 95.2),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.143, 0.106, 0.052),  # Tables 3, 9
        "forward_synthesis": _smiles(0.0, 0.0, 0.0, 35.4, 26.5, 15.8, 99.6),  # Table 10 (and Table 3)
        # Top-3 0.1 above top-5 0.0: as printed.
        "retrosynthesis": _smiles(0.0, 0.1, 0.0, 44.7, 32.1, 25.3, 97.1),  # Table 11 (and Table 3)
        **_pp((70.1, 0.043, 58.9), (0.0, -0.079, 85.4), (4.5, 0.005, 91.8), (69.9, 0.140, 60.2)),  # Table 13
    },
    "Mistral": {
        "name_conversion-i2f": _topk(0.2, 3.1),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(0.0, 0.0, 0.0, 33.6, 21.3, 11.3, 40.3),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(0.5, 1.2),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(0.0, 0.1, 0.1, 32.2, 18.4, 9.0, 35.9),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.193, 0.146, 0.068),  # Tables 3, 9
        # Validity left out: Table 3 prints 99.4, Table 10 96.0.
        "forward_synthesis": _smiles(0.0, 0.0, 0.0, 39.0, 31.0, 19.8, None),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(0.0, 0.0, 0.0, 44.6, 32.0, 24.2, 98.0),  # Table 11 (and Table 3)
        **_pp((33.9, 0.046, 40.6), (12.9, -0.003, 15.3), (6.2, -0.016, 7.1), (36.0, -0.202, 38.1)),  # Table 13
    },
    "Molinst": {
        "name_conversion-i2f": _topk(0.0, 0.1),  # Table 4 (and Table 2)
        "name_conversion-i2s": _smiles(0.0, 0.0, 0.0, 43.9, 25.1, 18.4, 96.2),  # Table 5 (and Table 2)
        "name_conversion-s2f": _topk(0.0, 0.0),  # Table 6
        "name_conversion-s2i": _topk(0.0, 0.0, 0.0),  # Table 7
        "molecule_generation": _smiles(6.0, 11.6, 13.4, 69.5, 53.5, 43.6, 84.8),  # Table 8 (and Table 3)
        "molecule_captioning": _caption(0.124, 0.028, 0.020),  # Tables 3, 9
        "forward_synthesis": _smiles(2.1, 3.3, 3.7, 51.1, 36.7, 31.6, 99.8),  # Table 10 (and Table 3)
        "retrosynthesis": _smiles(5.7, 8.3, 9.5, 69.6, 53.7, 48.0, 97.8),  # Table 11 (and Table 3)
        **_pp((86.0, 0.000, 60.9), (15.9, 0.000, 6.3), (6.0, -0.001, 4.4), (75.3, 0.043, 52.4)),  # Table 13
    },
    # ------------------------------------------------------------------ task-specific systems ("SoTA")
    "STOUT+RDKit": {
        "name_conversion-i2f": _topk(97.9),  # Table 4 (and Table 2's SoTA row); top-3 "-"
    },
    "STOUT": {
        # Top-3/top-5 "-"; Table 2's SoTA row: EM 73.5, validity 99.4.
        "name_conversion-i2s": _smiles(73.5, None, None, 99.9, 99.8, 99.5, 99.4),  # Table 5
        "name_conversion-s2i": _topk(56.5),  # Table 7; top-3/top-5 "-"
    },
    "RDKit": {
        "name_conversion-s2f": _topk(100.0),  # Table 6 (and Table 2's SoTA row); top-3 "-"
    },
    "Uni-Mol": {
        **_pp((89.5, 0.651, 85.3), (42.1, 0.381, 92.4), (32.8, 0.361, 97.0), (76.5, 0.366, 70.0)),  # Table 13
    },
    "MolT5": {
        "molecule_generation": _smiles(31.6, 38.7, 41.3, 87.8, 80.1, 73.2, 95.3),  # Table 8 (Table 3's SoTA)
        "molecule_captioning": _caption(0.515, 0.461, 0.366),  # Table 3's SoTA row (METEOR), Table 9
    },
    "Molecular Transformer": {
        "forward_synthesis": _smiles(78.5, 85.5, 87.1, 95.5, 93.0, 91.4, 99.5),  # Table 10
        "retrosynthesis": _smiles(47.0, 61.7, 66.4, 87.0, 81.5, 77.5, 99.7),  # Table 11 (Table 3's SoTA)
    },
    "RSMILES": {
        "forward_synthesis": _smiles(78.7, 87.9, 89.7, 95.7, 93.7, 92.2, 100.0),  # Table 10 (Table 3's SoTA)
        "retrosynthesis": _smiles(46.2, 63.9, 69.9, 86.5, 80.9, 76.7, 100.0),  # Table 11
    },
}


# --------------------------------------------------------------------------- where each system's numbers come from

KINDS: tuple[str, ...] = ("LlaSMol", "API LLM", "base LLM", "instruction-tuned LLM", "task-specific")


@dataclass(frozen=True)
class PaperSource:
    """What the paper says about one system of `PAPER_RESULTS`.

    `tables`: the paper's tables its numbers here come from.  `test_set`: the numbers are on
    SMolInstruct's test split (all of the paper's result tables are); `full_test_set`: on all of it,
    or (False) on the part `evaluated_on` names.  `base`: this package's `model=` config of the same
    base LLM, where there is one.  `caveat`: what the paper says limits the comparison."""

    kind: str
    tables: tuple[int, ...]
    setting: str
    evaluated_on: str = "the SMolInstruct test set"
    where: str = "test set"  # `evaluated_on` in a few words, for `label`
    full_test_set: bool = True
    test_set: bool = True
    base: Optional[str] = None
    caveat: str = ""
    # An untuned LLM's row: how it was asked, as `evaluate`'s prompting names it (style, in-context examples).
    protocol: Optional[tuple[str, int]] = None

    @property
    def table_label(self) -> str:
        """``Tables 2-11, 13`` style."""
        runs: list[list[int]] = []
        for t in sorted(self.tables):
            if runs and t == runs[-1][-1] + 1:
                runs[-1].append(t)
            else:
                runs.append([t])
        parts = [f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs]
        return ("Table " if len(self.tables) == 1 else "Tables ") + ", ".join(parts)

    @property
    def label(self) -> str:
        """One cell for a table: the source tables and what the numbers were measured on."""
        return f"{self.table_label}; {self.where}"


_MAIN_AND_APPENDIX = (2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13)
_APPENDIX = (4, 5, 6, 7, 8, 9, 10, 11, 13)
_GPT4_SUBSET = "500 samples from the SMolInstruct test set"
_GPT4 = ("gpt-4-0613 through OpenAI's API, with a query template per task (after Guo et al. 2023); "
         "answers taken as output (App. A.2.1)")
_LORA = "LoRA (r = alpha = 16) on all attention and FFN projections, 3 epochs on SMolInstruct; beam search (App. A.1)"
_ONE_SHOT = ("1-shot, with the GPT-4 query templates; answers extracted from free-form output by "
             "heuristic rules (App. A.2.3)")


def _shots(n: int) -> PaperSource:
    return PaperSource(
        "API LLM", _APPENDIX, f"{_GPT4}; {n}-shot, in-context examples drawn at random from the training split",
        evaluated_on=_GPT4_SUBSET, where="500 test samples", full_test_set=False,
        caveat="The paper states the 500-sample subset for its GPT-4 evaluation as a whole (App. A.2.1).",
    )


PAPER_SOURCES: dict[str, PaperSource] = {
    "LlaSMol-Mistral": PaperSource("LlaSMol", _MAIN_AND_APPENDIX, f"Mistral 7B, {_LORA}", base="mistral"),
    "LlaSMol-Llama 2": PaperSource("LlaSMol", _MAIN_AND_APPENDIX, f"Llama 2 7B, {_LORA}", base="llama2"),
    "LlaSMol-Galactica": PaperSource("LlaSMol", _MAIN_AND_APPENDIX, f"Galactica 6.7B, {_LORA}", base="galactica"),
    "LlaSMol-Code Llama": PaperSource("LlaSMol", _MAIN_AND_APPENDIX, f"Code Llama 7B, {_LORA}", base="codellama"),
    "GPT-4": PaperSource(
        "API LLM", (2, 3), f"{_GPT4}; 0-shot, the setting the main tables report (Section 5.2)",
        evaluated_on=_GPT4_SUBSET, where="500 test samples", full_test_set=False,
        caveat="Table 3's GPT-4 row differs from the 0-shot rows of Tables 8, 10 and 11 and the paper does "
               "not say why; the appendix rows are under 'GPT-4 (0-shot)'.",
    ),
    "GPT-4 (0-shot)": _shots(0),
    "GPT-4 (1-shot)": _shots(1),
    "GPT-4 (3-shot)": _shots(3),
    "GPT-4 (5-shot)": _shots(5),
    "Galactica": PaperSource(
        "base LLM", _MAIN_AND_APPENDIX,
        "Galactica 6.7B, 0-shot with Galactica's own query conventions; answers extracted by heuristic rules "
        "(App. A.2.2)", base="galactica", protocol=("galactica", 0),
        caveat="FS validity left out: Table 3 prints 91.3 %, Table 10 84.2 %.",
    ),
    "Llama 2": PaperSource("base LLM", _MAIN_AND_APPENDIX, f"Llama 2 7B, {_ONE_SHOT}", base="llama2",
                           protocol=("icl", 1)),
    "Code Llama": PaperSource("base LLM", _MAIN_AND_APPENDIX, f"Code Llama 7B, {_ONE_SHOT}", base="codellama",
                              protocol=("icl", 1)),
    "Mistral": PaperSource(
        "base LLM", _MAIN_AND_APPENDIX, f"Mistral 7B, {_ONE_SHOT}", base="mistral", protocol=("icl", 1),
        caveat="FS validity left out: Table 3 prints 99.4 %, Table 10 96.0 %.",
    ),
    "Molinst": PaperSource(
        "instruction-tuned LLM", _MAIN_AND_APPENDIX,
        "Llama 2 7B fine-tuned on Mol-Instructions (Fang et al. 2023), 0-shot with Mol-Instructions' query "
        "templates on MC, MG, FS and RS and templates in their style elsewhere; answers extracted (App. A.2.4)",
        protocol=("molinst", 0),
        caveat="Trained on MC, MG, FS and RS only; SMolInstruct's test set holds none of Mol-Instructions' "
               "training examples of those tasks (Section 4.2).",
    ),
    "STOUT": PaperSource(
        "task-specific", (2, 5, 7), "STOUT's released checkpoint, not retrained (App. A.3.1)",
        caveat="It may have seen some SMolInstruct test samples during training, so its results may be higher "
               "than its real performance (App. A.3.1).",
    ),
    "STOUT+RDKit": PaperSource(
        "task-specific", (2, 4),
        "STOUT for IUPAC name to SMILES, then the RDKit program for SMILES to formula (App. A.3.3)",
        caveat="Built on STOUT's released checkpoint; see STOUT's caveat.",
    ),
    "RDKit": PaperSource(
        "task-specific", (2, 6), "a program that parses the SMILES with RDKit and counts atoms (App. A.3.2)",
        caveat="A fixed algorithm, not a learned model.",
    ),
    "Uni-Mol": PaperSource(
        "task-specific", (13,),
        "fine-tuned on SMolInstruct's PP data from its pretrained weights with the authors' code; SIDER as "
        "20-target classification (App. A.3.4)",
        caveat="The data split differs from the Uni-Mol paper's, so the numbers may not match it (App. A.3.4).",
    ),
    "MolT5": PaperSource(
        "task-specific", (3, 8, 9),
        "the released MolT5-large checkpoints, not retrained; beam search with 5 beams, 1 caption and "
        "5 molecules per sample (App. A.3.5)",
        caveat="The test data differs from the MolT5 paper's, so the numbers may differ; it does not overlap "
               "MolT5's training set (App. A.3.5, Section 5.2).",
    ),
    "Molecular Transformer": PaperSource(
        "task-specific", (3, 10, 11),
        "retrained on SMolInstruct for FS and RS separately, canonical SMILES without augmentation, 10 beams "
        "(App. A.3.7)",
    ),
    "RSMILES": PaperSource(
        "task-specific", (3, 10, 11),
        "retrained on SMolInstruct for FS and RS separately with 5x aligned augmentation, top-10 aggregated "
        "from 50 predictions (App. A.3.6)",
        caveat="Its FS results are lower than its paper's on USPTO-MIT: SMolInstruct's FS includes "
               "stereochemistry (App. A.3.6).",
    ),
}

# Every system, the LlaSMol series first.
PAPER_MODELS: tuple[str, ...] = tuple(PAPER_RESULTS)
PAPER_LLASMOL_MODELS: tuple[str, ...] = tuple(m for m in PAPER_MODELS if PAPER_SOURCES[m].kind == "LlaSMol")

# The paper's model trained on each of our bases (`model=`), for putting a run's test numbers beside it.
PAPER_MODEL_OF_BASE: dict[str, str] = {
    "mistral": "LlaSMol-Mistral",
    "llama2": "LlaSMol-Llama 2",
    "galactica": "LlaSMol-Galactica",
    "codellama": "LlaSMol-Code Llama",
}

# Why a report's paper column has '-' where the paper does print a number: the cells left out above, by task.
NOT_TRANSCRIBED: dict[str, str] = {
    task: "ESOL and Lipo RMSE are printed in the paper (Table 12) but only the digit before the decimal point "
          "survives the text its numbers were transcribed from, so they are left out rather than guessed"
    for task in ("property_prediction-esol", "property_prediction-lipo")
}

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


def protocol_row(model: str, ckpt: Optional[str], style: str, shots: int) -> tuple[str, Optional[str]]:
    """The row name of a base asked by a prompting protocol (``Code Llama``, ``Molinst``, ``Mistral + <adapter>``)
    and the paper's row it stands beside: only one asked as the paper asked it (Mistral 3-shot has none)."""
    if style == "molinst":
        name = "Molinst"
    else:  # the paper's name of the base where it has a base row ("Code Llama"), else the model's name
        name = next((n for n, s in PAPER_SOURCES.items() if s.kind == "base LLM" and s.base == model), model)
        if ckpt and ckpt.lower() != "none":
            name = f"{name} + {Path(ckpt).name}"
    source = PAPER_SOURCES.get(name)
    return name, (name if source is not None and source.protocol == (style, shots) else None)
