"""The inference building blocks on their own, with stand-ins for the model, tokenizer and split (no weights,
milliseconds each): batched beam search's padding, batching and skipping; the per-task generation settings;
the partial predictions file of a stopped evaluation; the pipeline's sample draw, answerer and files."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest
import torch

from refusals import refused

from llasmol.core.tasks import SMOLINSTRUCT
from llasmol.inference.beam_search import BeamGenerator, BeamSettings, task_settings
from llasmol.inference.partial import PartialPredictions, partial_path
from llasmol.inference.pipeline import Evaluation, ModelAnswers, RunFiles, Samples, balanced_subset, gather_to_all
from llasmol.metrics.extract import extract_answer
from llasmol.metrics.scoring import GoldPool

# --------------------------------------------------------------------------- beam search

PAD, EOS = 0, 2


class CharFormatter:
    """Prompt ids: one id per character of the query (so a query's length is its prompt's length)."""

    def prompt_ids(self, query: str) -> list[int]:
        return [ord(c) for c in query]


class EchoModel(torch.nn.Module):
    """`generate` answers each row with beams `[last prompt id, 200 + beam]` and records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[dict] = []

    def generate(self, input_ids, attention_mask, num_return_sequences, **kwargs):
        self.calls.append({"input_ids": input_ids.tolist(), "attention_mask": attention_mask.tolist(),
                           "num_return_sequences": num_return_sequences, **kwargs})
        rows = []
        for row in input_ids.tolist():
            for beam in range(num_return_sequences):
                rows.append(row + [row[-1], 200 + beam])
        return torch.tensor(rows)


class DecodeTokenizer:
    pad_token_id = PAD
    eos_token_id = EOS

    def batch_decode(self, rows, skip_special_tokens):
        assert skip_special_tokens is True
        # Padded with spaces on both sides: the generator strips them.
        return [f"  {chr(r[0])}{r[1] - 200}  " for r in rows.tolist()]


def test_beam_search_pads_left_batches_longest_first_and_splits_each_rows_beams():
    model = EchoModel()
    gen = BeamGenerator(model, DecodeTokenizer(), CharFormatter(), max_prompt_tokens=4, batch_size=2)
    queries = ["xa", "yyyb", "zzzzzc", "wwc", "d"]  # "zzzzzc": 6 prompt tokens, over the limit of 4
    settings = BeamSettings(num_beams=3, num_return_sequences=2, max_new_tokens=7, early_stopping=True)
    batches = list(gen.generate_batches(queries, settings))
    # The skipped prompt first; then the rest longest first, two at a time.
    assert batches == [([2], [None]), ([1, 3], [["b0", "b1"], ["c0", "c1"]]), ([0, 4], [["a0", "a1"], ["d0", "d1"]])]
    first, second = model.calls[0], model.calls[1]
    assert first["input_ids"] == [[ord(c) for c in "yyyb"], [PAD, ord("w"), ord("w"), ord("c")]]
    assert first["attention_mask"] == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert second["input_ids"] == [[ord("x"), ord("a")], [PAD, ord("d")]]
    assert second["attention_mask"] == [[1, 1], [0, 1]]
    assert {k: first[k] for k in ("num_beams", "num_return_sequences", "max_new_tokens", "do_sample", "early_stopping",
                                  "pad_token_id", "eos_token_id")} == {
        "num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 7, "do_sample": False, "early_stopping": True,
        "pad_token_id": PAD, "eos_token_id": EOS}
    # `generate`: the same answers in the queries' order, None for the skipped one.
    assert gen.generate(queries, settings) == [["a0", "a1"], ["b0", "b1"], None, ["c0", "c1"], ["d0", "d1"]]


def test_beam_search_keeps_a_prompt_of_exactly_the_limit_and_batches_eight_by_default():
    model = EchoModel()
    gen = BeamGenerator(model, DecodeTokenizer(), CharFormatter(), max_prompt_tokens=3)
    one = BeamSettings(1, 1, 4)
    assert gen.generate(["abc", "abcd"], one) == [["c0"], None]  # 3 tokens kept, 4 skipped
    assert gen.generate(["abcd"], one) == [None] and len(model.calls) == 1  # nothing left to generate
    model.calls.clear()
    assert gen.generate([chr(ord("a") + i) for i in range(9)], one) == [[chr(ord("a") + i) + "0"] for i in range(9)]
    assert [len(c["input_ids"]) for c in model.calls] == [8, 1]
    assert model.calls[0]["early_stopping"] is False  # BeamSettings' default


def test_a_base_models_responses_come_as_generated_for_its_rules():
    """Stripped, as the official LlaSMol generation strips a response; unstripped for a base model's rules
    (`strip = False`, evaluate's base protocols), whose Galactica rules cut at newlines."""
    gen = BeamGenerator(EchoModel(), DecodeTokenizer(), CharFormatter())
    one = BeamSettings(1, 1, 4)
    assert gen.generate(["ab"], one) == [["b0"]]
    gen.strip = False
    assert gen.generate(["ab"], one) == [["  b0  "]]


def test_task_settings_overlay_the_task_on_the_default_and_cap_new_tokens():
    gen = {"default": {"num_beams": 5, "num_return_sequences": 5, "max_new_tokens": 1024},
           "tasks": {"name_conversion-s2f": {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 40,
                                             "early_stopping": True},
                     "property_prediction-esol": None},
           "max_new_tokens_limit": None}
    assert task_settings(gen, "forward_synthesis") == BeamSettings(5, 5, 1024, False)
    assert task_settings(gen, "property_prediction-esol") == BeamSettings(5, 5, 1024, False)
    assert task_settings(gen, "name_conversion-s2f") == BeamSettings(3, 2, 40, True)
    capped = {**gen, "max_new_tokens_limit": 100}
    assert task_settings(capped, "forward_synthesis").max_new_tokens == 100
    assert task_settings(capped, "name_conversion-s2f").max_new_tokens == 40  # under the cap: its own
    assert BeamGenerator(None, DecodeTokenizer(), None).batch_size == 8


# --------------------------------------------------------------------------- the partial predictions file


def test_a_partial_file_starts_with_its_settings_and_counts_the_records_appended(tmp_path):
    final = tmp_path / "run" / "predictions" / "test.jsonl"
    assert partial_path(final) == tmp_path / "run" / "predictions" / "test.jsonl.partial"
    parts = PartialPredictions(final, {"ckpt": "a", "beams": 3})
    assert parts.count == 0 and parts.answered() == 0  # no file yet
    assert parts.resume(set(range(10))) == {} and parts.count == 0  # its folder is made
    parts.append([{"index": 4, "predictions": ["x"]}, {"index": 2, "predictions": None}])
    parts.append([{"index": 9, "predictions": ["y", "z"], "gold": ["kept as written, read back never"]}])
    assert parts.count == 3 and parts.answered() == 3
    assert [json.loads(line) for line in parts.path.read_text().splitlines()][:2] == [
        {"settings": {"ckpt": "a", "beams": 3}}, {"index": 4, "predictions": ["x"]}]

    # The same command again: the responses by index, appended to, the settings line not written twice.
    again = PartialPredictions(final, {"ckpt": "a", "beams": 3})
    assert again.resume(set(range(10))) == {4: ["x"], 2: None, 9: ["y", "z"]}
    assert again.count == 3
    again.append([{"index": 0, "predictions": []}])
    assert again.count == 4 and again.answered() == 4
    assert len(again.path.read_text().splitlines()) == 5
    again.close()
    again.close()  # twice is harmless
    again.remove()
    assert not again.path.exists()
    again.remove()  # and so is removing what is gone


def test_an_empty_partial_file_gets_its_settings_line_and_a_torn_one_keeps_its_complete_lines(tmp_path):
    final = tmp_path / "test.jsonl"
    partial_path(final).write_bytes(b"")
    parts = PartialPredictions(final, {"k": 1})
    assert parts.answered() == 0  # an empty file holds no records (not -1)
    assert parts.resume({1, 2}) == {}
    parts.close()
    assert partial_path(final).read_text() == '{"settings": {"k": 1}}\n'
    with partial_path(final).open("a") as fh:
        fh.write('{"index": 1, "predictions": null}\n{"index": 2, "predictions": null}\n{"ind')  # killed mid-line
    assert PartialPredictions(final, {"k": 1}).answered() == 2
    assert PartialPredictions(final, {"k": 1}).resume({1, 2}) == {1: None, 2: None}


@pytest.mark.parametrize("before, differs", [
    ({"a": 1, "b": 2, "c": 3}, "b=2, not 5"),
    ({"a": 1, "b": 5}, "c=None, not 3"),
])
def test_a_partial_file_of_other_settings_names_the_first_that_differs(tmp_path, before, differs):
    final = tmp_path / "test.jsonl"
    partial_path(final).write_text(json.dumps({"settings": before}) + "\n")
    with refused(partial_path(final), differs):
        PartialPredictions(final, {"a": 1, "b": 5, "c": 3}).resume(set())


@pytest.mark.parametrize("lines, named", [
    (['{"index": 0}'], "line 1"),  # the settings line edited away
    (['{"settings": {"k": 1}}', '{"index": 0, "predictions": ["a"'], "line 2"),  # not JSON
    (['{"settings": {"k": 1}}', b'{"index": 0, "predictions": ["\xff"]}'], "line 2"),  # not UTF-8
    (['{"settings": {"k": 1}}', '[0, ["a"]]'], "line 2"),  # not an object
    (['{"settings": {"k": 1}}', '{"index": 7, "predictions": ["a"]}'], "index 7"),  # no sample of this evaluation
    (['{"settings": {"k": 1}}', '{"index": true, "predictions": ["a"]}'], "index true"),
    (['{"settings": {"k": 1}}', '{"index": 0, "predictions": ["a"]}', '{"index": 0, "predictions": ["b"]}'],
     "sample 0 a second time"),
    (['{"settings": {"k": 1}}', '{"index": 0, "predictions": "a"}'], 'predictions "a"'),
    (['{"settings": {"k": 1}}', '{"index": 0}'], "lacks predictions"),
])
def test_a_partial_file_edited_since_the_stop_is_refused_by_line_untouched(tmp_path, lines, named):
    """A line changed between the stop and the continuation is named by its number, never half-used or a
    traceback, and the file stays as it is for the user to mend or delete."""
    final = tmp_path / "predictions" / "test.jsonl"
    final.parent.mkdir()
    partial_path(final).write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    with refused(partial_path(final), named, "delete it to start over", untouched=tmp_path):
        PartialPredictions(final, {"k": 1}).resume({0, 1})


# --------------------------------------------------------------------------- the pipeline


class FakeSplit:
    """Samples of two tasks, in the split's order: 3 of forward_synthesis, then `n` of name_conversion-s2f."""

    def __init__(self, n: int = 4) -> None:
        self.samples = [{"task": "forward_synthesis", "input": f"q{i}", "raw_input": f"C{i}", "raw_output": "CCO"}
                        for i in range(3)]
        self.samples += [{"task": "name_conversion-s2f", "input": f"q{i}", "raw_input": f"N{i}", "raw_output": "C2H6O"}
                         for i in range(3, 3 + n)]
        self.read: list[int] = []

    def counts(self):
        return {"forward_synthesis": 3, "name_conversion-s2f": len(self.samples) - 3}

    def __getitem__(self, i):
        self.read.append(i)
        return self.samples[i]


def test_the_balanced_subset_takes_each_tasks_samples_from_its_own_range():
    split = FakeSplit(50)
    assert balanced_subset(split, None, 0) == list(range(53))
    assert balanced_subset(split, 60, 0) == list(range(53))
    drawn = balanced_subset(split, 3, 7)
    assert drawn[:3] == [0, 1, 2]  # a task with exactly `per_task` samples keeps them all
    rest = drawn[3:]
    assert len(rest) == 3 and rest == sorted(rest) and all(3 <= i < 53 for i in rest)
    assert balanced_subset(split, 3, 7) == drawn  # one draw per seed
    assert any(balanced_subset(split, 3, s)[3:] != rest for s in range(8, 12))
    many = balanced_subset(split, 45, 1)[3:]  # without replacement: no sample twice
    assert len(many) == len(set(many)) == 45 and all(isinstance(i, int) for i in many)


class GoldSplit:
    """Two forward_synthesis samples of one input with different products, and two ESOL samples of one input."""

    table = SMOLINSTRUCT

    samples = [{"task": "forward_synthesis", "input": "a", "raw_input": "CC.O", "raw_output": "CCO"},
               {"task": "property_prediction-esol", "input": "b", "raw_input": "C", "raw_output": "1.0"},
               {"task": "forward_synthesis", "input": "c", "raw_input": "CC.O", "raw_output": "OCC"},
               {"task": "property_prediction-esol", "input": "d", "raw_input": "C", "raw_output": "2.0"}]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]

    def task_row(self, i):
        from llasmol.core.tasks import get_task

        return get_task(self.samples[i]["task"])


def test_a_splits_golds_pool_over_samples_of_one_input_for_pooled_tasks_only():
    from llasmol.inference.pipeline import split_golds

    split = GoldSplit()
    pool = split_golds(split)
    # Forward synthesis pools (every product of the same reactants is right); ESOL keeps each sample's own.
    assert pool.golds(split[0], "CCO") == ["CCO", "OCC"] and pool.golds(split[2], "OCC") == ["OCC", "CCO"]
    assert pool.golds(split[1], "1.0") == ["1.0"] and pool.golds(split[3], "2.0") == ["2.0"]
    # `Samples.of`: the samples drawn from the split, the golds from its pooling split.
    source = SimpleNamespace(split=lambda name: FakeSplit(50), pooling_split=lambda name: split)
    samples = Samples.of(source, "test", per_task=3, seed=1)
    assert len(samples.indices) == 6 and samples.indices[:3] == [0, 1, 2]
    assert samples.golds.golds(split[0], "CCO") == ["CCO", "OCC"]
    assert Samples.of(source, "test").indices == list(range(53))


def test_samples_share_strides_by_rank_and_records_gather_to_themselves_without_ddp():
    samples = Samples(FakeSplit(), list(range(10)), GoldPool())
    assert samples.share(1, 3).indices == [1, 4, 7] and samples.share(0, 1).indices == list(range(10))
    records = [{"index": 1}, {"index": 2}]
    assert gather_to_all(records) == [{"index": 1}, {"index": 2}]


def test_records_gather_from_every_rank_in_rank_order_under_ddp(monkeypatch):
    from llasmol.inference import pipeline

    class TwoRanks:  # torch.distributed as a 2-process group sees it; rank 1 answered {"index": 9}
        def is_available(self):
            return True

        def is_initialized(self):
            return True

        def get_world_size(self):
            return 2

        def all_gather_object(self, parts, obj):
            assert parts == [None, None]
            parts[:] = [obj, [{"index": 9}]]

    monkeypatch.setattr(pipeline, "dist", TwoRanks())
    assert gather_to_all([{"index": 0}, {"index": 4}]) == [{"index": 0}, {"index": 4}, {"index": 9}]
    alone = TwoRanks()
    alone.get_world_size = lambda: 1
    alone.all_gather_object = None  # one process: nothing to gather
    monkeypatch.setattr(pipeline, "dist", alone)
    assert gather_to_all([{"index": 0}]) == [{"index": 0}]


class ScriptedGenerator:
    """Answers `<query>!` once per query, in batches of two, and records what each task was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[str], int]] = []

    def generate_batches(self, queries, settings):
        self.asked.append((list(queries), settings.num_return_sequences))
        for start in range(0, len(queries), 2):
            rows = list(range(start, min(start + 2, len(queries))))
            yield rows, [[queries[i] + "!"] for i in rows]

    def generate(self, queries, settings):
        return [[q + "?"] for q in queries]


GENERATION = {"default": {"num_beams": 1, "num_return_sequences": 1, "max_new_tokens": 8},
              "tasks": {"name_conversion-s2f": {"num_return_sequences": 2}}}


def test_model_answers_keep_done_records_use_given_queries_and_report_each_batch():
    split = FakeSplit(4)
    done = {1: {"index": 1, "task": "forward_synthesis", "kept": True}}
    batches, progress = [], []
    gen = ScriptedGenerator()
    answers = ModelAnswers(gen, GENERATION, queries={i: f"Q{i}" for i in range(7)}, done=done, sink=batches.append)
    samples = Samples(split, [5, 1, 0, 3, 2, 6], GoldPool())
    records = answers.answer(samples, progress.append)
    # Grouped by task (first seen first), each task's samples in the order given; the done one as it was.
    assert [r["index"] for r in records] == [5, 3, 6, 1, 0, 2]
    assert records[3] is done[1] and 1 not in split.read
    assert gen.asked == [(["Q5", "Q3", "Q6"], 2), (["Q0", "Q2"], 1)]  # each task with its own beams
    assert [[r["index"] for r in b] for b in batches] == [[5, 3], [6], [0, 2]]
    assert progress == [2, 1, 2]
    assert records[0]["predictions"] == ["Q5!"] and records[0]["input"] == "q5" and records[0]["skipped"] is False
    # Without given queries, the samples' own; a task whose samples are all done is not asked at all.
    gen = ScriptedGenerator()
    records = ModelAnswers(gen, GENERATION, done={i: {"index": i, "task": "forward_synthesis"} for i in range(3)}
                           ).answer(Samples(split, [0, 4, 1, 2], GoldPool()))
    assert gen.asked == [(["q4"], 2)] and [r["index"] for r in records] == [0, 1, 2, 4]
    assert ModelAnswers(ScriptedGenerator(), GENERATION).ask("hello", "name_conversion-s2f") == ["hello?"]


class LockstepGenerator(ScriptedGenerator):
    """A generator of a model sharded over processes: it counts its calls and idles as it is told."""

    lockstep = True
    device = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self.idled: list[int] = []

    def count_batches(self, queries) -> int:
        return -(-len(queries) // 2)

    def idle(self, calls: int) -> None:
        self.idled.append(calls)


def test_a_lockstep_rank_makes_up_the_calls_the_busiest_rank_makes_more(monkeypatch):
    """Every rank of a sharded model must make as many generate calls as the others (each forward is collective):
    this rank's 2 tasks of 3 samples take 2 calls each, the busiest rank makes 5, so this one idles a call at the end."""
    from llasmol.inference import pipeline

    asked = []
    monkeypatch.setattr(pipeline, "most_of_any_rank", lambda calls, device: asked.append((calls, device)) or 5)
    gen = LockstepGenerator()
    records = ModelAnswers(gen, GENERATION).answer(Samples(FakeSplit(4), [5, 1, 0, 3, 2, 6], GoldPool()))
    assert len(records) == 6 and len(gen.asked) == 2
    assert asked == [(4, "cpu")] and gen.idled == [1]
    done = {i: {"index": i, "task": "forward_synthesis"} for i in range(7)}  # nothing left to answer: idle all 5
    gen = LockstepGenerator()
    ModelAnswers(gen, GENERATION, done=done).answer(Samples(FakeSplit(4), [0, 1, 2], GoldPool()))
    assert gen.asked == [] and gen.idled == [5]


def test_a_generator_counts_its_calls_and_idles_on_one_token(tmp_path):
    from llasmol.inference.beam_search import BeamGenerator, forward_is_collective

    calls = []

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def generate(self, **kwargs):
            calls.append(kwargs)
            return torch.cat([kwargs["input_ids"], torch.full((kwargs["input_ids"].shape[0], 1), 7)], dim=1)

    class Formatter:
        def prompt_ids(self, query):
            return [1] * len(query)

    class Tokenizer:
        pad_token_id, eos_token_id = 0, 2

        def batch_decode(self, rows, skip_special_tokens=True):
            return ["x" for _ in rows]

    gen = BeamGenerator(Model(), Tokenizer(), Formatter(), max_prompt_tokens=4, batch_size=2)
    assert gen.lockstep is False and forward_is_collective(gen.model) is False  # no process group
    assert gen.count_batches(["ab", "abcdef", "a", "abc", "abcd"]) == 2  # one prompt over the limit: 4 kept
    assert gen.count_batches([]) == 0
    gen.idle(2)
    assert [c["input_ids"].tolist() for c in calls] == [[[0]], [[0]]]
    assert {(c["num_beams"], c["max_new_tokens"], c["synced_gpus"]) for c in calls} == {(1, 1, False)}


def test_run_files_name_the_predictions_metrics_and_intervals_of_a_split(tmp_path):
    files = RunFiles.named(tmp_path, "val-step3")
    assert files.predictions == tmp_path / "predictions" / "val-step3.jsonl"
    assert files.metrics == tmp_path / "metrics" / "val-step3.json"
    assert files.intervals == tmp_path / "metrics" / "val-step3.intervals.json"
    given = RunFiles.named(str(tmp_path), "test", metrics=str(tmp_path / "out.json"))
    assert given.predictions == tmp_path / "predictions" / "test.jsonl" and given.metrics == tmp_path / "out.json"


def _records() -> list[dict]:
    from llasmol.inference.predictions import make_record

    sample = {"task": "forward_synthesis", "input": "q", "raw_input": "C", "raw_output": "CCO"}
    return [make_record(0, sample, GoldPool(), ["<SMILES> CCO </SMILES>"]),
            make_record(1, sample, GoldPool(), ["<SMILES> CC </SMILES>"])]


def test_an_evaluation_writes_only_where_it_is_told(tmp_path):
    records = _records()
    quiet = Evaluation(RunFiles.named(tmp_path / "a", "test"), write=False).finish(records)
    assert not (tmp_path / "a").exists()
    assert quiet.metrics["forward_synthesis"]["exact_match"] == 0.5 and quiet.intervals is None
    assert quiet.records is records
    # No predictions file (a file scored in place) and no intervals asked: the metrics alone.
    metrics = tmp_path / "b" / "m.json"
    Evaluation(RunFiles(None, metrics)).finish(records)
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["m.json"]
    assert json.loads(metrics.read_text())["forward_synthesis"]["exact_match"] == 0.5
    # Metrics given (a DDP reducer's) are the ones written and returned.
    given = {"forward_synthesis": {"exact_match": 0.25}}
    out = Evaluation(RunFiles.named(tmp_path / "c", "test")).finish(records, given)
    assert out.metrics == given and json.loads((tmp_path / "c" / "metrics" / "test.json").read_text()) == given
    assert len((tmp_path / "c" / "predictions" / "test.jsonl").read_text().splitlines()) == 2


# --------------------------------------------------------------------------- reading predictions files


def _write_lines(path, *lines) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_predictions_read_numbers_as_their_text_skip_blank_lines_and_keep_other_fields(tmp_path):
    from llasmol.inference.predictions import read_predictions

    line = {"task": "property_prediction-esol", "input": "q", "gold": 1.5, "predictions": [3, "-0.25"],
            "note": {"a": 1}}
    path = _write_lines(tmp_path / "p.jsonl", line, "", "   ", {**line, "gold": [2], "predictions": None})
    first, second = read_predictions(path)
    assert first == {**line, "gold": ["1.5"], "predictions": ["3", "-0.25"], "skipped": False}
    assert second["gold"] == ["2"] and second["predictions"] == [] and second["skipped"] is True
    # An untagged answer in our own files stays as written (only LLM4Chem's outputs lose their tokens).
    caption = {"task": "molecule_captioning", "input": "q", "gold": "g", "predictions": ["A dye.</s><unk>"]}
    assert read_predictions(_write_lines(tmp_path / "c.jsonl", caption))[0]["predictions"] == ["A dye.</s><unk>"]
    # A line with both `output` and `predictions` is ours: `output` is one more field.
    both = {**caption, "output": ["other"]}
    assert read_predictions(_write_lines(tmp_path / "b.jsonl", both))[0]["predictions"] == ["A dye.</s><unk>"]


@pytest.mark.parametrize("field, value, shown", [
    ("gold", None, "null"),
    ("gold", True, "true"),
    ("predictions", [False], "false"),
    ("predictions", [["a"]], '["a"]'),
    ("gold", [], "empty list"),  # nothing to score against: not a wrong answer
])
def test_predictions_and_golds_must_be_text_or_numbers(tmp_path, field, value, shown):
    from llasmol.inference.predictions import read_predictions

    line = {"task": "forward_synthesis", "input": "q", "gold": "C", "predictions": ["C"], field: value}
    path = _write_lines(tmp_path / "p.jsonl", line)
    with refused(f"{path} line 1", field, shown):
        read_predictions(path)


def test_a_yes_no_gold_that_is_neither_is_refused_where_it_is(tmp_path):
    """A yes/no task's gold must read Yes or No (any case, spaces around it): "maybe" would count against accuracy
    and stay out of F1 and MCC (the official code reads it as No). One line names the line and the gold."""
    from llasmol.inference.predictions import read_predictions

    line = {"task": "property_prediction-bbbp", "input": "CCO", "predictions": ["<BOOLEAN> Yes </BOOLEAN>"]}
    good = [{**line, "gold": gold} for gold in ("Yes", " no ", "YES", ["No"])]
    assert len(read_predictions(_write_lines(tmp_path / "ok.jsonl", *good))) == 4
    for gold in ("maybe", ["Yes", "Yes."], "1"):
        path = _write_lines(tmp_path / "p.jsonl", *good, {**line, "gold": gold})
        with refused(f"{path} line 5", "property_prediction-bbbp", "not Yes or No"):
            read_predictions(path)
    numbers = {"task": "property_prediction-esol", "input": "CCO", "gold": "maybe", "predictions": ["1.0"]}
    assert len(read_predictions(_write_lines(tmp_path / "n.jsonl", numbers))) == 1  # its own count (num_invalid_gold)


def test_an_empty_predictions_file_is_refused_unless_allowed(tmp_path):
    from llasmol.inference.predictions import read_predictions

    path = tmp_path / "p.jsonl"
    path.write_text("\n\n")
    with refused(path, "empty"):
        read_predictions(path)
    assert read_predictions(path, allow_empty=True) == []


def test_llm4chem_folders_read_every_task_file_in_name_order(tmp_path):
    from llasmol.inference.predictions import read_predictions

    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "sub.jsonl").mkdir()  # a folder named like a file is no file of answers
    _write_lines(folder / "molecule_captioning.jsonl",
                 {"task": "molecule_captioning", "input": "CCO", "gold": "It is ethanol.",
                  "output": ["<unk> It is ethanol.</s><unk><unk>", "It is.</s>"], "input_text": "Describe CCO"})
    _write_lines(folder / "forward_synthesis.jsonl",
                 {"task": "forward_synthesis", "input": "CC.O", "gold": "CCO", "output": None, "input_text": 7},
                 {"task": "forward_synthesis", "input": "C", "raw_input": "kept", "gold": "C",
                  "output": ["<SMILES> C </SMILES></s>"], "input_text": "Make C"})
    fs0, fs1, cap = read_predictions(folder)
    # The core input is `raw_input`, the prompt (when it is text) the `input`; `output` the predictions.
    assert (fs0["raw_input"], fs0["input"], fs0["predictions"], fs0["skipped"]) == ("CC.O", "CC.O", [], True)
    assert (fs1["raw_input"], fs1["input"]) == ("kept", "C")  # a line naming its core input keeps its fields
    # Tagged: kept whole (scoring takes the answer from between its tags).
    assert fs1["predictions"] == ["<SMILES> C </SMILES></s>"]
    assert (cap["raw_input"], cap["input"]) == ("CCO", "Describe CCO")
    # Kept as written: the scorer's reading takes end and padding tokens out of an untagged answer.
    assert cap["predictions"] == ["<unk> It is ethanol.</s><unk><unk>", "It is.</s>"]
    assert [extract_answer("molecule_captioning", p) for p in cap["predictions"]] == ["It is ethanol.", "It is."]
    assert "output" not in cap
    assert read_predictions(folder / "molecule_captioning.jsonl") == [cap]


@pytest.mark.parametrize("line, where, half", [
    (b'{"task": "forward_synthesis", "input": "x", "gold": "C", "predictions": ["C"], "\\ud800": 1}',
     "a key", "'\\ud800'"),
    (b'{"task": "forward_synthesis", "input": "x", "gold": "C", "predictions": ["C"], "meta": {"note": "\\udfff"}}',
     "meta.note", "'\\udfff'"),
    (b'{"task": "forward_synthesis", "input": "x", "gold": "C", "predictions": ["C"], "meta": {"l": ["a", "\\ud801"]}}',
     "meta.l[1]", "'\\ud801'"),
])
def test_a_lone_surrogate_is_named_by_where_it_is(tmp_path, line, where, half):
    from llasmol.inference.predictions import read_predictions

    path = tmp_path / "p.jsonl"
    path.write_bytes(line + b"\n")
    with refused(f"{path} line 1", where, half, "UTF-16"):
        read_predictions(path)


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="Python before 3.10.7 reads any number")
def test_an_unreadable_number_or_nesting_is_named_for_what_it_is_whole(tmp_path):
    """Python reads no integer past 4,300 digits and no nesting past its stack: said as such (one wording for every
    JSON-lines reader, `core.files.json_problem`), not cut mid-word and not called bad JSON."""
    from llasmol.core.files import json_problem
    from llasmol.inference.predictions import read_predictions

    path = tmp_path / "p.jsonl"
    path.write_text('{"task": "forward_synthesis", "input": "a", "gold": ' + "9" * 5000 + ', "predictions": []}\n')
    with refused(f"{path} line 1", "holds an integer of more than 4,300 digits, more than Python reads: fix the line"):
        read_predictions(path)
    for text, said in (("[" * 100_000 + "]" * 100_000, "is nested too deeply to read"),
                       ("{", "is not valid JSON (Expecting property name enclosed in double quotes)"),
                       ("9" * 4300, None), (b"\xff", "is not UTF-8 text")):
        try:
            json.loads(text)
        except (ValueError, RecursionError) as err:
            assert json_problem(err).startswith(said), text[:10]
        else:
            assert said is None


def test_a_sigterm_inside_a_guarded_parse_still_stops_the_evaluation():
    """The scorer and parsers never raise on model output (`except Exception`); a SIGTERM landing inside one must
    still stop the evaluation, not be swallowed there (the run then finished with exit status 0)."""
    import os
    import signal
    import time

    from llasmol.inference.jobs import _Terminated, stoppable

    def guarded_parse():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except Exception:
            return None
        return "parsed"

    with pytest.raises(_Terminated), stoppable():
        guarded_parse()


def test_a_second_evaluation_into_the_same_files_is_refused_while_the_first_answers(tmp_path):
    """Two evaluations appending to one partial file would interleave their lines and each count the other's
    as done: the second is refused, in one line, until the first has closed the file."""
    from llasmol.inference.partial import PartialPredictions

    final = tmp_path / "predictions" / "test.jsonl"
    first = PartialPredictions(final, {"ckpt": "a"})
    assert first.resume({0}) == {}
    first.append([{"index": 0, "predictions": ["CCO"]}])
    second = PartialPredictions(final, {"ckpt": "a"})
    with refused(f"{final}.partial", "another evaluation", "hydra.run.dir"):
        second.resume({0})
    first.close()
    assert second.resume({0}) == {0: ["CCO"]}  # the first one's answers, taken over
    second.close()
