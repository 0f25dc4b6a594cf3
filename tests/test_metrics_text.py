"""Captioning metrics: METEOR with offline WordNet, corpus BLEU from summed stats, ROUGE, tokenizer."""

from __future__ import annotations

import warnings

import pytest

from llasmol.core.errors import UserError
from llasmol.metrics import add_stats, finalize, sample_stats
from llasmol.metrics import text as textmod

TASK = "molecule_captioning"


@pytest.fixture(autouse=True)
def _fallback_tokenizer(monkeypatch):
    """These tests expect the basic fallback unless they point LLASMOL_SCIBERT somewhere themselves."""
    monkeypatch.delenv(textmod.SCIBERT_ENV, raising=False)
    textmod._tokenizer.cache_clear()
    textmod._gold_tokens.cache_clear()
    yield
    textmod._tokenizer.cache_clear()
    textmod._gold_tokens.cache_clear()


def caption(samples):
    total: dict[str, float] = {}
    for prediction, golds in samples:
        add_stats(total, sample_stats(TASK, [prediction], golds))
    return finalize(TASK, total)


def test_identical_caption_scores_one():
    gold = "The molecule is a monocarboxylic acid anion that is the conjugate base of acetic acid."
    metrics = caption([(gold, [gold])])
    assert metrics["meteor"] == pytest.approx(1.0, abs=0.01)  # NLTK's fragmentation penalty keeps it < 1
    for key in ("bleu2", "bleu4", "rouge1", "rouge2", "rougeL"):
        assert metrics[key] == pytest.approx(1.0), key
    assert metrics["tokenizer_scibert"] == 0.0  # no LLASMOL_SCIBERT in tests


def test_disjoint_caption_scores_zero():
    metrics = caption([("zebra quantum violin", ["The molecule is an acid."])])
    for key in ("meteor", "bleu2", "bleu4", "rouge1", "rouge2", "rougeL"):
        assert metrics[key] == pytest.approx(0.0, abs=1e-9), key


def test_empty_caption_is_no_answer_and_left_out_as_the_paper_does():
    gold = "The molecule is an acid."
    both = caption([("   ", [gold]), ("The molecule is an acid, a base.", [gold])])
    alone = caption([("The molecule is an acid, a base.", [gold])])
    assert both["num_no_answer"] == 1 and both["num_scored"] == 1 and both["num_samples"] == 2
    for key in ("meteor", "bleu2", "bleu4", "rouge1", "rouge2", "rougeL"):
        assert both[key] == pytest.approx(alone[key]), key
    assert 0.3 < both["rouge1"] < 1.0
    nothing = caption([("", [gold])])
    assert nothing["meteor"] == 0.0 and nothing["bleu4"] == 0.0 and nothing["num_scored"] == 0


def test_meteor_uses_wordnet_synonyms_and_stems():
    # one aligned word of one: P = R = 1, one chunk, penalty 0.5 -> 0.5
    assert textmod.meteor([["acid"]], ["acids"]) == pytest.approx(0.5)  # Porter stem match
    assert textmod.meteor([["car"]], ["auto"]) == pytest.approx(0.5)  # WordNet synonym match
    assert textmod.meteor([["sick"]], ["ill"]) == pytest.approx(0.5)
    assert textmod.meteor([["car"]], ["zebra"]) == 0.0


def test_bleu_matches_nltk_corpus_bleu():
    from nltk.translate.bleu_score import corpus_bleu

    pairs = [
        ("the molecule is an acid derived from acetic acid .", ["the molecule is acetic acid ."]),
        ("it is a base", ["the molecule is a weak base", "it is a base ."]),
        ("a", ["a long reference sentence about a molecule"]),
        ("the conjugate base of an acid is an anion and it has a role", ["the conjugate base of acetic acid is an anion"]),
    ]
    total: dict[str, float] = {}
    for hyp, refs in pairs:
        add_stats(total, textmod.bleu_stats([r.split() for r in refs], hyp.split()))
    hyps = [h.split() for h, _ in pairs]
    refs = [[r.split() for r in rs] for _, rs in pairs]
    assert textmod.bleu_from_stats(total, 2) == pytest.approx(corpus_bleu(refs, hyps, weights=(0.5, 0.5)))
    assert textmod.bleu_from_stats(total, 4) == pytest.approx(corpus_bleu(refs, hyps, weights=(0.25,) * 4))
    assert 0 < textmod.bleu_from_stats(total, 4) < textmod.bleu_from_stats(total, 2) < 1


def test_bleu_no_higher_order_match_is_zero_like_nltk():
    from nltk.translate.bleu_score import corpus_bleu

    stats = textmod.bleu_stats([["a", "b", "c", "d"]], ["d", "c", "b", "a"])
    assert textmod.bleu_from_stats(stats, 4) == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert corpus_bleu([[["a", "b", "c", "d"]]], [["d", "c", "b", "a"]]) == pytest.approx(0.0, abs=1e-12)


def test_rouge_known_values():
    scores = textmod.rouge(["the cat sat on the mat"], "the cat sat")
    # unigrams: 3 of 3 predicted, 3 of 6 reference -> F = 2 * 1 * 0.5 / 1.5
    assert scores["rouge1"] == pytest.approx(2 / 3)
    assert scores["rouge2"] == pytest.approx(2 * 1 * 0.4 / 1.4)
    assert scores["rougeL"] == pytest.approx(2 / 3)
    assert textmod.rouge(["x y", "the cat sat"], "the cat sat")["rouge1"] == pytest.approx(1.0)  # best gold


def test_basic_tokenizer():
    assert textmod.basic_tokenize("The Molecule is 2-Methyl-propanoate (an anion).") == [
        "the", "molecule", "is", "2", "-", "methyl", "-", "propanoate", "(", "an", "anion", ")", ".",
    ]  # fmt: skip
    assert textmod.basic_tokenize("Café\x00\u200b ok") == ["cafe", "ok"]
    assert len(textmod.basic_tokenize("word " * 2000)) == textmod.MAX_TOKENS


def test_bad_scibert_path_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.setenv(textmod.SCIBERT_ENV, str(tmp_path / "missing"))
    textmod._tokenizer.cache_clear()
    try:
        with pytest.raises(UserError, match="LLASMOL_SCIBERT"):
            textmod.tokenizer_name()
    finally:
        monkeypatch.delenv(textmod.SCIBERT_ENV)
        textmod._tokenizer.cache_clear()
    assert textmod.tokenizer_name().startswith("basic-lower")


def test_scibert_from_a_local_folder(monkeypatch, tmp_path):
    """A tiny folder in SciBERT's Hub layout (config.json + vocab.txt) stands in for it."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "molecule", "is", "an", "acid", "acet", "##ic", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    monkeypatch.setenv(textmod.SCIBERT_ENV, str(tmp_path))
    textmod._tokenizer.cache_clear()
    textmod._gold_tokens.cache_clear()
    try:
        assert textmod.tokenize("The molecule is Acetic acid.") == ["the", "molecule", "is", "acet", "##ic", "acid", "."]
        metrics = caption([("The molecule is acetic acid.", ["The molecule is acetic acid."])])
        assert metrics["tokenizer_scibert"] == 1.0
        assert metrics["bleu4"] == pytest.approx(1.0)
    finally:
        monkeypatch.delenv(textmod.SCIBERT_ENV)
        textmod._tokenizer.cache_clear()
        textmod._gold_tokens.cache_clear()


def test_ensure_wordnet_copies_with_lf_line_endings(monkeypatch, tmp_path):
    """A fresh cache folder, several levels deep, whose wordnet folder is a stale half-copy (no marker):
    replaced by a whole copy, staged and renamed, leaving nothing else behind (about 5 s: 35 MB copied)."""
    import nltk

    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))
    monkeypatch.setenv(textmod.NLTK_DATA_ENV, str(tmp_path / "cache" / "nltk_data"))
    stale = tmp_path / "cache" / "nltk_data" / "corpora" / "wordnet"
    stale.mkdir(parents=True)
    (stale / "data.noun").write_text("half a copy")
    root = textmod.ensure_wordnet()
    target = root / "corpora" / "wordnet"
    assert root == tmp_path / "cache" / "nltk_data"
    assert sorted(p.name for p in target.parent.iterdir()) == ["wordnet"]  # no staging folder left
    assert (target / ".llasmol-complete").is_file()
    assert nltk.data.path[0] == str(root)
    assert not (target.is_symlink())
    assert b"\r\n" not in (target / "index.noun").read_bytes()[:100_000]
    assert (target / "data.noun").stat().st_size > 10_000_000
    # a second call reuses the copy
    mtime = (target / "data.noun").stat().st_mtime_ns
    textmod.ensure_wordnet()
    assert (target / "data.noun").stat().st_mtime_ns == mtime
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "multilingual functions are not available": no OMW here
        reader = WordNetCorpusReader(str(target), None)
    assert reader.get_version() == "3.0"
    assert "dog.n.01" in {s.name() for s in reader.synsets("dog")}


def test_bleu_applies_the_brevity_penalty_of_the_closest_reference():
    import math

    hypothesis = "the molecule is an acid".split()
    references = ["the molecule is an acid found in plants and fungi".split(), "an acid".split()]
    stats = textmod.bleu_stats(references[:1], hypothesis)
    assert stats["bleu_ref_len"] == 10 and stats["bleu_hyp_len"] == 5
    # every n-gram matches: BLEU is the brevity penalty alone, exp(1 - 10/5)
    assert textmod.bleu_from_stats(stats, 2) == pytest.approx(math.exp(1 - 10 / 5))
    # of two references the closer length counts (2 is 3 away, 10 is 5): longer than it, no penalty
    both = textmod.bleu_stats(references, hypothesis)
    assert both["bleu_ref_len"] == 2 and textmod.bleu_from_stats(both, 2) == pytest.approx(1.0)


def test_rouge_compares_words_as_written_without_stemming():
    """The official scorer's RougeScorer(use_stemmer=False): "cats" and "cat" are two words."""
    assert textmod.rouge(["the cats are running"], "the cat is run")["rouge1"] == pytest.approx(0.25)
