"""trainer=fsdp's base: built on the meta device, adapted, sharded, then read shard by shard from its safetensors
files (#55). What it gives equals what `load_base_model` + LoRA give, tensor for tensor; a damaged folder is one
line. The two-process run is in test_multiprocess.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from conftest import compose_config
from refusals import refused
from test_hf_base import _hf, write_base

from llasmol.model.base import load_base_model, load_base_on_meta, load_tokenizer
from llasmol.model.deferred import DeferredWeights, fill_from_files, read_header, read_rows, shard_rows
from llasmol.model.lora import apply_lora


def _cfg(folder: Path, *extra: str):
    return compose_config([*_hf(folder), "model.dtype=float32", *extra], "train")


def _both(cfg, seed: int = 7):
    """The eagerly loaded base with adapters, and the meta one (not filled yet), from the same random state."""
    tok = load_tokenizer(cfg.model)
    torch.manual_seed(seed)
    eager = apply_lora(load_base_model(cfg.model, tok), cfg.model, cfg.lora)
    after_eager = torch.random.get_rng_state()
    torch.manual_seed(seed)
    base = load_base_on_meta(cfg.model, tok)
    deferred = apply_lora(base, cfg.model, cfg.lora)
    assert torch.equal(torch.random.get_rng_state(), after_eager)  # the same draws, no more: later ones agree too
    return eager, deferred, base.deferred_weights


def _assert_same(eager, deferred) -> None:
    from torch.distributed.tensor import DTensor

    mine = {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in deferred.state_dict().items()}
    theirs = eager.state_dict()
    assert mine.keys() == theirs.keys()
    for key, tensor in theirs.items():
        assert mine[key].dtype == tensor.dtype, key
        assert torch.equal(mine[key], tensor), key
    ids = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(deferred.eval()(input_ids=ids).logits, eager.eval()(input_ids=ids).logits)


@pytest.mark.parametrize("model_type,lora,dtype", [("llama", "full", "float32"), ("opt", "plus", "bfloat16")])
def test_the_base_takes_no_memory_until_filled_then_equals_the_loaded_one(tmp_path, model_type, lora, dtype,
                                                                          monkeypatch):
    """Every base tensor on the meta device, the adapters drawn in host memory as on a loaded base; the rotary
    frequencies computed; filled, every tensor, tie (OPT's head is its embeddings, and lora=plus copies it) and
    logit equals the loaded base's, also cast from fp32 files into a bf16 model. Each header is parsed once, at
    load (its check), and handed to the fill."""
    from llasmol.model import deferred as deferred_module

    parsed, real_read = [], deferred_module.read_header
    monkeypatch.setattr(deferred_module, "read_header", lambda path: parsed.append(path) or real_read(path))
    folder = write_base(tmp_path / "base", model_type)
    eager, deferred, weights = _both(_cfg(folder, f"lora={lora}", f"model.dtype={dtype}"))
    for name, param in deferred.named_parameters():
        assert param.is_meta == ("lora_" not in name), name
        assert param.dtype == dict(eager.named_parameters())[name].dtype
    assert all(not b.is_meta for b in deferred.buffers())
    inner = deferred.get_base_model()
    read = fill_from_files(deferred, weights, torch.device("cpu"))
    assert parsed == [folder / "model.safetensors"]
    assert read == sum(p.nbytes for n, p in deferred.named_parameters() if "lora_" not in n)
    assert not any(p.is_meta for p in deferred.parameters())
    _assert_same(eager, deferred)
    if model_type == "opt":  # still one tensor for the embeddings and the frozen head
        head = inner.lm_head.original_module.weight
        assert head is inner.model.decoder.embed_tokens.weight


def test_an_adapter_started_from_keeps_its_trained_head_on_the_meta_base(tmp_path):
    """init_from with lora=plus: the adapter's own head copy (not the base's head) and its LoRA weights are what
    training starts from, as on a loaded base."""
    from llasmol.model.adapters import load_adapter_weights

    folder = write_base(tmp_path / "base", "llama")
    eager, _, _ = _both(_cfg(folder, "lora=plus"))
    with torch.no_grad():
        for name, param in eager.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param))  # an adapter trained away from its start
    eager.save_pretrained(tmp_path / "start")
    started, deferred, weights = _both(_cfg(folder, "lora=plus"))
    load_adapter_weights(started, tmp_path / "start")
    load_adapter_weights(deferred, tmp_path / "start")
    fill_from_files(deferred, weights, torch.device("cpu"))
    head = "base_model.model.lm_head.modules_to_save.default.weight"
    assert torch.equal(deferred.state_dict()[head], eager.state_dict()[head])
    _assert_same(started, deferred)


@pytest.mark.parametrize("model_type", ["llama", "opt"])
def test_sharded_by_fsdp2_then_filled_equals_the_loaded_base(tmp_path, one_process_group, model_type):
    """The order trainer=fsdp runs: shard the meta model, then read each shard (a world of one process here;
    two processes in test_multiprocess.py). Weights saved as several files with an index; OPT's head is its
    embeddings, one tensor in the root unit, still one after the fill."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoModelForCausalLM

    from llasmol.finetune.distributed import shard_model

    folder = write_base(tmp_path / "base", model_type)
    AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, max_shard_size="200KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    assert len(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]) > 2
    eager, deferred, weights = _both(_cfg(folder, "lora=plus"))
    shard_model(deferred, one_process_group, "32-true")
    assert any(isinstance(m, FSDPModule) for m in deferred.modules())
    fill_from_files(deferred, weights, torch.device("cpu"))
    _assert_same(eager, deferred)
    inner = deferred.get_base_model()
    if model_type == "opt":
        assert inner.lm_head.original_module.weight is inner.model.decoder.embed_tokens.weight


@pytest.mark.parametrize("rows,world,shares", [
    (8, 2, [(0, 4), (4, 4)]), (7, 2, [(0, 4), (4, 3)]), (1, 2, [(0, 1), (1, 0)]),
    (5, 4, [(0, 2), (2, 2), (4, 1), (5, 0)]), (7, 3, [(0, 3), (3, 3), (6, 1)]), (6, 1, [(0, 6)])])
def test_each_process_reads_the_rows_fsdp2_gives_it(rows, world, shares):
    """torch.chunk's split along the first dimension: ceil(rows / world) each, the last shares shorter or empty;
    the shares tile the tensor."""
    assert [shard_rows(rows, world, rank) for rank in range(world)] == shares
    assert [list(torch.arange(rows)[f:f + n]) for f, n in shares] == [
        list(c) for c in torch.arange(rows).chunk(world)] + [[]] * (world - len(torch.arange(rows).chunk(world)))


def test_rows_are_read_straight_into_a_shard_or_cast_into_it(tmp_path):
    from safetensors.torch import save_file

    whole = torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)
    save_file({"w": whole, "b": whole[0].to(torch.bfloat16).contiguous()}, str(tmp_path / "x.safetensors"))
    entries = read_header(tmp_path / "x.safetensors")
    assert entries["w"].shape == (7, 3) and entries["w"].dtype == torch.float32
    shard = torch.empty(3, 3)
    read_rows(entries["w"], 4, shard)  # rank 1 of 2: rows 4, 5, 6
    assert torch.equal(shard, whole[4:])
    cast = torch.empty(2, 3, dtype=torch.float64)
    read_rows(entries["w"], 0, cast)
    assert torch.equal(cast, whole[:2].double())
    empty = torch.empty(0, 3)  # a rank past the last row (fewer rows than processes)
    read_rows(entries["w"], 7, empty)
    tail = torch.empty(1)
    read_rows(entries["b"], 2, tail)
    assert tail.item() == 2.0


def _corrupt(folder: Path, how: str) -> str:
    """Damage a saved base's weights `how`; returns what the refusal names."""
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    if how == "truncated":
        path.write_bytes(raw[:-100])
        return "outside the file"
    if how == "header":
        path.write_bytes(raw[:8] + b"x" + raw[9:])
        return "damaged safetensors header"
    if how == "length":
        path.write_bytes(struct.pack("<Q", len(raw) * 2) + raw[8:])
        return "not a safetensors file"
    key = next(k for k in header if k != "__metadata__")
    if how == "nan":  # a tensor's first value made NaN: a damaged or badly converted file
        begin = header["model.layers.0.mlp.up_proj.weight"]["data_offsets"][0] + 8 + length
        path.write_bytes(raw[:begin] + struct.pack("<f", float("nan")) + raw[begin + 4:])
        return "model.layers.0.mlp.up_proj.weight"
    if how == "overlap":  # the embeddings given the head's byte range (equal shapes)
        header["model.embed_tokens.weight"]["data_offsets"] = header["lm_head.weight"]["data_offsets"]
    elif how == "i32":  # an integer dtype of the same size for a float tensor: its bytes read as noise
        header["model.norm.weight"]["dtype"] = "I32"
    elif how == "dtype":
        header[key]["dtype"] = "Q7"
    elif how == "before":  # bytes of the header read as weights
        begin, end = header[key]["data_offsets"]
        header[key]["data_offsets"] = [begin - 8, end - 8]
    elif how == "fraction":  # 1e400 (infinity) once overflowed int(): a shape is whole numbers or refused
        header[key]["shape"] = [2.5, header[key]["shape"][1]]
    elif how in ("missing", "shape"):
        key = "model.layers.1.mlp.down_proj.weight"
        if how == "missing":
            header["model.layers.1.mlp.renamed.weight"] = header.pop(key)
        else:
            header[key]["shape"] = list(reversed(header[key]["shape"]))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (length - len(text))
    assert len(text) == length
    path.write_bytes(raw[:8] + text + raw[8 + length:])
    return {"dtype": "Q7", "missing": "no tensor 'model.layers.1.mlp.down_proj.weight'", "before": "does not",
            "fraction": "does not", "shape": "model.layers.1.mlp.down_proj", "i32": "model.norm.weight is stored as int32",
            "overlap": "overlaps"}[how]


@pytest.mark.parametrize("how", ["truncated", "header", "length", "dtype", "before", "fraction", "missing", "shape",
                                 "nan", "overlap", "i32"])
def test_damaged_weights_are_one_line_naming_the_file_and_the_fix(tmp_path, how):
    folder = write_base(tmp_path / "base", "llama")
    named = _corrupt(folder, how)
    cfg = _cfg(folder)
    tok = load_tokenizer(cfg.model)
    with refused(named, "model.safetensors" if how != "missing" else folder):
        model = apply_lora(load_base_on_meta(cfg.model, tok), cfg.model, cfg.lora)  # headers: checked at once
        fill_from_files(model, model.get_base_model().deferred_weights, torch.device("cpu"))


def test_a_damaged_base_loaded_whole_is_named_by_its_tensor(tmp_path):
    """trainer=ddp (and one process) loads through transformers: a NaN in the weights is named there too, not met at
    the first step as 'lower optimizer.lr'."""
    folder = write_base(tmp_path / "base", "llama")
    named = _corrupt(folder, "nan")
    cfg = _cfg(folder)
    with refused(named, "NaN or infinite", "download them again"):
        load_base_model(cfg.model, load_tokenizer(cfg.model))


def test_a_folder_without_its_safetensors_is_one_line_before_anything_is_built(tmp_path):
    folder = write_base(tmp_path / "base", "llama")
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = _cfg(folder)
    tok = load_tokenizer(cfg.model)
    with refused("model-00001-of-00002.safetensors", "model.path"):
        load_base_on_meta(cfg.model, tok)
    for index, said in (("[1, 2]", "not a safetensors index"), ('{"weight_map": {"a": 1}}', "not a safetensors index"),
                        ('{"weight_map": {"a": [1]}}', "not a safetensors index"),
                        ('{"weight_map": {"a": "../base/model.safetensors"}}', "not a safetensors index"),
                        ("[" * 100_000 + "]" * 100_000, "is nested too deeply to read")):
        (folder / "model.safetensors.index.json").write_text(index)
        with refused("model.safetensors.index.json", said, "download the weights again"):
            load_base_on_meta(cfg.model, tok)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model.safetensors").unlink()
    with refused("model.safetensors", "model.path"):
        load_base_on_meta(cfg.model, tok)


@pytest.mark.parametrize("header, said", [
    ('{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}', "does not"),  # infinity: int() overflowed
    ('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', "does not"),
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', "outside the file"),
    ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', "wrong size"),
    ('{"a":[1, 2]}', "does not"), ("[" * 100_000 + "]" * 100_000, "damaged safetensors header"),
    # As safetensors requires: one tensor after another from the first byte of the data to its last
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}',
     "overlaps 'a'"),
    ('{"a":{"dtype":"F16","shape":[1],"data_offsets":[2,4]}}', "leaves a gap before it"),
    ('{"a":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}}', "cover 2 of the 4 bytes")])
def test_a_header_that_lies_is_one_line_and_nothing_is_read(tmp_path, header, said):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(4))
    with refused(path, said):
        read_header(path)


@pytest.mark.parametrize("trust", [False, True])
def test_a_hub_base_fetches_the_files_its_index_names_and_no_consolidated_copy(tmp_path, monkeypatch, trust):
    """Mistral's repositories hold consolidated.safetensors (14.5 GB) beside the indexed shards: only the files
    transformers reads are asked for, and the base's own code only when it is trusted."""
    import huggingface_hub
    from omegaconf import OmegaConf

    import llasmol.core.offline
    from llasmol.model.base import weights_folder

    folder = tmp_path / "snap"
    folder.mkdir()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: calls.append((repo, kw)) or str(folder))
    monkeypatch.setattr(llasmol.core.offline, "hub_unreachable", lambda: None)
    cfg = OmegaConf.create({"hf_id": "mistralai/Mistral-7B-v0.3", "path": None, "trust_remote_code": trust})
    assert weights_folder(cfg) == folder
    code = ["*.py"] if trust else []
    assert calls == [
        ("mistralai/Mistral-7B-v0.3", {"allow_patterns": ["config.json", "generation_config.json",
                                                          "model.safetensors.index.json", *code],
                                       "local_files_only": False}),
        ("mistralai/Mistral-7B-v0.3", {"allow_patterns": ["model-00001-of-00002.safetensors",
                                                          "model-00002-of-00002.safetensors"],
                                       "local_files_only": False})]


def test_an_old_checkpoints_key_is_renamed_as_transformers_renames_it(tmp_path):
    """transformers 5 reads `LayerNorm.gamma` as `LayerNorm.weight` (and the like) in old checkpoints: the shards
    are read by the same renaming."""
    from safetensors.torch import load_file, save_file

    folder = write_base(tmp_path / "base", "llama")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.norm.gamma"] = tensors.pop("model.norm.weight")
    save_file(tensors, str(folder / "model.safetensors"))
    eager, deferred, weights = _both(_cfg(folder))
    assert ("LayerNorm.gamma", "LayerNorm.weight") in weights.renames
    with refused("no tensor 'model.norm.weight'"):  # without the renaming the key is not there
        fill_from_files(deferred, DeferredWeights(weights.folder, weights.prefix, weights.aliases), torch.device("cpu"))
    _, deferred, _ = _both(_cfg(folder))
    fill_from_files(deferred, DeferredWeights(weights.folder, weights.prefix, weights.aliases,
                                              (*weights.renames, (r"norm\.gamma$", "norm.weight"))),
                    torch.device("cpu"))
    assert torch.equal(deferred.get_base_model().model.norm.weight, tensors["model.norm.gamma"])


def test_a_base_whose_loading_does_more_than_read_is_one_line_naming_ddp(tmp_path, monkeypatch):
    import llasmol.model.base as base

    folder = write_base(tmp_path / "base", "llama")
    cfg = _cfg(folder, "model.dtype=float16")
    tok = load_tokenizer(cfg.model)
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(LlamaForCausalLM, "_keep_in_fp32_modules", ["norm"], raising=False)
    with refused("keeps norm in float32 under model.dtype=float16", "trainer=ddp"):
        base.load_base_on_meta(cfg.model, tok)
    monkeypatch.setattr(LlamaForCausalLM, "_keep_in_fp32_modules", [], raising=False)
    fused = type("WeightConverter", (), {})()
    monkeypatch.setattr(base, "_conversions", lambda model: [fused])
    with refused("converts its tensors as they load (WeightConverter)", "trainer=ddp"):
        base.load_base_on_meta(cfg.model, tok)


@pytest.mark.parametrize("kind, said", [("loop", "symbolic link loop"), ("fifo", "named pipe"),
                                        ("device", "character device"), ("absent", "has no model.safetensors")])
def test_a_weights_file_that_is_no_regular_file_is_named_as_what_it_is(tmp_path, kind, said):
    import os

    folder = write_base(tmp_path / "base", "llama")
    path = folder / "model.safetensors"
    path.unlink()
    if kind == "loop":
        path.symlink_to(folder / "other")
        (folder / "other").symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    cfg = _cfg(folder)
    with refused(said):
        load_base_on_meta(cfg.model, load_tokenizer(cfg.model))
