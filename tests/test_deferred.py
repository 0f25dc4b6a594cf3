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
from llasmol.model.deferred import fill_from_files, read_header, read_rows, shard_rows
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
def test_the_base_takes_no_memory_until_filled_then_equals_the_loaded_one(tmp_path, model_type, lora, dtype):
    """Every base tensor on the meta device, the adapters drawn in host memory as on a loaded base; the rotary
    frequencies computed; filled, every tensor, tie (OPT's head is its embeddings, and lora=plus copies it) and
    logit equals the loaded base's, also cast from fp32 files into a bf16 model."""
    folder = write_base(tmp_path / "base", model_type)
    eager, deferred, weights = _both(_cfg(folder, f"lora={lora}", f"model.dtype={dtype}"))
    for name, param in deferred.named_parameters():
        assert param.is_meta == ("lora_" not in name), name
        assert param.dtype == dict(eager.named_parameters())[name].dtype
    assert all(not b.is_meta for b in deferred.buffers())
    inner = deferred.get_base_model()
    read = fill_from_files(deferred, weights, torch.device("cpu"))
    assert read == sum(p.nbytes for n, p in deferred.named_parameters() if "lora_" not in n)
    assert not any(p.is_meta for p in deferred.parameters())
    _assert_same(eager, deferred)
    if model_type == "opt":  # still one tensor for the embeddings and the frozen head
        head = inner.lm_head.original_module.weight
        assert head is inner.model.decoder.embed_tokens.weight


def test_sharded_by_fsdp2_then_filled_equals_the_loaded_base(tmp_path, one_process_group):
    """The order trainer=fsdp runs: shard the meta model, then read each shard (a world of one process here;
    two processes in test_multiprocess.py). Weights saved as several files with an index."""
    from torch.distributed.fsdp import FSDPModule
    from transformers import AutoModelForCausalLM

    from llasmol.finetune.distributed import shard_model

    folder = write_base(tmp_path / "base", "llama")
    AutoModelForCausalLM.from_pretrained(folder).save_pretrained(folder, max_shard_size="200KB")
    (folder / "model.safetensors").unlink(missing_ok=True)
    assert len(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]) > 2
    eager, deferred, weights = _both(_cfg(folder, "lora=plus"))
    shard_model(deferred, one_process_group, "32-true")
    assert any(isinstance(m, FSDPModule) for m in deferred.modules())
    fill_from_files(deferred, weights, torch.device("cpu"))
    _assert_same(eager, deferred)


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
    if how == "dtype":
        key = next(k for k in header if k != "__metadata__")
        header[key]["dtype"] = "Q7"
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
    return {"dtype": "Q7", "missing": "no tensor 'model.layers.1.mlp.down_proj.weight'",
            "shape": "model.layers.1.mlp.down_proj"}[how]


@pytest.mark.parametrize("how", ["truncated", "header", "length", "dtype", "missing", "shape"])
def test_damaged_weights_are_one_line_naming_the_file_and_the_fix(tmp_path, how):
    folder = write_base(tmp_path / "base", "llama")
    named = _corrupt(folder, how)
    cfg = _cfg(folder)
    tok = load_tokenizer(cfg.model)
    with refused(named, "model.safetensors" if how != "missing" else folder):
        model = apply_lora(load_base_on_meta(cfg.model, tok), cfg.model, cfg.lora)  # headers: checked at once
        fill_from_files(model, model.get_base_model().deferred_weights, torch.device("cpu"))


def test_a_folder_without_its_safetensors_is_one_line_before_anything_is_built(tmp_path):
    folder = write_base(tmp_path / "base", "llama")
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = _cfg(folder)
    tok = load_tokenizer(cfg.model)
    with refused("model-00001-of-00002.safetensors", "model.path"):
        load_base_on_meta(cfg.model, tok)
    (folder / "model.safetensors.index.json").write_text("[1, 2]")
    with refused("model.safetensors.index.json", "not a safetensors index"):
        load_base_on_meta(cfg.model, tok)
    (folder / "model.safetensors.index.json").unlink()
    (folder / "model.safetensors").unlink()
    with refused("model.safetensors", "model.path"):
        load_base_on_meta(cfg.model, tok)
