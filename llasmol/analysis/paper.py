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

The numbers, each cell as printed with the tables it comes from, and what the paper says of each system are
data, in `paper_numbers.json` beside this module (read once, at import). Every number is tested against a
second transcription that `scripts/transcribe_paper_tables.py` reads
from the paper's text (tests/data/paper_tables.json, tests/test_paper_transcription.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional


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


_LAYOUTS: dict[str, Callable[..., dict]] = {"smiles": _smiles, "main": _main, "topk": _topk, "caption": _caption,
                                           "pp": _pp}
_NUMBERS = json.loads(Path(__file__).with_name("paper_numbers.json").read_text(encoding="utf-8"))


def _results(cells: dict[str, list]) -> dict[str, dict[str, float]]:
    """One system's numbers as fractions under this package's metric names, from its printed cells (a `pp` cell
    holds the four property-prediction tasks of Table 13)."""
    row: dict[str, dict[str, float]] = {}
    for task, (layout, printed, _tables) in cells.items():
        values = _LAYOUTS[layout](*printed)
        row.update(values if layout == "pp" else {task: values})
    return row


PAPER_RESULTS: dict[str, dict[str, dict[str, float]]] = {
    system: _results(cells) for system, cells in _NUMBERS["results"].items()
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


PAPER_SOURCES: dict[str, PaperSource] = {
    name: PaperSource(**{key: tuple(v) if isinstance(v, list) else v for key, v in fields.items()})
    for name, fields in _NUMBERS["sources"].items()
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
