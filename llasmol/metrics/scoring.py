"""Per-sample additive statistics and the metrics made from their sums (LlaSMol, Appendix A.4).

Every metric here is a function of *sums* of per-sample statistics, so statistics can be summed
across batches and processes (DDP) and still give exactly the corpus-level metric.

- `STATS[task]`: the names of the task's statistics, in a fixed order.
- `sample_stats(task, predictions, golds)`: statistics of one sample; `predictions` are its raw
  generated texts, best first (answers are extracted inside); `golds` are its gold answers
  (`record_golds`: for the tasks of `POOLED_TASKS`, those of *all* samples with the same input,
  as a prediction is right when it matches any of them; for property tasks its own label).
- `finalize(task, stats)`: metric values from summed statistics.
- `score_records(records)`: the above for a whole file of records.

Metric values are fractions in [0, 1] (not percentages); a fraction whose denominator is 0
(e.g. validity when nothing was answered) is 0.0; RMSE with no valid prediction is NaN.  Every
task reports ``num_samples`` and ``num_no_answer`` (top-1 prediction with no extractable answer).

Per task family (`extract_answer` defines "answer"):

- SMILES tasks (forward_synthesis, retrosynthesis, molecule_generation, name_conversion-i2s):
  ``exact_match`` = share of all samples whose top-1 answer is the same molecule set as a gold
  (`llasmol.metrics.molecules`); ``top{k}_exact_match`` for k in 1, 3, 5, 10 = share of all
  samples with a match among the first k predictions, reported when at least one sample had k
  or more predictions (a sample with fewer uses all it has); ``validity`` = valid top-1 answers
  / top-1 answers; ``fts`` (Morgan), ``fts_maccs``, ``fts_rdk`` = mean over valid top-1 answers
  of the Tanimoto similarity to the most similar gold, per fingerprint (a gold that does not
  parse counts as similarity 0); also ``num_valid``.
- Formula tasks (name_conversion-i2f, -s2f): ``exact_match`` and ``top{k}_exact_match`` when
  the atom counts and charge are equal (`llasmol.metrics.formula`); ``num_invalid`` = answers
  that do not parse as a formula.
- name_conversion-s2i: ``exact_match`` and ``top{k}_exact_match`` when the sets of non-empty
  ``';'``-separated parts, each stripped, are equal (case and inner spacing matter).
- esol, lipo: ``rmse`` over top-1 answers that parse as finite numbers (Python ``float``,
  Unicode minus accepted; ``nan``/``inf``/``1e999`` do not parse), each against the closest
  gold (normally there is one); ``num_valid`` + ``num_invalid`` + ``num_no_answer`` =
  ``num_samples``.
- bbbp, clintox, hiv, sider: the top-1 answer is ``yes``/``no`` case-insensitively, after
  stripping whitespace and one trailing period; ``accuracy`` = correct / *all* samples (a
  missing or non-yes/no answer is wrong); ``f1`` (positive class Yes) and ``mcc`` from the
  confusion counts ``tp fp tn fn`` of the yes/no answers only, as the paper's code computes
  them, so ``tp + fp + tn + fn + num_invalid + num_no_answer = num_samples`` and ``accuracy =
  (tp + tn) / num_samples``; ``num_invalid`` = answers other than yes/no.  With a division by
  zero, f1 and mcc are 0.0 (scikit-learn's convention).
- molecule_captioning: ``meteor``, ``bleu2``, ``bleu4``, ``rouge1``, ``rouge2``, ``rougeL``
  over the samples with a non-empty response (``num_scored``; empty ones are left out, as the
  paper's code leaves them out, and counted in ``num_no_answer``) and ``tokenizer_scibert``
  (1.0 when SciBERT tokenized the text, 0.0 for the fallback), see `llasmol.metrics.text`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable, Sequence

from llasmol.metrics.extract import ANSWER_TAG, extract_answer
from llasmol.metrics.formula import parse_formula
from llasmol.metrics.molecules import FINGERPRINTS, molecule_keys, parse_gold_molecule, tanimoto

TOPK: tuple[int, ...] = (1, 3, 5, 10)

SMILES_TASKS = ("forward_synthesis", "retrosynthesis", "molecule_generation", "name_conversion-i2s")
FORMULA_TASKS = ("name_conversion-i2f", "name_conversion-s2f")
IUPAC_TASKS = ("name_conversion-s2i",)
NUMBER_TASKS = ("property_prediction-esol", "property_prediction-lipo")
BOOLEAN_TASKS = (
    "property_prediction-bbbp",
    "property_prediction-clintox",
    "property_prediction-hiv",
    "property_prediction-sider",
)
CAPTION_TASKS = ("molecule_captioning",)

# Tasks whose input can have several right answers (reactant sets of one product, names of one
# molecule, ...): a sample's golds are those of every sample with the same input and target, as the
# paper's scorer reads them.  Property tasks are scored against each sample's own label; pooling
# them would let one SIDER answer be right for another side effect of the same molecule.
POOLED_TASKS = SMILES_TASKS + FORMULA_TASKS + IUPAC_TASKS + CAPTION_TASKS

_TOPK_STATS = tuple(f"hit_top{k}" for k in TOPK) + tuple(f"has_top{k}" for k in TOPK)
_COMMON = ("num_samples", "num_no_answer")
_SMILES_STATS = _COMMON + ("num_valid",) + _TOPK_STATS + ("fts_morgan_sum", "fts_maccs_sum", "fts_rdk_sum")
_FORMULA_STATS = _COMMON + ("num_invalid",) + _TOPK_STATS
_IUPAC_STATS = _COMMON + _TOPK_STATS
_NUMBER_STATS = _COMMON + ("num_valid", "num_invalid", "sq_err_sum")
_BOOLEAN_STATS = _COMMON + ("num_invalid", "tp", "fp", "tn", "fn")
_CAPTION_STATS = (
    _COMMON
    + ("num_scored", "num_scibert", "meteor_sum", "rouge1_sum", "rouge2_sum", "rougeL_sum")
    + tuple(f"bleu_match{n}" for n in (1, 2, 3, 4))
    + tuple(f"bleu_total{n}" for n in (1, 2, 3, 4))
    + ("bleu_hyp_len", "bleu_ref_len")
)

def _check_task(task: str) -> None:
    if task not in STATS:
        raise ValueError(f"unknown task {task!r}: choose from {', '.join(STATS)}")


def as_list(value) -> list:
    """None -> [], a string -> [it], any other iterable -> a list (golds and predictions come in all three)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


# --------------------------------------------------------------------------- matching rules


def _iupac_key(text: str | None) -> frozenset[str] | None:
    if text is None:
        return None
    parts = frozenset(part.strip() for part in text.split(";")) - {""}
    return parts or None


def _parse_number(text: str | None) -> float | None:
    if text is None or len(text) > 1000:
        return None
    try:
        value = float(text.strip().replace("\u2212", "-"))
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _parse_boolean(text: str | None) -> str | None:
    if text is None:
        return None
    word = text.strip()
    if word.endswith("."):
        word = word[:-1].strip()
    word = word.lower()
    return {"yes": "Yes", "no": "No"}.get(word)


# --------------------------------------------------------------------------- per family


def _topk_stats(hits: Sequence[bool], stats: dict[str, float]) -> None:
    for k in TOPK:
        stats[f"hit_top{k}"] = 1.0 if any(hits[:k]) else 0.0
        stats[f"has_top{k}"] = 1.0 if len(hits) >= k else 0.0


def _smiles_stats(answers: list[str | None], golds: list[str], stats: dict[str, float]) -> None:
    gold_mols = [parse_gold_molecule(g) for g in golds if isinstance(g, str)]
    gold_keys = {m.keys for m in gold_mols if m is not None}
    # Parsed through the caches: answers repeat across beams and samples, and right ones equal a gold.
    top1 = parse_gold_molecule(answers[0]) if answers and isinstance(answers[0], str) else None
    hits = []
    for i, answer in enumerate(answers[: max(TOPK)]):
        keys = (top1.keys if top1 is not None else None) if i == 0 else molecule_keys(answer)
        hits.append(keys is not None and keys in gold_keys)
    _topk_stats(hits, stats)
    if top1 is not None:
        stats["num_valid"] = 1.0
        for name in FINGERPRINTS:
            best = 0.0
            for gold in gold_mols:
                if gold is not None:
                    best = max(best, tanimoto(top1.fingerprints[name], gold.fingerprints[name]))
            stats[f"fts_{name}_sum"] = best


def _formula_stats(answers: list[str | None], golds: list[str], stats: dict[str, float]) -> None:
    gold_keys = {parse_formula(g) for g in golds} - {None}
    parsed = [parse_formula(a) for a in answers[: max(TOPK)]]
    _topk_stats([p is not None and p in gold_keys for p in parsed], stats)
    if answers and answers[0] is not None and parsed[0] is None:
        stats["num_invalid"] = 1.0


def _iupac_stats(answers: list[str | None], golds: list[str], stats: dict[str, float]) -> None:
    gold_keys = {_iupac_key(g) for g in golds if isinstance(g, str)} - {None}
    _topk_stats([(key := _iupac_key(a)) is not None and key in gold_keys for a in answers[: max(TOPK)]], stats)


def _number_stats(answers: list[str | None], golds: list[str], stats: dict[str, float]) -> None:
    if not answers or answers[0] is None:
        return
    value = _parse_number(answers[0])
    gold_values = [v for v in (_parse_number(g) for g in golds if isinstance(g, str)) if v is not None]
    if value is None or not gold_values:
        stats["num_invalid"] = 1.0
        return
    stats["num_valid"] = 1.0
    stats["sq_err_sum"] = min((value - gold) ** 2 for gold in gold_values)


def _boolean_stats(answers: list[str | None], golds: list[str], stats: dict[str, float]) -> None:
    gold_labels = {_parse_boolean(g) for g in golds if isinstance(g, str)} - {None}
    predicted = _parse_boolean(answers[0]) if answers else None
    if predicted is None:
        if answers and answers[0] is not None:
            stats["num_invalid"] = 1.0
        return  # wrong for accuracy, outside the confusion counts (as in the paper's code)
    if not gold_labels:
        return  # a sample without a yes/no gold cannot be right
    key = ("t" if predicted in gold_labels else "f") + ("p" if predicted == "Yes" else "n")
    stats[key] = 1.0


def _caption_stats(answers: list[str | None], golds: list[str], stats: dict[str, float]) -> None:
    from llasmol.metrics.text import caption_stats  # NLTK/WordNet only when captioning is scored

    stats.update(caption_stats(answers[0] if answers else None, golds))


# Each family of tasks: its tasks, the names of its statistics, and the function that fills them.
_FAMILIES = (
    (SMILES_TASKS, _SMILES_STATS, _smiles_stats),
    (FORMULA_TASKS, _FORMULA_STATS, _formula_stats),
    (IUPAC_TASKS, _IUPAC_STATS, _iupac_stats),
    (NUMBER_TASKS, _NUMBER_STATS, _number_stats),
    (BOOLEAN_TASKS, _BOOLEAN_STATS, _boolean_stats),
    (CAPTION_TASKS, _CAPTION_STATS, _caption_stats),
)
STATS: dict[str, tuple[str, ...]] = {task: stats for tasks, stats, _ in _FAMILIES for task in tasks}
_FAMILY = {task: fn for tasks, _, fn in _FAMILIES for task in tasks}
assert set(STATS) == set(ANSWER_TAG)


# --------------------------------------------------------------------------- public API


def sample_stats(task: str, predictions: list[str], golds: list[str]) -> dict[str, float]:
    """Additive statistics (every name in ``STATS[task]``) of one sample.

    `predictions`: the raw generated texts of this sample, best first.  `golds`: the plain gold
    answers of all samples sharing this sample's input.  Model output never raises.
    """
    _check_task(task)
    answers = [extract_answer(task, p) for p in as_list(predictions)]
    golds = [g.strip() for g in as_list(golds) if isinstance(g, str)]
    stats = dict.fromkeys(STATS[task], 0.0)
    stats["num_samples"] = 1.0
    if not answers or answers[0] is None:
        stats["num_no_answer"] = 1.0
    _FAMILY[task](answers, golds, stats)
    return stats


def add_stats(total: dict[str, float], stats: dict[str, float]) -> dict[str, float]:
    """Add `stats` into `total` in place and return it."""
    for key, value in stats.items():
        total[key] = total.get(key, 0.0) + float(value)
    return total


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _topk_metrics(stats: dict[str, float], n: float, out: dict[str, float]) -> None:
    out["exact_match"] = _ratio(stats["hit_top1"], n)
    for k in TOPK:
        if k == 1 or stats[f"has_top{k}"] > 0:
            out[f"top{k}_exact_match"] = _ratio(stats[f"hit_top{k}"], n)


def finalize(task: str, stats: dict[str, float]) -> dict[str, float]:
    """Metric values (floats) of `task` from summed `sample_stats`."""
    _check_task(task)
    stats = {name: float(stats.get(name, 0.0)) for name in STATS[task]}
    n = stats["num_samples"]
    out = {"num_samples": n, "num_no_answer": stats["num_no_answer"]}
    if task in SMILES_TASKS:
        _topk_metrics(stats, n, out)
        valid = stats["num_valid"]
        out["validity"] = _ratio(valid, n - stats["num_no_answer"])
        out["num_valid"] = valid
        out["fts"] = _ratio(stats["fts_morgan_sum"], valid)
        out["fts_maccs"] = _ratio(stats["fts_maccs_sum"], valid)
        out["fts_rdk"] = _ratio(stats["fts_rdk_sum"], valid)
    elif task in FORMULA_TASKS:
        _topk_metrics(stats, n, out)
        out["num_invalid"] = stats["num_invalid"]
    elif task in IUPAC_TASKS:
        _topk_metrics(stats, n, out)
    elif task in NUMBER_TASKS:
        valid = stats["num_valid"]
        out["rmse"] = math.sqrt(stats["sq_err_sum"] / valid) if valid > 0 else math.nan
        out["num_valid"] = valid
        out["num_invalid"] = stats["num_invalid"]
    elif task in BOOLEAN_TASKS:
        tp, fp, tn, fn = (stats[k] for k in ("tp", "fp", "tn", "fn"))
        out["accuracy"] = _ratio(tp + tn, n)
        out["f1"] = _ratio(2 * tp, 2 * tp + fp + fn)
        den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        out["mcc"] = (tp * tn - fp * fn) / den if den > 0 else 0.0
        out["num_invalid"] = stats["num_invalid"]
        for key in ("tp", "fp", "tn", "fn"):
            out[key] = stats[key]
    else:  # captioning
        from llasmol.metrics.text import bleu_from_stats

        scored = stats["num_scored"]
        out["meteor"] = _ratio(stats["meteor_sum"], scored)
        out["bleu2"] = bleu_from_stats(stats, 2)
        out["bleu4"] = bleu_from_stats(stats, 4)
        for key in ("rouge1", "rouge2", "rougeL"):
            out[key] = _ratio(stats[f"{key}_sum"], scored)
        out["num_scored"] = scored
        out["tokenizer_scibert"] = _ratio(stats["num_scibert"], n)
    return out


def gold_key(record: dict) -> tuple:
    """What makes two samples "the same input": task, core input and (SIDER) target."""
    return (record["task"], record.get("raw_input", record.get("input")), record.get("target"))


def record_golds(records: Iterable[dict]) -> list[list[str]]:
    """Each record's gold answers, in record order: for `POOLED_TASKS` the golds of all records
    with its `gold_key` (first-seen order, no repeats), for the property tasks its own."""
    records = list(records)
    pooled: dict[tuple, list[str]] = defaultdict(list)
    for record in records:
        if record["task"] in POOLED_TASKS:
            bucket = pooled[gold_key(record)]
            bucket.extend(g for g in as_list(record["gold"]) if g not in bucket)
    return [
        pooled[gold_key(r)] if r["task"] in POOLED_TASKS else as_list(r["gold"]) for r in records
    ]


def score_records(records: Iterable[dict]) -> dict[str, dict[str, float]]:
    """Metrics of a whole file: ``{task: {metric: value}}`` for every task in `records`.

    Each record has ``task``, ``input``, ``gold`` (a string or a list of strings) and
    ``predictions`` (raw texts, best first); ``raw_input`` and ``target`` when present.  Golds
    are pooled as `record_golds` says.
    """
    records = list(records)
    totals: dict[str, dict[str, float]] = {}
    for record, golds in zip(records, record_golds(records)):
        task = record["task"]
        stats = sample_stats(task, as_list(record["predictions"]), golds)
        add_stats(totals.setdefault(task, {}), stats)
    return {task: finalize(task, total) for task, total in totals.items()}
