"""The DataModule on official-layout data: prompt text, truncation, label masking, sharding, order."""

from __future__ import annotations

import json
import re
from pathlib import Path

import hydra
import pytest
import torch
from conftest import MAX_LENGTH, QUICK, SEED, TWO_TASKS, compose_config, make_datamodule
from refusals import error_line, refused, run_cli
from smolinstruct_fixture import TASKS, write_smolinstruct

from llasmol.core.smiles import canonical_kekule
from llasmol.core.tasks import TASK_NAMES
from llasmol.data.datamodule import SMolInstructDataModule
from llasmol.data.formatting import (
    IGNORE_INDEX,
    PromptFormatter,
    resolve_prompt_template,
)
from llasmol.data.sampler import PADDING, ShardedShuffleSampler
from llasmol.data.smolinstruct import SMolInstructSplit
from llasmol.model.base import load_tokenizer

FIXTURE_TASKS = list(TASKS)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(compose_config(["paths.output_dir=/tmp/unused"]).model)


def make_dm(tokenizer, root, **kw) -> SMolInstructDataModule:
    return make_datamodule(tokenizer, path=None if root is None else str(root), tasks=kw.pop("tasks", FIXTURE_TASKS),
                           **kw)


def test_samples_render_templates_with_core_tags(smol_root):
    split = SMolInstructSplit(smol_root, "train", ["name_conversion-s2f", "property_prediction-sider"])
    first = split[0]
    # Molecule 0 (CCO) uses template 0 of the formula task.
    assert first["input"] == "Give the formula of <SMILES> CCO </SMILES> ."
    assert first["output"] == "Its formula is <MOLFORMULA> C2H6O </MOLFORMULA> ."
    assert (first["raw_input"], first["raw_output"]) == ("CCO", "C2H6O")
    # SIDER's raw output is a dict; the sample list picks the target.
    n_formula = split.counts()["name_conversion-s2f"]
    sider = split[n_formula + 1]  # the second train molecule, k=1: odd -> hepatobiliary target
    assert sider["task"] == "property_prediction-sider"
    assert sider["output"] == "<BOOLEAN> Yes </BOOLEAN>"


def test_core_tags_can_be_left_out_and_selfies_switched_on(smol_root):
    plain = SMolInstructSplit(smol_root, "train", ["name_conversion-s2f"], insert_core_tags=False)[0]
    assert plain["input"] == "Give the formula of CCO ." and "<" not in plain["output"]
    selfies = SMolInstructSplit(smol_root, "train", ["name_conversion-s2f"], representation="selfies")[0]
    assert selfies["input"] == "Give the formula of <SELFIES> [C][C][O] </SELFIES> ."
    assert selfies["output"] == "Its formula is <MOLFORMULA> C2H6O </MOLFORMULA> ."  # only SMILES becomes SELFIES


def test_prompt_follows_the_paper_format(tokenizer, smol_root):
    dm = make_dm(tokenizer, smol_root, tasks=["name_conversion-s2f"])
    item = dm.dataset("train")[0]
    text = tokenizer.decode(item["input_ids"])
    assert text == (
        "<s>[INST] Give the formula of <SMILES> CCO </SMILES> . [/INST] "
        "Its formula is <MOLFORMULA> C2H6O </MOLFORMULA> .</s>"
    )
    assert item["labels"] == item["input_ids"]  # the paper trains on inputs too
    assert item["truncated"] is False


def test_truncation_at_the_limit_is_counted(tokenizer, smol_root):
    full = make_dm(tokenizer, smol_root, tasks=["forward_synthesis"]).dataset("train")
    limit = 12
    cut = make_dm(tokenizer, smol_root, tasks=["forward_synthesis"], max_length=limit).dataset("train")
    for i in range(len(full)):
        long, short = full[i]["input_ids"], cut[i]["input_ids"]
        if len(long) <= limit:
            assert short == long and not cut[i]["truncated"]
        else:
            # Cut at the limit, EOS dropped (as the paper's scripts do), and flagged.
            assert short == long[:limit] and cut[i]["truncated"]
            assert short[-1] != tokenizer.eos_token_id
    assert sum(cut[i]["truncated"] for i in range(len(cut))) > 0


def test_prompt_tokens_are_masked_when_not_training_on_inputs(tokenizer, smol_root):
    dm = make_dm(tokenizer, smol_root, tasks=["property_prediction-esol"], train_on_inputs=False)
    data = dm.dataset("train")
    for i in range(len(data)):
        item = data[i]
        sample = data.split[i]
        ids, labels = list(item["input_ids"]), list(item["labels"])
        # Exactly the prompt's own tokens are masked, each one; from the first answer token on, every
        # label is its input id (decoded text would hide one token too many or too few).
        n_prompt = len(dm.formatter.prompt_ids(sample["input"]))
        assert 0 < n_prompt < len(ids)
        assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
        assert labels[n_prompt:] == ids[n_prompt:] and IGNORE_INDEX not in labels[n_prompt:]
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[n_prompt:-1]) == " " + sample["output"]  # the separator space, then the answer
        assert tokenizer.decode(ids[:n_prompt], skip_special_tokens=False).startswith("<s>[INST]")


def collect(dm, name, shuffle, world, workers):
    seen = []
    for rank in range(world):
        dm.num_workers = workers
        loader = dm.dataloader(name, shuffle=shuffle, batch_size=3, rank=rank, world_size=world)
        seen.append([int(i) for batch in loader for i in batch["index"]])
    return seen


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_ranks_two_workers_see_disjoint_and_complete_shares(tokenizer, smol_root, shuffle):
    dm = make_dm(tokenizer, smol_root)
    n = len(dm.split("train"))
    shares = collect(dm, "train", shuffle, world=2, workers=2)
    flat = shares[0] + shares[1]
    assert len(flat) == len(set(flat))  # no sample twice, across ranks or workers
    if shuffle:  # training: equal shares for lock-step DDP; at most world-1 samples left for next epoch
        assert len(shares[0]) == len(shares[1]) == n // 2
    else:  # evaluation: every sample exactly once
        assert sorted(flat) == list(range(n))
    # Two workers per rank return exactly what one process would.
    assert collect(dm, "train", shuffle, world=2, workers=0) == shares


def test_order_is_deterministic_for_a_seed_and_changes_with_epoch():
    a = ShardedShuffleSampler(100, seed=SEED, rank=0, world_size=1)
    b = ShardedShuffleSampler(100, seed=SEED, rank=0, world_size=1)
    assert list(a) == list(b) and list(a) != list(range(100))
    assert list(ShardedShuffleSampler(100, seed=SEED + 1, rank=0, world_size=1)) != list(a)
    b.set_epoch(1)
    assert list(b) != list(a) and sorted(b) == sorted(a)
    # The global order does not depend on the number of ranks: rank shares interleave it.
    two = [list(ShardedShuffleSampler(100, seed=SEED, rank=r, world_size=2)) for r in range(2)]
    assert [x for pair in zip(*two) for x in pair] == list(a)


@pytest.mark.parametrize("group_by_length", [False, True])
def test_two_fresh_datamodules_with_one_seed_serve_the_same_batches(tokenizer, smol_root, group_by_length):
    def served(seed):
        dm = make_dm(tokenizer, smol_root, seed=seed, group_by_length=group_by_length)
        loader = dm.dataloader("train", shuffle=True, batch_size=3, rank=0, world_size=1)
        return [[int(i) for i in batch["index"]] for batch in loader]

    first = served(SEED)
    assert served(SEED) == first
    assert served(SEED + 1) != first and sorted(sum(served(SEED + 1), [])) == sorted(sum(first, []))


def test_the_data_group_builds_the_paper_setup_and_the_library_restates_no_setting(tokenizer, smol_root):
    """conf/ is the one home of a setting: the data group's DataModule has the paper's seed, token budget and
    prompt; the DataModule and the evaluation callback take every setting from their config group, and a
    shuffled order or a drawn subset needs the seed given."""
    import inspect

    from llasmol.finetune.validation import GenerationEvaluator
    from llasmol.inference.pipeline import Samples

    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    assert (cfg.seed, cfg.data.max_length, cfg.generation.max_prompt_tokens) == (SEED, MAX_LENGTH, MAX_LENGTH) == (13, 512, 512)
    dm = make_dm(tokenizer, smol_root)
    assert dm.seed == SEED and dm.formatter.max_length == MAX_LENGTH
    assert dm.formatter.prompt_template == resolve_prompt_template(cfg.model.prompt_template)
    for built, group in ((SMolInstructDataModule, cfg.data), (GenerationEvaluator, cfg.callbacks.generation_evaluator)):
        restated = [name for name, p in inspect.signature(built).parameters.items()
                    if name in group and p.default is not inspect.Parameter.empty]
        # a run folder, intervals and progress lines: optional (None: none)
        assert restated in ([], ["output_dir", "intervals", "progress_every_s"]), restated
    with pytest.raises(ValueError, match="seed"):
        ShardedShuffleSampler(10, rank=0, world_size=1)
    with pytest.raises(ValueError, match="seed"):
        Samples.of(dm.source, "validation", 2)
    assert PromptFormatter(tokenizer).max_length is None  # a formatter alone cuts nothing


def test_batches_pad_right_and_mask_padding(tokenizer, smol_root):
    dm = make_dm(tokenizer, smol_root, micro_batch_size=4, effective_batch_size=8)
    batch = next(iter(dm.dataloader("train", shuffle=True, batch_size=4, rank=0, world_size=1)))
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape[1] == int(lengths.max())
    pad = batch["attention_mask"] == 0
    assert torch.all(batch["labels"][pad] == IGNORE_INDEX)
    assert torch.all(batch["input_ids"][pad] == tokenizer.pad_token_id)


def test_gradient_accumulation_is_computed_from_the_effective_batch(tokenizer, smol_root):
    dm = make_dm(tokenizer, smol_root, micro_batch_size=4, effective_batch_size=512)
    assert dm.gradient_accumulation(1) == 128
    assert dm.gradient_accumulation(4) == 32
    with refused("data.effective_batch_size=512", "data.micro_batch_size=4", "3 device(s)"):
        dm.gradient_accumulation(3)


def test_unknown_task_is_named(tokenizer, smol_root):
    with refused("forward_synthesys", "data.tasks"):
        make_dm(tokenizer, smol_root, tasks=["forward_synthesys"])


def test_missing_task_file_is_named(tokenizer, smol_root):
    dm = make_dm(tokenizer, smol_root, tasks=["molecule_captioning"])
    with refused("data.tasks names molecule_captioning, which none of the data holds", "it holds forward_synthesis"):
        dm.split("train")


def test_a_copy_lacking_tasks_is_said_but_the_bundled_excerpt_is_not(smol_root, caplog):
    """A copy that lost task files warns at every command; the bundled excerpt lacks 3 tasks by design, which
    the report says once (issue #28 item 8)."""
    from llasmol.data.source import BUNDLED_DATA, SMolInstructSource

    with caplog.at_level("WARNING", logger="llasmol.data.source"):
        assert len(SMolInstructSource(path=str(BUNDLED_DATA)).task_names()) == 11
        assert not caplog.records
        assert len(SMolInstructSource(path=str(smol_root)).task_names()) == 5
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["data: 5 of 14 tasks"]


# -- the bundled sample (issue: embedded sample of SMolInstruct) ------------------------------------

TAGGED = re.compile(r"<(SMILES|IUPAC|MOLFORMULA|NUMBER|BOOLEAN)> (.+?) </\1>")


def provenance_counts(root) -> dict[str, dict[str, int]]:
    counts = {}
    for line in (root / "PROVENANCE.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].isdigit():
            counts[cells[0]] = {"train": int(cells[1]), "validation": int(cells[2]), "test": int(cells[3])}
    return counts


def test_bundled_data_loads_through_the_datamodule(tokenizer):
    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    dm = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    from pathlib import Path

    expected = provenance_counts(Path(cfg.data.path))
    assert cfg.data.tasks is None and dm.tasks == [t for t in TASK_NAMES if t in expected]  # found, table order
    # Related tasks share one split assignment: the four name conversions share molecules; each
    # property task is split on its own (a molecule may be in lipo-train and bbbp-test).
    molecules_by_split: dict[str, set[tuple[str, str]]] = {}
    for name in ("train", "validation", "test"):
        data = dm.dataset(name)
        assert data.split.counts() == {t: expected[t][name] for t in dm.tasks}
        smiles_here = set()
        for i in range(len(data.split)):
            sample = data.split[i]
            tagged = TAGGED.findall(sample["output"])
            assert len(tagged) == 1, sample["output"]  # every answer is inside exactly one tag pair
            for tag, value in TAGGED.findall(sample["input"]) + tagged:
                if tag == "SMILES":
                    assert canonical_kekule(value) == value  # the archive's canonical Kekule form
                    if sample["task"].startswith(("name_conversion", "property_prediction")):
                        group = "name_conversion" if sample["task"].startswith("name") else sample["task"]
                        smiles_here.add((group, value))
                if tag == "BOOLEAN":
                    assert value in ("Yes", "No")
                if tag == "NUMBER":
                    float(value)
        molecules_by_split[name] = smiles_here
    assert not molecules_by_split["train"] & molecules_by_split["validation"]
    assert not molecules_by_split["train"] & molecules_by_split["test"]
    assert not molecules_by_split["validation"] & molecules_by_split["test"]


# -- the Hub archive -----------------------------------------------------------------------------


def test_hub_archive_is_fetched_once_and_read_like_a_local_copy(tokenizer, smol_root, tmp_path, monkeypatch):
    import shutil

    import huggingface_hub

    archive = shutil.make_archive(str(tmp_path / "data"), "zip", root_dir=smol_root.parent, base_dir=smol_root.name)
    calls = []

    def fake_download(repo_id, filename, repo_type, revision=None, local_files_only=False):
        calls.append((repo_id, filename, repo_type, revision))
        return archive

    import llasmol.core.offline

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: None)  # as if online
    monkeypatch.setenv("LLASMOL_CACHE", str(tmp_path / "cache"))
    for _ in range(2):
        dm = make_dm(tokenizer, None)
        dm.prepare_data()
        local = make_dm(tokenizer, smol_root)
        assert [dm.split("validation")[i] for i in range(5)] == [local.split("validation")[i] for i in range(5)]
    # The Hub is asked each time (has `main` moved?), the same archive content is extracted once.
    assert calls == [("osunlp/SMolInstruct", "data.zip", "dataset", "main")] * 2
    main = tmp_path / "cache" / "osunlp--SMolInstruct@main"
    assert len(list(main.iterdir())) == 1
    # Another revision is cached apart; offline, the newest extraction of a revision is used.
    make_dm(tokenizer, None, revision="v1.0.0").prepare_data()
    assert calls[-1] == ("osunlp/SMolInstruct", "data.zip", "dataset", "v1.0.0")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "osunlp--SMolInstruct@main", "osunlp--SMolInstruct@v1.0.0"]
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: "HF_HUB_OFFLINE is set")
    offline = make_dm(tokenizer, None)
    offline.prepare_data()
    assert len(calls) == 3 and Path(offline.path).is_relative_to(main)


def test_the_test_subset_reads_its_samples_from_the_full_test_split(tokenizer, smol_root):
    """data.splits.test=test_subset: the subset's sample lists index raw/test (the official loader)."""
    full = make_dm(tokenizer, smol_root).split("test")
    subset = make_dm(tokenizer, smol_root, splits={"train": "train", "validation": "dev", "test": "test_subset"})
    sub = subset.split("test")
    for task, n in full.counts().items():
        assert sub.counts()[task] == (n + 1) // 2
    starts = dict(zip(full.tasks, [0, *list(__import__("itertools").accumulate(full.counts().values()))]))
    sub_starts = dict(zip(sub.tasks, [0, *list(__import__("itertools").accumulate(sub.counts().values()))]))
    for task in full.tasks:
        for j in range(sub.counts()[task]):
            assert sub[sub_starts[task] + j] == full[starts[task] + 2 * j]
    # Golds pool over the whole test split, as the official scorer reads them, not over the subset.
    assert subset.source.pooling_split("test").counts() == full.counts()
    whole = make_dm(tokenizer, smol_root)
    assert whole.source.pooling_split("test") is whole.split("test")
    missing = make_dm(tokenizer, smol_root, splits={"train": "train", "validation": "dev", "test": "dev_subset"})
    with refused("dev_subset", "v1.2.0", "data.revision"):
        missing.split("test")


def test_unreachable_hub_says_how_to_use_a_local_copy(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("LLASMOL_CACHE", str(tmp_path / "cache"))
    dm = make_dm(tokenizer, None, hub_id="osunlp/SMolInstruct")
    with refused("osunlp/SMolInstruct", "data.path="):
        dm.prepare_data()


# -- length-grouped batching ----------------------------------------------------------------------


def padding_fraction(loader) -> float:
    real = total = 0
    for batch in loader:
        real += int(batch["attention_mask"].sum())
        total += batch["attention_mask"].numel()
    return 1 - real / total


def test_grouping_by_length_keeps_the_epoch_and_cuts_padding(tokenizer):
    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    grouped = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    plain = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, group_by_length=False, _convert_="all")
    order = lambda dm: list(dm.dataloader("train", shuffle=True, batch_size=4, rank=0, world_size=1).sampler)  # noqa: E731
    assert sorted(order(grouped)) == sorted(order(plain))  # the same samples, once each
    # Deterministic for the seed: a second DataModule built from the same config draws the same order,
    # and another seed draws another.
    again = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    reseeded = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, seed=cfg.data.seed + 1, _convert_="all")
    assert order(again) == order(grouped) != order(reseeded)
    loaders = [dm.dataloader("train", shuffle=True, batch_size=4, rank=0, world_size=1) for dm in (plain, grouped)]
    random_pad, grouped_pad = padding_fraction(loaders[0]), padding_fraction(loaders[1])
    assert grouped_pad < random_pad / 2, (random_pad, grouped_pad)
    # Evaluation order is untouched.
    assert list(grouped.dataloader("validation", False, 4, 0, 1).sampler) == list(range(len(grouped.split("validation"))))


def test_length_hints_follow_token_lengths(tokenizer):
    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    data = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all").dataset("validation")
    hints = data.split.length_hints()
    tokens = [len(data[i]["input_ids"]) for i in range(len(data))]
    import numpy as np

    rank = lambda a: np.argsort(np.argsort(a))  # noqa: E731
    assert np.corrcoef(rank(hints), rank(tokens))[0, 1] > 0.85  # Spearman correlation


def test_sample_lists_read_element_by_element_equal_json_load():
    import json

    from llasmol.core.config import PACKAGE_DIR
    from llasmol.data.smolinstruct import _read_sample_list

    files = sorted((PACKAGE_DIR / "data" / "bundled" / "sample" / "instruction_tuning").glob("*/*.json"))
    assert len(files) == 33  # 11 tasks × 3 splits
    for path in files:
        record = json.loads(path.read_text())
        header, idx, template_id, targets = _read_sample_list(path, path.stem, None)
        assert header == {k: v for k, v in record.items() if k != "samples"}
        assert idx.tolist() == [s["idx"] for s in record["samples"]]
        assert template_id.tolist() == [s["template_id"] for s in record["samples"]]
        plain = [s.get("target") for s in record["samples"]]
        assert targets == (plain if any(t is not None for t in plain) else None)
        assert _read_sample_list(path, path.stem, 7)[1].tolist() == idx[:7].tolist()


@pytest.mark.parametrize("text", [
    '{"samples": [{"idx": 0, "template_id": 0},]}', '{"samples": []} trailing', '{"samples": [', '[]', '{}',
    '{"samples": [{"template_id": 0}]}', '{"samples": [{"idx": 0, "template_id": 0}]',
])
def test_a_broken_sample_list_is_one_line_naming_the_file(tmp_path, text):
    from llasmol.data.smolinstruct import _read_sample_list

    path = tmp_path / "task.json"
    path.write_text(text)
    with refused(path):
        _read_sample_list(path, "task", None)


@pytest.mark.parametrize("key, value", [("idx", "true"), ("idx", '"3"'), ("idx", "1.5"), ("idx", str(2 ** 63)),
                                        ("template_id", "false"), ("template_id", "null"), ("template_id", str(2 ** 31))])
def test_a_line_number_that_is_no_whole_number_is_named_not_read(tmp_path, key, value):
    """`true` was read as line 1 and `"3"` as a missing field: each is one line naming the field and its value."""
    from llasmol.data.smolinstruct import _read_sample_list

    sample = {"idx": "0", "template_id": "0", key: value}
    path = tmp_path / "task.json"
    path.write_text('{"samples": [{"idx": 0, "template_id": 0}, {' + ", ".join(f'"{k}": {v}' for k, v in sample.items())
                    + "}]}")
    with refused("sample 1", path, f"{key}={value}"):
        _read_sample_list(path, "task", None)


def test_raw_line_index_equals_a_line_by_line_scan(tmp_path):
    import random

    from llasmol.data import smolinstruct

    rng = random.Random(3)
    choices = [b"", b"  ", b"\t", b"{not json", None]
    lines = [c if (c := rng.choice(choices)) is not None else b'{"input": "' + b"C" * rng.randint(0, 9000) + b'", "output": "O"}'
             for _ in range(400)]
    for ending in (b"\n", b""):
        path = tmp_path / "raw.jsonl"
        path.write_bytes(b"\n".join(lines) + ending)
        offsets, sizes, bad = smolinstruct._line_offsets(path)
        expected, broken, pos = [], {}, 0
        for number, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
            if line.strip():
                if line.startswith(b"{not"):
                    broken[len(expected)] = number  # the line in the file, blank lines counted
                expected.append((pos, len(line)))
            pos += len(line)
        assert list(zip(offsets.tolist(), sizes.tolist())) == expected
        assert {i: int(where.split()[1]) for i, where in bad.items()} == broken and broken


def test_a_sampler_given_part_of_its_world_asks_the_process_group_for_both():
    from llasmol.data.sampler import ShardedShuffleSampler

    for given in ({"world_size": 1}, {"rank": 0}):
        sampler = ShardedShuffleSampler(10, seed=1, **given)
        assert (sampler.rank, sampler.world_size) == (0, 1)  # no process group: one process
        assert sorted(sampler) == list(range(10))


def test_micro_batches_of_one_sample_are_not_grouped_by_length():
    import numpy as np

    from llasmol.data.sampler import ShardedShuffleSampler

    lengths = np.arange(200)[::-1].copy()
    plain = list(ShardedShuffleSampler(200, seed=5, rank=0, world_size=1))
    one = list(ShardedShuffleSampler(200, seed=5, rank=0, world_size=1, lengths=lengths, batch_size=1))
    assert one == plain  # nothing to pad in a batch of one: the shuffle stays as it is
    four = list(ShardedShuffleSampler(200, seed=5, rank=0, world_size=1, lengths=lengths, batch_size=4))
    assert sorted(four) == sorted(plain) and four != plain


@pytest.mark.parametrize("broken,line,why", [
    ('{"idx": 5, "template_id": 0,}', 10, "Expecting property name"),  # the decoder's own error, inside a sample
    ('{"idx": 5 "template_id": 0}', 10, "Expecting ','"),
    ('7', 10, None),  # a sample that is no object: the sample's own line is in the other message
])
def test_a_broken_sample_names_the_line_it_is_on_in_the_file(tmp_path, broken, line, why):
    """Line numbers count from the top of the file (pretty-printed lists put one sample per line, as the official
    files do)."""
    from llasmol.data.smolinstruct import _read_sample_list

    samples = [f'    {{"idx": {i}, "template_id": 0}}' for i in range(7)] + [f"    {broken}", '    {"idx": 9, "template_id": 0}']
    path = tmp_path / "task.json"
    path.write_text('{"split": "train",\n  "samples": [\n' + ",\n".join(samples) + "\n  ]\n}\n")
    assert path.read_text().splitlines()[line - 1].strip().rstrip(",") == broken
    with refused(path, *(["sample 7 of"] if why is None else [f"({why}", f"at line {line})"])):
        _read_sample_list(path, "task", None)


def test_a_split_closes_the_raw_files_it_opened_and_reopens_them_when_read_again(smol_root):
    split = SMolInstructSplit(smol_root, "train", ["name_conversion-s2f", "property_prediction-sider"])
    first = split[0]["raw_input"]
    opened = list(split._handles.values())
    assert opened and not any(fh.closed for fh in opened)
    split.close()
    assert all(fh.closed for fh in opened) and split._handles == {}
    assert split[0]["raw_input"] == first  # read again: opened again
    # In a forked DataLoader worker the handles it inherited are its parent's: the worker leaves them open.
    inherited = list(split._handles.values())
    split._pid = -1
    split.close()
    assert not any(fh.closed for fh in inherited) and split._handles == {}
    for fh in inherited:
        fh.close()


@pytest.mark.parametrize("loader_first", [False, True])
def test_the_training_data_position_restored_before_or_after_the_loader_is_built_continues_the_epoch(
        tokenizer, smol_root, loader_first):
    """Lightning restores the DataModule's state before it builds the train loader on a resume (the position
    waits for the loader); restored into a DataModule whose loader exists, it applies at once."""
    def batches(loader, n):
        it = iter(loader)
        return [next(it)["input_ids"].tolist() for _ in range(n)]

    kw = dict(tasks=["name_conversion-s2f"], micro_batch_size=2, effective_batch_size=2)
    first = make_dm(tokenizer, smol_root, **kw)
    first.setup("fit")
    loader = first.train_dataloader()
    whole = batches(loader, 5)
    loader = first.train_dataloader()
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = first.state_dict()
    assert state and "train_position" in state
    resumed = make_dm(tokenizer, smol_root, **kw)
    resumed.setup("fit")
    if loader_first:
        restored = resumed.train_dataloader()
        resumed.load_state_dict(state)
    else:
        resumed.load_state_dict(state)
        restored = resumed.train_dataloader()
    assert batches(restored, 2) == whole[3:5]


def test_each_process_of_a_launch_reads_its_own_share_of_the_data(tokenizer, smol_root):
    from types import SimpleNamespace

    dm = make_dm(tokenizer, smol_root, tasks=["name_conversion-s2f"], micro_batch_size=2, effective_batch_size=4)
    dm.setup("fit")
    alone = dm.train_dataloader().sampler
    dm.trainer = SimpleNamespace(global_rank=1, world_size=2)  # what Lightning attaches under DDP
    second = dm.train_dataloader().sampler
    assert (second.rank, second.world_size) == (1, 2) and len(second) * 2 >= len(alone) >= len(second)


def test_under_two_processes_both_ranks_run_as_many_evaluation_batches(tokenizer, smol_root):
    """The shorter share ends in a padding row that carries no loss (a sharded forward is collective: a rank with
    a batch fewer would leave the other waiting), and the real rows are every sample once."""
    from types import SimpleNamespace

    from llasmol.data.formatting import IGNORE_INDEX

    dm = make_dm(tokenizer, smol_root, tasks=["name_conversion-s2f"], micro_batch_size=2, max_samples_per_task={"validation": 5})
    dm.setup("validate")
    loaders = []
    for rank in (0, 1):
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
        loaders.append(list(dm.val_dataloader()))
    assert [len(batches) for batches in loaders] == [2, 2]  # shares of 3 and 2 (+1 padding), batches of 2
    last = loaders[1][-1]
    assert last["index"].tolist() == [PADDING] and last["labels"].tolist() == [[IGNORE_INDEX]]
    assert last["input_ids"].tolist() == [[tokenizer.eos_token_id]] and not last["truncated"].any()
    real = [i for batches in loaders for b in batches for i in b["index"].tolist() if i != PADDING]
    assert sorted(real) == list(range(5))


# -- the sampler's arithmetic, by hand ----------------------------------------------------------------


def test_even_shares_drop_the_remainder_and_uneven_shares_cover_every_sample():
    import numpy as np

    even = [ShardedShuffleSampler(11, seed=3, rank=r, world_size=2) for r in range(2)]  # even=True by default
    assert [len(s) for s in even] == [5, 5] and [len(list(s)) for s in even] == [5, 5]
    flat = list(even[0]) + list(even[1])
    assert len(set(flat)) == 10  # one sample of the 11 waits for another epoch
    # Evaluation: every sample once, and a share one short padded, so every rank runs as many batches.
    uneven = [ShardedShuffleSampler(11, seed=3, rank=r, world_size=2, even=False) for r in range(2)]
    assert [len(s) for s in uneven] == [6, 6] and [len(list(s)) for s in uneven] == [6, 6]
    assert list(uneven[1])[-1] == PADDING and PADDING not in list(uneven[0])
    assert sorted(list(uneven[0]) + list(uneven[1])[:-1]) == list(range(11))
    three = [ShardedShuffleSampler(11, seed=3, rank=r, world_size=3, shuffle=False, even=False) for r in range(3)]
    assert [list(s) for s in three] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, PADDING]]
    alone = ShardedShuffleSampler(11, shuffle=False, rank=0, world_size=1, even=False)
    assert list(alone) == list(range(11)) and len(alone) == 11  # one process: nothing to pad
    assert [len(ShardedShuffleSampler(11, seed=3, rank=r, world_size=3)) for r in range(3)] == [3, 3, 3]
    # The order array is int32 while it fits (half the memory of int64).
    assert ShardedShuffleSampler(100, seed=3, rank=0, world_size=1)._order().dtype == np.int32


@pytest.mark.parametrize("rank,world", [(2, 2), (-1, 2), (1, 1)])
def test_a_rank_outside_its_world_is_refused(rank, world):
    with pytest.raises(ValueError, match=f"rank {rank} outside world of size {world}"):
        ShardedShuffleSampler(10, seed=3, rank=rank, world_size=world)


def test_rank_and_world_come_from_the_process_group_when_one_is_running(monkeypatch):
    from llasmol.data import sampler as sampler_mod

    monkeypatch.setattr(sampler_mod.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(sampler_mod.dist, "get_rank", lambda: 2)
    monkeypatch.setattr(sampler_mod.dist, "get_world_size", lambda: 3)
    sampler = ShardedShuffleSampler(9, shuffle=False)
    assert (sampler.rank, sampler.world_size) == (2, 3) and list(sampler) == [2, 5, 8]


def test_a_resumed_epoch_skips_its_done_part_once():
    sampler = ShardedShuffleSampler(20, seed=4, rank=0, world_size=1)
    whole = list(sampler)
    sampler.start = 6
    assert list(sampler) == whole[6:] and len(sampler) == 20  # the length is the whole epoch's
    assert list(sampler) == whole  # the next pass starts at the beginning


def test_length_groups_are_whole_batches_of_neighbouring_lengths_with_a_short_batch_last():
    import numpy as np

    lengths = np.array([5, 80, 12, 33, 71, 2, 64, 18, 47, 90, 26])  # all different
    plain = list(ShardedShuffleSampler(11, seed=7, rank=0, world_size=1))
    grouped = list(ShardedShuffleSampler(11, seed=7, rank=0, world_size=1, lengths=lengths, batch_size=4))
    by_length = sorted(range(11), key=lambda i: -lengths[i])
    assert sorted(grouped) == sorted(plain)
    # 11 samples in one window: two full batches of 4 (the 4 longest, the next 4) in shuffled order, and the
    # 3 shortest last.
    assert set(grouped[8:]) == set(by_length[8:])
    assert {frozenset(grouped[:4]), frozenset(grouped[4:8])} == {frozenset(by_length[:4]), frozenset(by_length[4:8])}
    # Evaluation order (no shuffle) is never regrouped.
    still = ShardedShuffleSampler(11, rank=0, world_size=1, shuffle=False, lengths=lengths, batch_size=4)
    assert list(still) == list(range(11))


def test_length_groups_stay_within_windows_of_64_batches():
    """Grouping sorts within windows of `group_window` (64 by default) micro-batches of the shuffle: the
    samples of each window's positions are the plain shuffle's samples there."""
    import numpy as np

    lengths = np.random.default_rng(0).permutation(300)
    plain = list(ShardedShuffleSampler(300, seed=9, rank=0, world_size=1))
    grouped = list(ShardedShuffleSampler(300, seed=9, rank=0, world_size=1, lengths=lengths, batch_size=2))
    for start in (0, 128, 256):
        assert set(grouped[start : start + 128]) == set(plain[start : start + 128]), start
    small = list(ShardedShuffleSampler(300, seed=9, rank=0, world_size=1, lengths=lengths, batch_size=2,
                                       group_window=3))
    for start in range(0, 300, 6):
        assert set(small[start : start + 6]) == set(plain[start : start + 6]), start
    # Within a window the batches are the window's samples sorted by length and cut in pairs.
    window = sorted(plain[:6], key=lambda i: -lengths[i])
    assert {frozenset(small[i : i + 2]) for i in (0, 2, 4)} == {frozenset(window[i : i + 2]) for i in (0, 2, 4)}


# -- SMolInstructSplit: edges of the official layout ------------------------------------------------


@pytest.fixture
def own_root(tmp_path):
    """A fixture copy of two tasks that a test may change (the session's `smol_root` is shared)."""
    from smolinstruct_fixture import write_smolinstruct

    return write_smolinstruct(tmp_path / "data", tasks=("name_conversion-s2f", "property_prediction-sider"))


def _edit_json(path, change):
    import json

    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _samples(root, split, task):
    return root / "sample" / "instruction_tuning" / split / f"{task}.json"


def test_selfies_come_from_raw_selfies_when_the_archive_has_them(own_root):
    import json

    task = "name_conversion-s2f"
    raw = (own_root / "raw" / "train" / f"{task}.jsonl").read_text().splitlines()
    first = json.loads(raw[0])
    (own_root / "raw_selfies" / "train").mkdir(parents=True)
    # A SELFIES string no encoder would write for CCO: it must have been read from raw_selfies/, as is.
    (own_root / "raw_selfies" / "train" / f"{task}.jsonl").write_text(
        "\n".join([json.dumps({**first, "input": "[O][C][C]"}), *raw[1:]]) + "\n")
    _edit_json(own_root / "template" / "instruction_tuning" / f"{task}.json",
               lambda t: t[0].update(input="Give the formula of the SMILES <INPUT> ."))
    selfies = SMolInstructSplit(own_root, "train", [task], representation="selfies")[0]
    assert selfies["input"] == "Give the formula of the SELFIES <SELFIES> [O][C][C] </SELFIES> ."
    assert selfies["raw_input"] == "[O][C][C]"
    smiles = SMolInstructSplit(own_root, "train", [task])[0]  # SMILES still come from raw/
    assert smiles["input"] == "Give the formula of the SMILES <SMILES> CCO </SMILES> ."


def test_selfies_encoded_on_the_fly_cover_smiles_answers_too(smol_root):
    sample = SMolInstructSplit(smol_root, "train", ["forward_synthesis"], representation="selfies")[0]
    # Molecule 0 (CCO): input "CCO.O", output "CCO", template 0.
    assert sample["input"] == "What is the product of <SELFIES> [C][C][O].[O] </SELFIES> ?"
    assert sample["output"] == "The product is <SELFIES> [C][C][O] </SELFIES> ."


def test_unknown_representation_is_refused(smol_root):
    with refused("data.representation", "inchi"):
        SMolInstructSplit(smol_root, "train", ["forward_synthesis"], representation="inchi")


@pytest.mark.parametrize("side,text", [("input", "formula please"), ("output", "it is this")])
def test_a_template_lacking_its_placeholder_is_refused(own_root, side, text):
    task = "name_conversion-s2f"
    _edit_json(own_root / "template" / "instruction_tuning" / f"{task}.json", lambda t: t[1].update({side: text}))
    with refused("template 1", f"template/instruction_tuning/{task}.json", "<INPUT>", "<OUTPUT>"):
        SMolInstructSplit(own_root, "train", [task])


def test_a_template_id_past_the_last_template_is_refused(own_root):
    task = "name_conversion-s2f"  # two templates: ids 0 and 1
    _edit_json(_samples(own_root, "train", task), lambda r: r["samples"][3].update(template_id=2))
    with refused("template_id 2", task, "2 exist"):
        SMolInstructSplit(own_root, "train", [task])
    _edit_json(_samples(own_root, "train", task), lambda r: r["samples"][3].update(template_id=-1))
    with refused("template_id -1", task, "ids start at 0"):
        SMolInstructSplit(own_root, "train", [task])


@pytest.mark.parametrize("bad", [24, -1])  # the raw file has lines 0..23
def test_a_sample_index_outside_the_raw_file_is_refused(own_root, bad):
    task = "name_conversion-s2f"
    assert len((own_root / "raw" / "train" / f"{task}.jsonl").read_text().splitlines()) == 24
    _edit_json(_samples(own_root, "train", task), lambda r: r["samples"][3].update(idx=bad))
    with refused(f"sample index {bad}", f"{task}.jsonl", "24 lines"):
        SMolInstructSplit(own_root, "train", [task])


def test_skipping_a_bad_line_drops_all_its_samples_and_keeps_the_others_targets(own_root, caplog):
    task = "property_prediction-sider"  # a multi-target task: each sample names its target
    strict = SMolInstructSplit(own_root, "train", [task])
    before = [strict[i] for i in range(len(strict))]
    assert len(before) == 24
    _edit_json(_samples(own_root, "train", task),
               lambda r: r["samples"].append({**r["samples"][2], "template_id": 1}))  # a 2nd sample of line 2
    raw = own_root / "raw" / "train" / f"{task}.jsonl"
    lines = raw.read_text().splitlines()
    lines[2] = '{"input": "CCO", "output": '
    raw.write_text("\n".join(lines) + "\n")
    with caplog.at_level("WARNING", logger="llasmol.data.smolinstruct"):
        lenient = SMolInstructSplit(own_root, "train", [task], skip_bad_lines=True)
    assert lenient.skipped == {task: 2} and len(lenient) == 23
    assert [lenient[i] for i in range(23)] == before[:2] + before[3:]
    assert [r.getMessage() for r in caplog.records] == [f"{raw}: skipped 2 sample(s) on 1 malformed line(s)"]


def test_a_raw_file_replaced_or_rewritten_while_a_split_reads_it_is_named_and_never_mixed(own_root):
    """Samples are read at byte offsets indexed at start-up. A file replaced by a rename under an open handle is
    still the indexed one, so reads go on unchanged; a handle opened after the change, or a file rewritten in
    place, is one line naming the file, never another line's text read as this sample."""
    import os

    task = "name_conversion-s2f"
    raw = own_root / "raw" / "train" / f"{task}.jsonl"
    lines = raw.read_text().splitlines()
    split = SMolInstructSplit(own_root, "train", [task])
    before = [split[i] for i in range(len(split))]
    new = raw.with_name("new.jsonl")
    new.write_text("\n".join(reversed(lines)) + "\n")  # the same lines, so the same size, in another order
    os.replace(new, raw)
    assert [split[i] for i in range(len(split))] == before  # the open handle is the indexed file
    split.close()
    with refused(str(raw), "changed while this run was reading it"):
        split[0]
    split = SMolInstructSplit(own_root, "train", [task])
    split[0]
    with raw.open("r+") as fh:  # rewritten in place: same file, other bytes at the indexed offsets
        fh.write('{"input": "CCO"}')
    with refused(str(raw), "changed while this run was reading it"):
        split[1]
    split.close()


def test_training_stops_with_one_line_when_its_data_file_changes_mid_run(own_root, cfg_factory, monkeypatch):
    """The change lands after the first step's samples were read: the run stops naming the file, and the
    checkpoint of the steps done is kept to continue from once the file is back."""
    task = "name_conversion-s2f"
    raw = own_root / "raw" / "train" / f"{task}.jsonl"
    reads, read = [], SMolInstructSplit.__getitem__

    def reading(self, i):
        reads.extend([i] if self.split == "train" else [])
        if len(reads) == 3 and self.split == "train":  # the second step's first sample
            raw.write_text(raw.read_text() + "\n")
        return read(self, i)

    monkeypatch.setattr(SMolInstructSplit, "__getitem__", reading)
    cfg = cfg_factory(*QUICK, f"data.path={own_root}", f"data.tasks=[{task}]", "trainer.max_steps=4",
                      "checkpoint_every_n_steps=1", "data.micro_batch_size=2", "data.effective_batch_size=2")
    with refused(str(raw), "changed while this run was reading it"):
        from llasmol.train import train

        train(cfg)
    assert (Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt").is_file()


def test_core_tags_are_pairs_of_strings_or_nulls(tmp_path):
    import json

    from llasmol.data.smolinstruct import read_core_tags

    (tmp_path / "core_tag").mkdir()
    path = tmp_path / "core_tag" / "t.json"
    good = {"input": ["<SMILES>", "</SMILES>"], "output": [None, None]}  # captions have no tag
    path.write_text(json.dumps(good))
    assert read_core_tags(tmp_path, "t") == good
    for bad in ([["<A>", "</A>"], ["<B>", "</B>"]], {"input": ["<A>"], "output": ["<B>", "</B>"]},
                {"input": ["<A>", "</A>", "x"], "output": ["<B>", "</B>"]},
                {"input": ["<A>", 5], "output": ["<B>", "</B>"]}, {"input": ["<A>", "</A>"]}):
        path.write_text(json.dumps(bad))
        with refused("core_tag/t.json"):
            read_core_tags(tmp_path, "t")


def test_sample_counts_by_hand(smol_root):
    from llasmol.data.smolinstruct import count_samples, raw_split

    # 40 fixture molecules: k % 5 == 3 in dev, == 4 in test, the other 24 in train; the subset is every other test one.
    assert [count_samples(smol_root, "instruction_tuning", s, "forward_synthesis")
            for s in ("train", "dev", "test", "test_subset")] == [24, 8, 8, 4]
    assert (raw_split("test_subset"), raw_split("test"), raw_split("train")) == ("test", "test", "train")
    split = SMolInstructSplit(smol_root, "dev", ["forward_synthesis", "name_conversion-s2f"])
    assert len(split) == 16 and split.counts() == {"forward_synthesis": 8, "name_conversion-s2f": 8}
    assert [split.task_index(i) for i in (0, 7, 8, 15)] == [0, 0, 1, 1]
    assert split.task_row(8).name == "name_conversion-s2f"
    # The first sample of the second task is that task's own first sample.
    assert split[8] == SMolInstructSplit(smol_root, "dev", ["name_conversion-s2f"])[0]
    with pytest.raises(IndexError):
        split[16]
    with pytest.raises(IndexError):
        split[-1]
    empty = SMolInstructSplit(smol_root, "dev", [])
    assert len(empty) == 0 and empty.counts() == {} and empty.length_hints().tolist() == []


def test_length_hints_are_twice_the_raw_line_bytes_plus_the_template_characters(smol_root):
    import json

    tasks = ["name_conversion-s2f", "property_prediction-sider"]
    split = SMolInstructSplit(smol_root, "dev", tasks)
    expected = []
    for task in tasks:
        lines = (smol_root / "raw" / "dev" / f"{task}.jsonl").read_bytes().splitlines(keepends=True)
        templates = json.loads((smol_root / "template" / "instruction_tuning" / f"{task}.json").read_text())
        for s in json.loads(_samples(smol_root, "dev", task).read_text())["samples"]:
            tpl = templates[s["template_id"]]
            expected.append(2 * len(lines[s["idx"]]) + len(tpl["input"]) + len(tpl["output"]))
    assert split.length_hints().tolist() == expected


def test_a_split_reads_through_one_handle_per_file_and_a_forked_worker_opens_its_own(smol_root):
    import os

    split = SMolInstructSplit(smol_root, "train", ["name_conversion-s2f"])
    split[0]
    handle = split._handles[0]
    split[1]
    assert split._handles[0] is handle  # kept open between reads
    split._pid = -1  # as in a forked worker: the parent's handles are not used
    assert split[2] == SMolInstructSplit(smol_root, "train", ["name_conversion-s2f"])[2]
    assert split._handles[0] is not handle and split._pid == os.getpid()
    handle.close()
    split.close()


def test_a_pickled_split_reads_the_same_samples_through_its_own_files(smol_root):
    import pickle

    split = SMolInstructSplit(smol_root, "train", ["name_conversion-s2f", "property_prediction-sider"])
    first = [split[i] for i in (0, 30)]
    copy = pickle.loads(pickle.dumps(split))  # spawned DataLoader workers get a pickled split
    assert copy._handles == {} and [copy[i] for i in (0, 30)] == first
    split.close()
    copy.close()


def test_core_samples_come_in_raw_line_order_whichever_lines_are_sampled(own_root):
    import json

    task = "name_conversion-s2f"
    records = [json.loads(line) for line in (own_root / "raw" / "train" / f"{task}.jsonl").read_text().splitlines()]
    split = SMolInstructSplit(own_root, "train", [task])
    assert list(split.core_samples(task)) == [(r["input"], r["output"], None) for r in records]  # line 0 first
    split.close()
    _edit_json(_samples(own_root, "train", task), lambda r: r.update(samples=r["samples"][:0:-1]))  # 23..1
    split = SMolInstructSplit(own_root, "train", [task])
    assert list(split.core_samples(task)) == [(r["input"], r["output"], None) for r in records[1:]]
    split.close()


# -- the sample-list reader ------------------------------------------------------------------------


def test_an_empty_sample_list_is_read_as_empty(tmp_path):
    from llasmol.data.smolinstruct import _read_sample_list

    path = tmp_path / "task.json"
    path.write_text('{"task": "x", "samples": [ ], "template_name": "t", "extra": {}}')
    header, idx, template_id, targets = _read_sample_list(path, "task", None)
    assert header == {"task": "x", "template_name": "t", "extra": {}}
    assert idx.tolist() == [] and template_id.tolist() == [] and targets is None


def test_targets_are_kept_from_the_first_sample_that_names_one(tmp_path):
    from llasmol.data.smolinstruct import _read_sample_list

    path = tmp_path / "task.json"
    path.write_text('{"samples": [{"idx": 0, "template_id": 0}, {"idx": 1, "template_id": 0}, '
                    '{"idx": 2, "template_id": 1, "target": "Eye"}, {"idx": 3, "template_id": 0}]}')
    assert _read_sample_list(path, "task", None)[3] == [None, None, "Eye", None]


@pytest.mark.parametrize("text,message", [
    # json's own reason, where it stands: at the "]" after the comma, on line 4
    ('{"split": "train",\n  "samples": [\n    {"idx": 0, "template_id": 0},\n  ]\n}\n', "(Expecting value at line 4)"),
    ('{"split": "train",\n  "samples"\n  [\n]\n}\n', "(Expecting ':' delimiter at line 3)"),
    ('{"split": "train",\n  "samples": []\n}\n\n  x', "(Extra data at line 5)"),
    ('{"split": "train",\n  7: []\n}\n', "(Expecting property name enclosed in double quotes at line 2)"),
    ('{"split": "train", "samples": {"idx": 0}}', '"samples" is no list'),
    ('[{"idx": 0, "template_id": 0}]', "holds a JSON array, not an object"),
    ('{"samples": [NaN]}', "is not valid JSON: re-extract it"),  # json reads NaN, a JSON parser does not
])
def test_the_readers_own_errors_name_their_line(tmp_path, text, message):
    from llasmol.data.smolinstruct import _read_sample_list

    path = tmp_path / "task.json"
    path.write_text(text)
    with refused(path, message):
        _read_sample_list(path, "task", None)


def test_a_raw_line_nested_too_deeply_is_a_bad_line(tmp_path):
    from llasmol.data.smolinstruct import _line_offsets

    path = tmp_path / "raw.jsonl"
    path.write_text('{"input": "C", "output": "C"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    assert _line_offsets(path)[2] == {1: "line 2 is nested too deeply to read as JSON (thousands of brackets)"}


@pytest.fixture
def broken_root(tmp_path) -> Path:
    return write_smolinstruct(tmp_path / "data")


def corrupt_template(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    templates = json.loads(path.read_text())
    templates[1]["input"] = "formula please"
    path.write_text(json.dumps(templates))
    return "template 1 of name_conversion-s2f"


def _replace_raw_line(root: Path, split: str, line: int, text: str) -> Path:
    """Line `line` (1-based) of name_conversion-s2f's raw file in `split` replaced by `text`; the file."""
    path = root / "raw" / split / "name_conversion-s2f.jsonl"
    lines = path.read_text().splitlines()
    lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")
    return path


def corrupt_raw_line(root: Path, split: str = "dev") -> str:
    path = _replace_raw_line(root, split, 3, '{"input": "CCO", "output": ')
    return f"{path} line 3 is not valid JSON"


def corrupt_train_line(root: Path) -> str:
    # Found when the index is built, before the first step, not when a batch first reads the line.
    return corrupt_raw_line(root, "train")


def missing_task_file(root: Path) -> str:
    (root / "raw" / "train" / "property_prediction-esol.jsonl").unlink()
    return "property_prediction-esol.jsonl, does not exist"


def missing_template(root: Path) -> str:
    (root / "template" / "instruction_tuning" / "name_conversion-s2f.json").unlink()
    return "name_conversion-s2f.json"


def index_beyond_raw(root: Path) -> str:
    path = root / "sample" / "instruction_tuning" / "train" / "name_conversion-s2f.json"
    record = json.loads(path.read_text())
    record["samples"][0]["idx"] = 999
    path.write_text(json.dumps(record))
    return "sample index 999"


def missing_split(root: Path) -> str:
    import shutil

    shutil.rmtree(root / "sample" / "instruction_tuning" / "dev")
    return "split 'dev' not found"


def non_object_raw_line(root: Path) -> str:
    # Valid JSON, but not a record: found at start-up, not hours later when a batch reads it.
    path = _replace_raw_line(root, "train", 2, '["CCO", "C2H6O"]')
    return f"{path} line 2 is not a JSON object with input and output (it is list)"


def record_without_output(root: Path) -> str:
    path = _replace_raw_line(root, "train", 1, '{"input": "CCO"}')
    return f"{path} line 1 is not a JSON object with input and output (it is dict)"


def templates_not_a_list(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    path.write_text(json.dumps({"input": "<INPUT>", "output": "<OUTPUT>"}))
    return "template/instruction_tuning/name_conversion-s2f.json is not a list of"


def template_not_strings(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    templates = json.loads(path.read_text())
    templates[0]["input"] = ["<INPUT>"]
    path.write_text(json.dumps(templates))
    return "template/instruction_tuning/name_conversion-s2f.json is not a list of"


def core_tag_wrong_shape(root: Path) -> str:
    path = root / "core_tag" / "name_conversion-s2f.json"
    path.write_text(json.dumps({"input": "<SMILES>", "output": ["<MOLFORMULA>", "</MOLFORMULA>"]}))
    return "core_tag/name_conversion-s2f.json is not"


def deeply_nested_template(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    return "is nested too deeply"


def latin1_template(root: Path) -> str:
    path = root / "template" / "instruction_tuning" / "name_conversion-s2f.json"
    path.write_bytes('[{"input": "caf\xe9 <INPUT>", "output": "<OUTPUT>"}]'.encode("latin-1"))
    return "is not UTF-8 text"


@pytest.mark.parametrize("corrupt", [non_object_raw_line, record_without_output, templates_not_a_list,
                                     template_not_strings, core_tag_wrong_shape, deeply_nested_template,
                                     latin1_template, corrupt_train_line, index_beyond_raw])
def test_data_of_the_wrong_shape_is_named_when_the_split_is_opened(broken_root, corrupt):
    with refused(corrupt(broken_root)):
        SMolInstructSplit(broken_root, "train", ["name_conversion-s2f", "property_prediction-esol"])


@pytest.mark.parametrize("corrupt", [corrupt_template, corrupt_raw_line, corrupt_train_line, index_beyond_raw,
                                     missing_split, missing_task_file, missing_template, non_object_raw_line])
def test_bad_data_stops_training_before_its_first_step_naming_it(broken_root, tmp_path, cfg_factory, corrupt):
    from llasmol.train import train

    with refused(corrupt(broken_root)):
        train(cfg_factory(f"data.path={broken_root}", TWO_TASKS, *QUICK))
    assert not (tmp_path / "checkpoints").exists()  # stopped before any training step


@pytest.mark.slow
def test_bad_data_is_one_error_line_from_the_command(broken_root, tmp_path):
    needle = corrupt_raw_line(broken_root)
    proc = run_cli(["llasmol.train", f"data.path={broken_root}", TWO_TASKS, f"hydra.run.dir={tmp_path / 'run'}", *QUICK],
                   tmp_path)
    error_line(proc, needle)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_malformed_lines_can_be_skipped_and_counted(broken_root):
    whole = len(SMolInstructSplit(broken_root, "dev", ["name_conversion-s2f"]))
    needle = corrupt_raw_line(broken_root)
    with refused(needle):
        SMolInstructSplit(broken_root, "dev", ["name_conversion-s2f"])  # at once, not when the line is read
    lenient = SMolInstructSplit(broken_root, "dev", ["name_conversion-s2f"], skip_bad_lines=True)
    assert len(lenient) == whole - 1 and lenient.skipped == {"name_conversion-s2f": 1}
    assert all(lenient[i]["raw_input"] for i in range(len(lenient)))


def test_a_raw_file_swapped_for_one_of_the_same_size_and_date_or_reached_through_a_link_is_told_apart(own_root,
                                                                                                       tmp_path):
    """A copy of the same size and modification time put in the file's place is another file (its inode); a data
    folder reached through a symbolic link reads as the folder itself, and a link re-pointed to another file of the
    same size and date while the run reads is refused like a replaced file."""
    import os
    import shutil

    task = "name_conversion-s2f"
    raw = own_root / "raw" / "train" / f"{task}.jsonl"
    lines = raw.read_text().splitlines()
    linked = tmp_path / "linked-root"
    linked.symlink_to(own_root, target_is_directory=True)
    split = SMolInstructSplit(linked, "train", [task])
    direct = SMolInstructSplit(own_root, "train", [task])
    assert [split[i] for i in range(len(split))] == [direct[i] for i in range(len(direct))]
    direct.close()
    split.close()

    twin = raw.with_name("twin.jsonl")
    twin.write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")  # the same bytes, two lines swapped
    stat = raw.stat()
    os.utime(twin, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(twin, raw)
    assert raw.stat().st_size == stat.st_size and raw.stat().st_mtime_ns == stat.st_mtime_ns
    with refused(str(linked / raw.relative_to(own_root)), "changed while this run was reading it"):  # as given
        split[0]

    kept = tmp_path / "kept.jsonl"  # the data file itself a link, to a file kept elsewhere
    shutil.copy2(raw, kept)
    other = tmp_path / "other.jsonl"
    shutil.copy2(raw, other)
    raw.unlink()
    raw.symlink_to(kept)
    split = SMolInstructSplit(own_root, "train", [task])
    first = split[0]
    split.close()
    raw.unlink()
    raw.symlink_to(other)  # same size and date, another file
    with refused(str(raw), "changed while this run was reading it"):
        split[0]
    assert first == SMolInstructSplit(own_root, "train", [task])[0]
