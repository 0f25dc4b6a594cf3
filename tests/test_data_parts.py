"""The data building blocks on their own, with a character-level stand-in tokenizer (one id per character,
so lengths are known by hand): the prompt formatter's text, truncation and masking; the DataModule's
defaults and checks; the source's defaults, splits and pooling; the resumable loader's saved position."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from conftest import compose_config, make_datamodule
from refusals import refused

from llasmol.data.collate import PackCollator
from llasmol.data.formatting import IGNORE_INDEX, PROMPT_TEMPLATES, PromptFormatter, resolve_prompt_template
from llasmol.data.resumable_loader import ResumableDataLoader
from llasmol.data.sampler import ShardedShuffleSampler
from llasmol.data.source import BUNDLED_DATA, DEFAULT_SPLITS, SMolInstructSource


class CharTokenizer:
    """One id per character; records what each call was given. `chat`: a chat template whose prompt is
    `U:<query>|A:` and whose conversation adds `<answer>;` (or, `broken`, renders a different prompt)."""

    bos_token, eos_token = "<s>", "</s>"
    eos_token_id = 2

    def __init__(self, pad_token_id=None, chat: bool = False, broken: bool = False) -> None:
        self.pad_token_id = pad_token_id
        self.chat_template = "{{ messages }}" if chat else None
        self.broken = broken
        self.calls: list[dict] = []

    def __call__(self, text, add_special_tokens):
        self.calls.append({"add_special_tokens": add_special_tokens})
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append(kwargs)
        text = f"U:{messages[0]['content']}|"
        if len(messages) > 1:
            text = ("X" if self.broken else "") + text + f"A:{messages[1]['content']};"
        return text + ("A:" if kwargs.get("add_generation_prompt") else "")


def codes(text: str) -> list[int]:
    return [ord(c) for c in text]


# --------------------------------------------------------------------------- the prompt formatter


def test_the_paper_prompt_is_bos_inst_query_inst_then_a_space_the_answer_and_eos():
    tok = CharTokenizer()
    fmt = PromptFormatter(tok)
    assert fmt.prompt_text("Is {x} ok?") == "<s>[INST] Is {x} ok? [/INST]"  # braces stay (no str.format)
    assert fmt.full_text("q", "A") == "<s>[INST] q [/INST] A</s>"
    assert fmt.prompt_ids("q") == codes("<s>[INST] q [/INST]")
    assert tok.calls and all(c == {"add_special_tokens": False} for c in tok.calls)  # the text carries <s> itself
    enc = fmt.encode("q", "A")
    assert enc.input_ids == enc.labels == codes("<s>[INST] q [/INST] A</s>") and enc.truncated is False
    tok.bos_token = None  # a tokenizer without BOS: nothing before the prompt
    assert PromptFormatter(tok).prompt_text("q") == "[INST] q [/INST]"
    assert PromptFormatter(CharTokenizer(), "plain").full_text("q", "A") == "<s>q A</s>"
    assert PromptFormatter(CharTokenizer(), "Q: {input}\nA:").prompt_text("x") == "<s>Q: x\nA:"
    assert PROMPT_TEMPLATES["alpaca"].endswith("### Instruction:\n{input}\n\n### Response:\n")


def test_a_sample_of_exactly_max_length_is_whole_and_one_token_more_is_cut():
    tok = CharTokenizer()
    full = codes("<s>[INST] q [/INST] A</s>")
    whole = PromptFormatter(tok, max_length=len(full)).encode("q", "A")
    assert whole.input_ids == full and whole.truncated is False
    cut = PromptFormatter(tok, max_length=len(full) - 1).encode("q", "A")
    assert cut.input_ids == full[:-1] and cut.labels == full[:-1] and cut.truncated is True


def test_not_training_on_inputs_masks_exactly_the_prompt_even_when_the_cut_falls_inside_it():
    tok = CharTokenizer()
    prompt = codes("<s>[INST] q [/INST]")
    enc = PromptFormatter(tok, train_on_inputs=False).encode("q", "AB")
    assert enc.labels == [IGNORE_INDEX] * len(prompt) + codes(" AB</s>")
    assert enc.input_ids == prompt + codes(" AB</s>")
    short = PromptFormatter(tok, max_length=5, train_on_inputs=False).encode("q", "AB")
    assert short.input_ids == prompt[:5] and short.labels == [IGNORE_INDEX] * 5 and short.truncated
    # The ignore index is the one PyTorch's cross-entropy skips by default.
    assert IGNORE_INDEX == torch.nn.CrossEntropyLoss().ignore_index == -100


def test_templates_resolve_by_name_or_placeholder_and_a_tokenizer_must_name_eos():
    assert resolve_prompt_template("llasmol") == "[INST] {input} [/INST]"
    assert resolve_prompt_template("chat_template") == "chat_template"
    assert resolve_prompt_template("<{input}>") == "<{input}>"
    with refused("model.prompt_template='[INST]'", "llasmol, alpaca, plain"):
        resolve_prompt_template("[INST]")
    tok = CharTokenizer()
    tok.eos_token = None
    with refused("CharTokenizer", "EOS token", "model.arch"):  # a stand-in names no files: its class, then
        PromptFormatter(tok)
    tok.name_or_path = "/models/base"
    with refused("/models/base", "EOS token"):  # the files it was read from
        PromptFormatter(tok)
    with refused("model.prompt_template=chat_template", "CharTokenizer", "model.prompt_template=llasmol"):
        PromptFormatter(CharTokenizer(), "chat_template")
    PromptFormatter(CharTokenizer(), "llasmol")  # no chat template needed for a string template


def test_the_chat_template_renders_the_user_turn_without_thinking_and_masks_it():
    tok = CharTokenizer(chat=True)
    fmt = PromptFormatter(tok, "chat_template", train_on_inputs=False)
    assert fmt.prompt_text("q") == "U:q|A:"  # the template's own text: no BOS added
    assert tok.calls[-1] == {"tokenize": False, "add_generation_prompt": True, "enable_thinking": False}
    assert fmt.full_text("q", "a") == "U:q|A:a;"
    assert tok.calls[-1] == {"tokenize": False, "add_generation_prompt": False, "enable_thinking": False}
    enc = fmt.encode("q", "a")
    assert enc.labels == [IGNORE_INDEX] * len("U:q|A:") + codes("a;")
    with refused("model.prompt_template=chat_template", "model.prompt_template=llasmol"):
        PromptFormatter(CharTokenizer(chat=True, broken=True), "chat_template").full_text("q", "a")


# --------------------------------------------------------------------------- the DataModule


def test_the_data_groups_datamodule_takes_the_configs_settings(smol_root):
    data = compose_config(["paths.output_dir=/tmp/unused"]).data  # the default job's (the CPU demo's batches)
    dm = make_datamodule(CharTokenizer(), path=str(smol_root), tasks=["name_conversion-s2f"])
    assert data.eval_batch_size is None  # null: as the micro-batch
    assert (dm.micro_batch_size, dm.effective_batch_size, dm.eval_batch_size) == (
        data.micro_batch_size, data.effective_batch_size, data.micro_batch_size)
    assert dm.num_workers == 0 and dm.group_by_length is True and dm.formatter.train_on_inputs is True
    assert dm.collate.pad_token_id == CharTokenizer.eos_token_id  # no pad token: padded with EOS
    assert dm.train_collate is dm.collate  # packing off
    assert dm.path == str(smol_root) and dm.tasks == ["name_conversion-s2f"]
    assert dm.state_dict() == {} and dm._rank_world() == (None, None)
    item = dm.dataset("train")[1]
    assert item["index"] == 1 and item["truncated"] is False and item["labels"] == item["input_ids"]
    assert len(dm.dataset("train")) == len(dm.split("train"))
    dm = make_datamodule(CharTokenizer(pad_token_id=0), path=str(smol_root), tasks=["name_conversion-s2f"],
                         micro_batch_size=2, eval_batch_size=6, packing=True)
    assert dm.collate.pad_token_id == 0 and dm.eval_batch_size == 6 and isinstance(dm.train_collate, PackCollator)


@pytest.mark.parametrize("micro, effective, ok", [(1, 1, True), (0, 4, False), (4, 0, False), (-1, 4, False)])
def test_batch_sizes_of_one_are_accepted_and_below_one_refused(micro, effective, ok):
    from llasmol.core.schema import check_config

    cfg = compose_config(["paths.output_dir=/tmp/unused", f"data.micro_batch_size={micro}",
                          f"data.effective_batch_size={effective}"])
    if ok:
        check_config(cfg)
    else:
        with refused(f"data.micro_batch_size={micro}" if micro < 1 else f"data.effective_batch_size={effective}"):
            check_config(cfg)


def test_an_effective_batch_that_does_not_divide_names_the_nearest_multiple(smol_root):
    dm = make_datamodule(CharTokenizer(), path=str(smol_root), micro_batch_size=4, effective_batch_size=10)
    with refused("data.effective_batch_size=10", "data.effective_batch_size=8", "multiple of 4"):
        dm.gradient_accumulation(1)
    with refused("2 device(s)", "data.effective_batch_size=8", "multiple of 8"):
        dm.gradient_accumulation(2)  # under one step's worth: the step itself
    dm.effective_batch_size = 24
    assert dm.gradient_accumulation(2) == 3 and dm.gradient_accumulation(3) == 2


@pytest.mark.parametrize("stage, built", [("fit", ["train", "validation"]), ("validate", ["validation"]),
                                          ("test", ["test"]), (None, ["train", "validation", "test"])])
def test_setup_builds_the_datasets_its_stage_reads(smol_root, stage, built):
    dm = make_datamodule(CharTokenizer(), path=str(smol_root), tasks=["name_conversion-s2f"])
    dm.prepare_data()
    dm.setup(stage)
    assert sorted(dm.datasets) == sorted(built)
    assert dm.dataset(built[0]) is dm.datasets[built[0]]  # built once


def test_the_training_loader_is_shuffled_resumable_and_grouped_by_length(smol_root):
    dm = make_datamodule(CharTokenizer(), path=str(smol_root), tasks=["name_conversion-s2f"], micro_batch_size=2)
    loader = dm.train_dataloader()
    assert isinstance(loader, ResumableDataLoader) and loader.batch_size == 2
    assert loader.sampler.shuffle is True and loader.sampler.lengths is not None
    assert dm.state_dict() == {"train_position": loader.state_dict()}
    plain = dm.dataloader("train", shuffle=False, batch_size=3, rank=0, world_size=1)
    assert type(plain) is DataLoader and plain.sampler.lengths is None and plain.collate_fn is dm.collate
    ungrouped = make_datamodule(CharTokenizer(), path=str(smol_root), tasks=["name_conversion-s2f"],
                                       group_by_length=False).dataloader("train", True, 2, rank=0, world_size=1)
    assert ungrouped.sampler.lengths is None


# --------------------------------------------------------------------------- the source


def test_a_source_takes_the_documented_defaults(smol_root):
    source = SMolInstructSource()
    assert (source.path, source.hub_id, source.revision, source.tasks) == (None, "osunlp/SMolInstruct", "main", None)
    assert source.splits == {"train": "train", "validation": "dev", "test": "test"}
    assert source.splits is not DEFAULT_SPLITS  # a copy: changing one source's splits changes no other
    assert source.insert_core_tags is True and source.skip_bad_lines is False and source.representation == "smiles"
    assert source.sample_group == "instruction_tuning" and source.max_samples_per_task == {}
    empty = SMolInstructSource(path=str(smol_root), splits=None, max_samples_per_task=None)
    assert empty.splits == DEFAULT_SPLITS and empty.max_samples_per_task == {}
    assert not source.is_bundled() and not empty.is_bundled()
    assert SMolInstructSource(path=str(BUNDLED_DATA)).is_bundled()
    assert BUNDLED_DATA.name == "bundled" and BUNDLED_DATA.parent.name == "data" and BUNDLED_DATA.is_dir()


def test_a_source_from_a_config_reads_only_its_own_keys_and_overrides_win(smol_root):
    cfg = {"path": str(smol_root), "tasks": ["forward_synthesis"], "micro_batch_size": 4, "max_length": "${oops}",
           "revision": "v1"}
    source = SMolInstructSource.from_config(cfg, revision="v2")
    assert (source.path, source.tasks, source.revision) == (str(smol_root), ["forward_synthesis"], "v2")
    assert source.hub_id == "osunlp/SMolInstruct"  # not in the config: the default


def test_a_sources_splits_open_once_and_an_unknown_split_is_named(smol_root):
    source = SMolInstructSource(path=str(smol_root), tasks=["name_conversion-s2f"])
    test = source.split("test")
    assert source.split("test") is test and source.pooling_split("test") is test  # a whole split pools itself
    assert source.root() == str(smol_root)
    raw = source.raw_file("validation", "name_conversion-s2f")
    assert raw == smol_root / "raw" / "dev" / "name_conversion-s2f.jsonl"
    assert source.sample_count("test", "name_conversion-s2f") == len(test)
    with refused("'dev'", "data.splits", "['test', 'train', 'validation']"):
        source.split("dev")
    test[0]
    opened = list(test._handles.values())  # the raw files a read opened
    assert opened and not any(fh.closed for fh in opened)
    source.close()
    assert all(fh.closed for fh in opened)


def test_a_subset_pools_golds_over_its_full_split(smol_root):
    capped = SMolInstructSource(path=str(smol_root), tasks=["name_conversion-s2f"], max_samples_per_task={"test": 2})
    pooled = capped.pooling_split("test")
    assert len(capped.split("test")) == 2 and len(pooled) > 2 and capped.pooling_split("test") is pooled
    subset = SMolInstructSource(path=str(smol_root), tasks=["name_conversion-s2f"],
                                splits={"test": "test_subset"})
    full = SMolInstructSource(path=str(smol_root), tasks=["name_conversion-s2f"]).split("test")
    assert len(subset.split("test")) < len(subset.pooling_split("test")) == len(full)


def test_a_copy_lacking_tasks_names_the_missing_ones_in_table_order(smol_root, caplog):
    with caplog.at_level("WARNING", logger="llasmol.data.source"):
        assert SMolInstructSource(path=str(smol_root)).task_names() == [
            "forward_synthesis", "name_conversion-s2f", "property_prediction-esol", "property_prediction-bbbp",
            "property_prediction-sider"]
    assert [r.getMessage() for r in caplog.records] == [
        f"data: 5 of 14 tasks in {smol_root} (none of retrosynthesis, molecule_captioning, molecule_generation, "
        "name_conversion-i2f, name_conversion-i2s, name_conversion-s2i, property_prediction-lipo, "
        "property_prediction-clintox, property_prediction-hiv); data.tasks=[...] names them"]


def test_a_folder_without_any_task_is_named(tmp_path):
    with refused(tmp_path, "core_tag/<task>.json"):
        SMolInstructSource(path=str(tmp_path)).task_names()


# --------------------------------------------------------------------------- the resumable loader


def _loader(batch_size=2, seed=3, lengths=None) -> ResumableDataLoader:
    sampler = ShardedShuffleSampler(10, seed=seed, rank=0, world_size=1, lengths=lengths, batch_size=batch_size)
    return ResumableDataLoader(list(range(10)), batch_size=batch_size, sampler=sampler)


def test_a_resumed_loader_serves_the_rest_of_the_epoch_and_counts_what_it_served():
    first = _loader()
    assert first.state_dict() == {"epoch": 0, "batches": 0, "num_samples": 10, "batch_size": 2, "world_size": 1,
                                  "seed": 3, "group_by_length": False, "weights": None}
    whole = [b.tolist() for b in first]
    assert first.state_dict()["batches"] == 5
    it = iter(first)
    seen = [next(it).tolist(), next(it).tolist()]
    state = first.state_dict()
    assert seen == whole[:2] and state["batches"] == 2
    again = _loader()
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == whole[2:]
    assert again.state_dict()["batches"] == 5
    assert [b.tolist() for b in again] == whole  # the skip is for the resumed epoch only
    other = _loader()
    other.load_state_dict(state)
    other.sampler.set_epoch(1)  # a saved position of another epoch skips nothing
    assert len(list(other)) == 5 and other.state_dict()["epoch"] == 1
    assert _loader(lengths=[1] * 10).state_dict()["group_by_length"] is True


def test_a_saved_position_of_other_data_is_refused_naming_what_changed():
    state = _loader().state_dict()
    with refused("batch_size 2 -> 5", "seed 3 -> 4"):
        _loader(batch_size=5, seed=4).load_state_dict(state)
    with pytest.raises(TypeError, match="needs a ShardedShuffleSampler"):
        ResumableDataLoader(list(range(4)), batch_size=2)


def test_each_kind_of_data_is_a_split_of_the_one_interface_with_the_sources_table(tmp_path):
    """A SMolInstruct copy, a table of one's own and the two served as one (`data.also`) each give a `Split`
    whose rows are the source's task table's: the readers never ask which kind they hold."""
    from llasmol.data.custom import MixedSplit, TableSplit
    from llasmol.data.smolinstruct import SMolInstructSplit
    from llasmol.data.split import Split

    table = tmp_path / "logp.csv"
    table.write_text("input,output,split\nCCO,-0.3,validation\nCCCO,0.3,validation\nCC,1.1,train\n")
    own = {"logp": {"family": "number"}}
    copy = SMolInstructSource(path=str(BUNDLED_DATA), tasks=["property_prediction-esol"])
    alone = SMolInstructSource(path=str(table), new_tasks=own)
    mixed = SMolInstructSource(path=str(BUNDLED_DATA), also=[str(table)], new_tasks=own,
                               tasks=["property_prediction-esol", "logp"])
    for source, kind in ((copy, SMolInstructSplit), (alone, TableSplit), (mixed, MixedSplit)):
        split = source.split("validation")
        assert isinstance(split, Split) and type(split) is kind and split.table is source.table
        rows = {split.task_row(i).name for i in range(len(split))}
        assert rows == set(split.counts()) == set(split.tasks)
    assert mixed.split("validation").counts()["logp"] == alone.split("validation").counts()["logp"] == 2
    with refused("unknown split 'dev'", "a table has train, validation and test"):
        SMolInstructSource(path=str(table), new_tasks=own, splits={"dev": "dev"}).split("dev")


def test_a_source_says_its_places_and_hands_out_its_one_copy_only(tmp_path, smol_root, monkeypatch):
    """The audit asks for the one kind it reads (a SMolInstruct copy alone); a card says each place in words, and
    never this machine's path of the bundled excerpt, which a card on the Hub would carry."""
    import llasmol.data.source as source_module

    table = tmp_path / "logp.csv"
    table.write_text("input,output,split\nCCO,1.5,validation\nCCC,1.9,validation\n")
    own = {"logp": {"family": "number"}}
    bundled = SMolInstructSource(path=str(BUNDLED_DATA))
    local = SMolInstructSource(path=str(smol_root))
    alone = SMolInstructSource(path=str(table), new_tasks=own)
    mixed = SMolInstructSource(path=str(smol_root), also=[str(table)], new_tasks=own)
    assert bundled.copy().is_bundled() and local.copy().root == str(smol_root) and not local.copy().is_bundled()
    assert alone.copy() is None and mixed.copy() is None  # a table, or a copy beside one: no copy to audit alone
    assert str(BUNDLED_DATA) not in bundled.describe() and "excerpt bundled with llasmol" in bundled.describe()
    # Names, not this machine's paths: the words go into model cards, which travel.
    assert mixed.describe() == f"SMolInstruct, a local copy ({smol_root.name}), {table.name}, a table of its own"
    assert alone.describe() == f"{table.name}, a table of its own" and str(tmp_path) not in mixed.describe()
    monkeypatch.setattr(source_module, "fetch_smolinstruct", lambda hub_id, revision: smol_root)  # no network
    hub = SMolInstructSource(path=None, revision="v1")
    assert hub.describe() == "SMolInstruct, osunlp/SMolInstruct at revision v1" and hub.copy().root == str(smol_root)


def test_every_kind_serves_questions_and_golds_as_a_prompts_reader_reads_them(tmp_path):
    """What a reinforcement-learning objective reads of a split: the question (`input`), the task and the gold
    (`raw_output`), never the response. A table of questions and golds (no query template: the input is the
    whole question) is such a source with no kind of its own."""
    table = tmp_path / "prompts.jsonl"
    table.write_text('{"input": "Is CCO an alcohol?", "output": "yes", "split": "train"}\n'
                     '{"input": "Is CC an alcohol?", "output": "no", "split": "train"}\n')
    prompts = SMolInstructSource(path=str(table), new_tasks={"alcohol": {"family": "boolean"}})
    split = prompts.split("train")
    assert [(s["task"], s["input"], s["raw_output"]) for s in (split[0], split[1])] == [
        ("alcohol", "Is CCO an alcohol?", "Yes"), ("alcohol", "Is CC an alcohol?", "No")]
    copy = SMolInstructSource(path=str(BUNDLED_DATA), tasks=["name_conversion-s2f"]).split("test")
    sample = copy[0]
    assert sample["input"].startswith(sample["input"][:10]) and sample["raw_output"] and \
        sample["raw_output"] not in ("", sample["output"])  # the gold alone, not the templated response
