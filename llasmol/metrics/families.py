"""One object per metric family: its additive statistics, how one sample fills them, the metrics made from
their sums, how a sample is judged for the analysis tables, and which metrics are counts or lower-is-better.

A task's family is in the task table (`llasmol.core.tasks`); `llasmol.metrics.scoring` runs the family of
each sample's task. Adding a family is one class here and one entry in `FAMILIES`.

Definitions (LlaSMol App. A.4, as its scorer computes them); `answers` are the extracted answers of a
sample's predictions, best first (`extract_answer`, or a base model's rule answers as given), `golds` its gold
answers; an answer is none when it is missing or empty (yes/no and captions: empty once stripped), as the
official scorer counts it:

- smiles (FS, RS, MG, NC-I2S): ``exact_match`` = share of all samples whose top-1 answer is the same
  molecule set as a gold (`llasmol.metrics.molecules`); ``top{k}_exact_match`` for k in 1, 3, 5, 10 =
  share of all samples with a match among the first k predictions, reported when at least one sample had
  k or more predictions (a sample with fewer uses all it has); ``validity`` = valid top-1 answers / top-1
  answers; ``fts`` (Morgan), ``fts_maccs``, ``fts_rdk`` = mean over valid top-1 answers of the Tanimoto
  similarity to the most similar gold, per fingerprint (a gold that does not parse counts as 0);
  ``num_valid``; ``num_too_complex`` = top-1 answers RDKit reads but too large, ring-dense or costly to
  fingerprint to score (`molecules.MAX_ATOMS`, `MAX_RING_CLOSURES`, `MAX_SUBGRAPHS`), counted as not valid.
- formula (NC-I2F, NC-S2F): ``exact_match``/``top{k}_exact_match`` when the atom counts and charge are
  equal; ``num_invalid`` = answers that do not parse as a formula. Which formulas parse is the official
  scorer's syntax unless ``scoring.lenient_formulas`` is set (`llasmol.metrics.formula`, the table's `Scoring`).
- iupac (NC-S2I): ``exact_match``/``top{k}_exact_match`` when the sets of non-empty ``';'``-separated
  parts, each stripped, are equal (case and inner spacing matter).
- number (ESOL, Lipo): ``rmse`` over top-1 answers that parse as finite numbers (Python ``float``,
  Unicode minus accepted; ``nan``/``inf``/``1e999`` do not parse), each against the closest gold; every
  finite error counts, and the RMSE of finite errors is finite (squares summed in two scales, `SMALL_ERROR`);
  an answer whose difference from the gold is past float64's range is invalid and counted in
  ``num_overflow``; a sample whose golds are not numbers (``NaN``) is ``num_invalid_gold``, left out of RMSE
  whatever its answer; ``num_valid`` + ``num_invalid`` + ``num_invalid_gold`` + ``num_no_answer`` = ``num_samples``;
  RMSE with no valid answer is NaN.
- boolean (BBBP, ClinTox, HIV, SIDER): the top-1 answer is ``yes``/``no`` case-insensitively, after
  stripping whitespace (``Yes.`` is invalid, as officially; ``scoring.lenient_booleans`` drops one trailing
  period); an answer of whitespace only is no answer; ``accuracy`` = correct / *all* samples (a missing or
  non-yes/no answer is wrong); ``f1`` (positive class Yes) and ``mcc`` from the confusion counts ``tp fp
  tn fn`` of the yes/no answers only, as the paper's code computes them, so ``tp + fp + tn + fn +
  num_invalid + num_no_answer = num_samples``; with a division by zero f1 and mcc are 0.0 (scikit-learn's
  convention); ``num_invalid`` = answers other than yes/no.
- caption (MC): ``meteor``, ``bleu2``, ``bleu4``, ``rouge1``, ``rouge2``, ``rougeL`` over the samples
  with a non-empty response (``num_scored``; empty ones are left out, as the paper's code leaves them
  out) and ``tokenizer_scibert`` (1.0 when SciBERT tokenized the text), see `llasmol.metrics.text`.

Values are fractions in [0, 1]; a fraction whose denominator is 0 is 0.0.
"""

from __future__ import annotations

import functools
import math
from typing import Optional, Sequence

from llasmol.core.errors import UserError
from llasmol.core.tasks import OFFICIAL, Scoring, TaskTable
from llasmol.metrics.formula import formula_key
from llasmol.metrics.molecules import FINGERPRINTS, best_tanimoto, molecule_keys, parse_gold_molecule, too_complex
from llasmol.metrics.text import bleu_from_stats, caption_stats  # loads NLTK/WordNet itself, when captions are scored

TOPK: tuple[int, ...] = (1, 3, 5, 10)

# Every family's statistics start with these; every task reports them.
COMMON_STATS: tuple[str, ...] = ("num_samples", "num_no_answer", "num_skipped")
COMMON_COUNTS = frozenset(COMMON_STATS)
COMMON_LOWER_IS_BETTER = frozenset({"num_no_answer", "num_skipped"})

# Per-sample outcome of the top-1 answer, for the analysis tables (`Family.judge`):
# correct, wrong (well-formed, not right), invalid (does not parse), no_answer, skipped (not generated:
# the prompt was over the limit) and scored (a continuous score only: ESOL/Lipo numbers, captions).
CATEGORIES: tuple[str, ...] = ("correct", "wrong", "invalid", "no_answer", "skipped", "scored")


def ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _difference(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or b is None else a - b


class Family:
    """A metric family; subclasses fill in the statistics and metrics of their tasks."""

    name: str = ""
    stats: tuple[str, ...] = ()  # additive per-sample statistics, after COMMON_STATS
    metric_names: tuple[str, ...] = ()  # what `metrics` may report, in display order
    counts: frozenset[str] = frozenset()  # metrics that count samples (printed as integers)
    lower_is_better: frozenset[str] = frozenset()  # metrics where smaller is better
    score_lower_is_better: bool = False  # how `judge`'s per-sample score reads (an error, or a similarity)

    def __init__(self, scoring: Scoring = OFFICIAL) -> None:
        self.scoring = scoring  # how answers are read: the official scorer's reading unless asked otherwise

    def all_stats(self) -> tuple[str, ...]:
        return COMMON_STATS + self.stats

    def no_answer(self, answer: Optional[str]) -> bool:
        """Whether `answer` counts as none: no text or the empty one (utils/metrics.py: ``item == ''``)."""
        return answer is None or answer == ""

    def fill(self, answers: list[Optional[str]], golds: list[str], stats: dict[str, float]) -> None:
        """Add this sample's statistics to `stats` (already zeroed, `num_*` common ones set)."""
        raise NotImplementedError

    def metrics(self, stats: dict[str, float]) -> dict[str, float]:
        """Metric values from summed statistics (the common counts are added by the caller)."""
        raise NotImplementedError

    def judge(self, stats: dict[str, float]) -> tuple[str, Optional[float]]:
        """Category (`CATEGORIES`) of one answered sample from its own statistics, and a per-sample score
        where one exists."""
        raise NotImplementedError

    def basis(self, metric: str, values: dict) -> Optional[float]:
        """How many samples `metric`'s value stands on, read from the task's metric `values` (its counts are
        among them); None for a count. A share of all samples (exact match, accuracy) stands on them all."""
        if metric in self.counts or metric in COMMON_COUNTS or metric not in self.metric_names:
            return None
        return values.get("num_samples")


def _topk_stats(hits: Sequence[bool], stats: dict[str, float]) -> None:
    for k in TOPK:
        stats[f"hit_top{k}"] = 1.0 if any(hits[:k]) else 0.0
        stats[f"has_top{k}"] = 1.0 if len(hits) >= k else 0.0


def _topk_metrics(stats: dict[str, float]) -> dict[str, float]:
    n = stats["num_samples"]
    out = {"exact_match": ratio(stats["hit_top1"], n)}
    for k in TOPK:
        if k == 1 or stats[f"has_top{k}"] > 0:
            out[f"top{k}_exact_match"] = ratio(stats[f"hit_top{k}"], n)
    return out


_TOPK_STATS = tuple(f"hit_top{k}" for k in TOPK) + tuple(f"has_top{k}" for k in TOPK)


_TOPK_METRICS = ("exact_match",) + tuple(f"top{k}_exact_match" for k in TOPK)


class SmilesFamily(Family):
    name = "smiles"
    stats = ("num_valid", "num_too_complex") + _TOPK_STATS + ("fts_morgan_sum", "fts_maccs_sum", "fts_rdk_sum")
    metric_names = _TOPK_METRICS + ("validity", "fts", "fts_maccs", "fts_rdk", "num_valid", "num_too_complex")
    counts = frozenset({"num_valid", "num_too_complex"})
    lower_is_better = frozenset({"num_too_complex"})

    def fill(self, answers, golds, stats):
        strict = self.scoring.strict_smiles
        gold_mols = [parse_gold_molecule(g, strict) for g in golds]
        gold_keys = {m.keys for m in gold_mols if m is not None}
        # Parsed through the caches: answers repeat across beams and samples, and right ones equal a gold.
        top1 = parse_gold_molecule(answers[0], strict) if answers and isinstance(answers[0], str) else None
        hits = []
        for i, answer in enumerate(answers[: max(TOPK)]):
            keys = (top1.keys if top1 is not None else None) if i == 0 else molecule_keys(answer, strict)
            hits.append(keys is not None and keys in gold_keys)
        _topk_stats(hits, stats)
        if top1 is None and answers and too_complex(answers[0], strict):
            stats["num_too_complex"] = 1.0  # refused unscored (molecules.MAX_ATOMS, ..., MAX_SUBGRAPHS)
        if top1 is not None:
            stats["num_valid"] = 1.0
            valid_golds = [g for g in gold_mols if g is not None]
            for name in FINGERPRINTS:
                stats[f"fts_{name}_sum"] = best_tanimoto(top1.fingerprints[name],
                                                         [g.fingerprints[name] for g in valid_golds])

    def metrics(self, stats):
        valid = stats["num_valid"]
        return {
            **_topk_metrics(stats),
            "validity": ratio(valid, stats["num_samples"] - stats["num_no_answer"]),
            "num_valid": valid,
            "num_too_complex": stats["num_too_complex"],
            # Over the valid top-1 answers; with none, absent (NaN, as RMSE without a number): the official
            # calculate_fingerprint_similarity takes np.mean of an empty list, NaN, not 0.
            **{name: stats[f"{key}_sum"] / valid if valid > 0 else math.nan
               for name, key in (("fts", "fts_morgan"), ("fts_maccs", "fts_maccs"), ("fts_rdk", "fts_rdk"))},
        }

    def basis(self, metric, values):
        if metric == "validity":  # of the samples with an answer
            return _difference(values.get("num_samples"), values.get("num_no_answer"))
        if metric.startswith("fts"):  # of the valid molecules
            return values.get("num_valid")
        return super().basis(metric, values)

    def judge(self, stats):
        if stats["hit_top1"]:
            return "correct", stats["fts_morgan_sum"]
        if not stats["num_valid"]:
            return "invalid", None
        return "wrong", stats["fts_morgan_sum"]


class FormulaFamily(Family):
    name = "formula"
    stats = ("num_invalid",) + _TOPK_STATS
    metric_names = _TOPK_METRICS + ("num_invalid",)
    counts = frozenset({"num_invalid"})
    lower_is_better = frozenset({"num_invalid"})
    def fill(self, answers, golds, stats):
        lenient = self.scoring.lenient_formulas
        gold_keys = {formula_key(g, lenient) for g in golds} - {None}
        parsed = [formula_key(a, lenient) for a in answers[: max(TOPK)]]
        _topk_stats([p is not None and p in gold_keys for p in parsed], stats)
        if answers and answers[0] is not None and parsed[0] is None:
            stats["num_invalid"] = 1.0

    def metrics(self, stats):
        return {**_topk_metrics(stats), "num_invalid": stats["num_invalid"]}

    def judge(self, stats):
        if stats["num_invalid"]:
            return "invalid", None
        return ("correct" if stats["hit_top1"] else "wrong"), None


def iupac_parts(text: Optional[str]) -> Optional[frozenset[str]]:
    if text is None:
        return None
    parts = frozenset(part.strip() for part in text.split(";")) - {""}
    return parts or None


class IupacFamily(Family):
    name = "iupac"
    stats = _TOPK_STATS
    metric_names = _TOPK_METRICS

    def fill(self, answers, golds, stats):
        gold_keys = {iupac_parts(g) for g in golds} - {None}
        _topk_stats([(key := iupac_parts(a)) is not None and key in gold_keys for a in answers[: max(TOPK)]], stats)

    def metrics(self, stats):
        return _topk_metrics(stats)

    def judge(self, stats):
        return ("correct" if stats["hit_top1"] else "wrong"), None


def parse_number(text: Optional[str]) -> Optional[float]:
    if text is None or len(text) > 1000:
        return None
    try:
        value = float(text.strip().replace("\u2212", "-"))
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


# Squares are summed in two additive statistics so that the RMSE of finite errors stays finite and exact: an
# error up to `SMALL_ERROR` adds its square (at most 2^512: billions of them sum finitely), a larger one adds
# its square scaled by `BIG_SCALE`^2 (three errors of 1.2e154 have finite squares, 1.44e308, whose plain sum
# overflows). Only an error that is itself not finite (a difference past float64's range) is `num_overflow`.
SMALL_ERROR = 2.0 ** 256
BIG_SCALE = 2.0 ** -600


def _rmse(small: float, big: float, n: float) -> float:
    """sqrt((small + big / BIG_SCALE^2) / n), without forming the overflowing sum."""
    if big <= 0:
        return math.sqrt(small / n)
    return math.sqrt(small * BIG_SCALE * BIG_SCALE / n + big / n) / BIG_SCALE


class NumberFamily(Family):
    name = "number"
    stats = ("num_valid", "num_invalid", "num_overflow", "num_invalid_gold", "sq_err_sum", "sq_err_big_sum")
    metric_names = ("rmse", "num_valid", "num_invalid", "num_overflow", "num_invalid_gold")
    counts = frozenset({"num_valid", "num_invalid", "num_overflow", "num_invalid_gold"})
    lower_is_better = frozenset({"rmse", "num_invalid", "num_overflow", "num_invalid_gold"})
    score_lower_is_better = True  # the absolute error

    def fill(self, answers, golds, stats):
        if not answers or answers[0] is None:
            return
        gold_values = [v for v in map(parse_number, golds) if v is not None]
        if not gold_values:
            stats["num_invalid_gold"] = 1.0  # a `NaN` gold: nothing to score the answer against, not its fault
            return
        value = parse_number(answers[0])
        if value is None:
            stats["num_invalid"] = 1.0
            return
        error = min(abs(value - gold) for gold in gold_values)
        if not math.isfinite(error):
            stats["num_invalid"] = stats["num_overflow"] = 1.0  # 1e308 against -1e308: no float64 difference
            return
        stats["num_valid"] = 1.0
        if error <= SMALL_ERROR:
            stats["sq_err_sum"] = error * error
        else:
            stats["sq_err_big_sum"] = (error * BIG_SCALE) ** 2

    def metrics(self, stats):
        valid = stats["num_valid"]
        return {
            "rmse": _rmse(stats["sq_err_sum"], stats["sq_err_big_sum"], valid) if valid > 0 else math.nan,
            "num_valid": valid,
            "num_invalid": stats["num_invalid"],
            "num_overflow": stats["num_overflow"],
            "num_invalid_gold": stats["num_invalid_gold"],
        }

    def basis(self, metric, values):
        return values.get("num_valid") if metric == "rmse" else super().basis(metric, values)

    def judge(self, stats):
        if stats["num_valid"]:
            return "scored", _rmse(stats["sq_err_sum"], stats["sq_err_big_sum"], 1.0)  # the absolute error
        if stats["num_invalid_gold"]:
            return "scored", None  # the answer may be fine; its gold is not a number
        return "invalid", None


def parse_boolean(text: Optional[str], lenient: bool = False) -> Optional[str]:
    """``Yes``/``No`` for a yes/no answer, case-insensitively and stripped (utils/metrics.py:473), else None;
    `lenient` (``scoring.lenient_booleans``): one trailing period is dropped first (``Yes.`` is yes)."""
    if text is None:
        return None
    word = text.strip()
    if lenient and word.endswith("."):
        word = word[:-1].strip()
    return {"yes": "Yes", "no": "No"}.get(word.lower())


class BooleanFamily(Family):
    name = "boolean"
    stats = ("num_invalid", "tp", "fp", "tn", "fn")
    metric_names = ("accuracy", "f1", "mcc", "num_invalid", "tp", "fp", "tn", "fn")
    counts = frozenset({"num_invalid", "tp", "fp", "tn", "fn"})
    lower_is_better = frozenset({"num_invalid"})

    def no_answer(self, answer):
        return answer is None or not answer.strip()  # stripped before the official check (utils/metrics.py:473)

    def fill(self, answers, golds, stats):
        gold_labels = {parse_boolean(g) for g in golds} - {None}
        predicted = parse_boolean(answers[0], self.scoring.lenient_booleans) if answers else None
        if predicted is None:
            if answers and answers[0] is not None:
                stats["num_invalid"] = 1.0
            return  # wrong for accuracy, outside the confusion counts (as in the paper's code)
        if not gold_labels:
            return  # a sample without a yes/no gold cannot be right
        key = ("t" if predicted in gold_labels else "f") + ("p" if predicted == "Yes" else "n")
        stats[key] = 1.0

    def metrics(self, stats):
        tp, fp, tn, fn = (stats[k] for k in ("tp", "fp", "tn", "fn"))
        den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        return {
            "accuracy": ratio(tp + tn, stats["num_samples"]),
            "f1": ratio(2 * tp, 2 * tp + fp + fn),
            "mcc": (tp * tn - fp * fn) / den if den > 0 else 0.0,
            "num_invalid": stats["num_invalid"],
            "tp": tp, "fp": fp, "tn": tn, "fn": fn,
        }

    def basis(self, metric, values):
        if metric in ("f1", "mcc"):  # of the yes/no answers
            counts = [values.get(k) for k in ("tp", "fp", "tn", "fn")]
            return None if None in counts else sum(counts)
        return super().basis(metric, values)

    def judge(self, stats):
        if stats["num_invalid"]:
            return "invalid", None
        return ("correct" if stats["tp"] or stats["tn"] else "wrong"), None


_BLEU_STATS = (
    tuple(f"bleu_match{n}" for n in (1, 2, 3, 4)) + tuple(f"bleu_total{n}" for n in (1, 2, 3, 4))
    + ("bleu_hyp_len", "bleu_ref_len")
)


class CaptionFamily(Family):
    name = "caption"
    stats = ("num_scored", "num_scibert", "meteor_sum", "rouge1_sum", "rouge2_sum", "rougeL_sum") + _BLEU_STATS
    metric_names = ("meteor", "bleu2", "bleu4", "rouge1", "rouge2", "rougeL", "num_scored", "tokenizer_scibert")
    counts = frozenset({"num_scored"})

    def no_answer(self, answer):
        return answer is None or not answer.strip()  # stripped before the official check (utils/metrics.py:391)

    def fill(self, answers, golds, stats):
        stats.update(caption_stats(answers[0] if answers else None, golds))

    def metrics(self, stats):
        scored = stats["num_scored"]
        out = {"meteor": ratio(stats["meteor_sum"], scored), "bleu2": bleu_from_stats(stats, 2),
               "bleu4": bleu_from_stats(stats, 4)}
        for key in ("rouge1", "rouge2", "rougeL"):
            out[key] = ratio(stats[f"{key}_sum"], scored)
        out["num_scored"] = scored
        out["tokenizer_scibert"] = ratio(stats["num_scibert"], stats["num_samples"])
        return out

    def basis(self, metric, values):
        if metric == "tokenizer_scibert":
            return None  # which tokenizer scored, not a score
        plain = super().basis(metric, values)
        return None if plain is None else values.get("num_scored")  # of the non-empty captions

    def judge(self, stats):
        return "scored", stats["meteor_sum"]


@functools.lru_cache(maxsize=None)
def families(scoring: Scoring = OFFICIAL) -> dict[str, Family]:
    """Each family by name, reading answers as `scoring` says (made once per reading: the scorer asks for the
    families of the table it is handed, `llasmol.metrics.scoring.family`)."""
    return {f.name: f for f in (SmilesFamily(scoring), FormulaFamily(scoring), IupacFamily(scoring),
                                NumberFamily(scoring), BooleanFamily(scoring), CaptionFamily(scoring))}


FAMILIES: dict[str, Family] = families(OFFICIAL)  # names, statistics and metrics (the same for every reading)


def check_headlines(tasks: TaskTable) -> None:
    """Each declared task's headline metric (`data.new_tasks.<name>.headline`) is a score its family reports:
    a command checks it at start, before anything is built."""
    for name in tasks.declared:
        task = tasks[name]
        family = FAMILIES[task.family]
        scores = [m for m in family.metric_names if m not in family.counts]
        if task.headline not in scores:
            raise UserError(f"data.new_tasks.{name}.headline={task.headline} is no score of the {task.family} family: "
                            f"choose from {', '.join(scores)}")


COUNTS: frozenset[str] = COMMON_COUNTS.union(*(f.counts for f in FAMILIES.values()))
# Every metric any family reports, for tables: scores first (family by family), then the counts.
_ALL = [m for f in FAMILIES.values() for m in f.metric_names]
METRIC_ORDER: tuple[str, ...] = tuple(dict.fromkeys(
    [m for m in _ALL if m not in COUNTS] + list(COMMON_STATS) + [m for m in _ALL if m in COUNTS]))
LOWER_IS_BETTER: frozenset[str] = COMMON_LOWER_IS_BETTER.union(*(f.lower_is_better for f in FAMILIES.values()))
