"""The kept shapes of the bundled architectures (llasmol/model/arch_shapes.json) are what the installed
transformers builds from their facts, and `params` counts from them what it counts from a meta build."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import compose_config

from llasmol.model import base as base_module
from llasmol.model import shapes as shapes_module
from llasmol.model.lora import count_with_adapters
from llasmol.model.memory import DTYPE_BYTES, weight_bytes
from llasmol.model.shapes import SHAPES_FILE, Shapes, bundled_shapes
from llasmol.model.counting import meta_base, kept_shapes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from build_arch_shapes import built_shapes  # noqa: E402

ARCHS = sorted(json.loads(SHAPES_FILE.read_text())["architectures"])


def test_every_bundled_architecture_is_kept_as_the_installed_transformers_builds_it():
    assert ARCHS == sorted(p.stem for p in base_module.ARCH_DIR.glob("*.json"))
    stale = [arch for arch in ARCHS if built_shapes(arch) != bundled_shapes(arch)]
    assert not stale, f"rebuild with python scripts/build_arch_shapes.py: {stale}"


@pytest.mark.parametrize("model", ["tiny", "mistral", "qwen3", "gemma2", "galactica", "olmo2"])
def test_counts_and_bytes_from_the_kept_shapes_equal_the_meta_builds(model):
    built = None
    for lora in ("lite", "full", "plus"):
        cfg = compose_config([f"model={model}", f"lora={lora}", "quantization=4bit"], "params")
        kept = kept_shapes(cfg)
        if built is None:  # the base is the same whatever the variant: built once
            with torch.device("meta"):
                built = meta_base(cfg)
        assert kept is not None and kept.total() == sum(p.numel() for p in built.parameters())
        assert count_with_adapters(kept, cfg.model, cfg.lora) == count_with_adapters(built, cfg.model, cfg.lora)
    for quantization in (None, cfg.quantization, {"bits": 8}):
        assert weight_bytes(kept, DTYPE_BYTES[cfg.model.dtype], quantization) == weight_bytes(
            built, base_module.torch_dtype(cfg.model.dtype), quantization)


def test_changed_facts_or_another_vocabulary_are_built_not_read_stale(tmp_path, monkeypatch):
    arch_dir = tmp_path / "arch"
    shutil.copytree(base_module.ARCH_DIR, arch_dir)
    monkeypatch.setattr(shapes_module, "ARCH_DIR", arch_dir)
    assert bundled_shapes("mistral-7b") is not None
    facts = json.loads((arch_dir / "mistral-7b.json").read_text())
    (arch_dir / "mistral-7b.json").write_text(json.dumps({**facts, "num_hidden_layers": 2}))
    assert bundled_shapes("mistral-7b") is None  # facts edited since the shapes were kept
    assert kept_shapes(compose_config(["model=tiny", "model.tokenizer=null"], "params")) is None
    assert kept_shapes(compose_config(["model=hf", "model.path=/some/folder"], "params")) is None


def test_the_dtype_names_are_one_table():
    assert {name: dtype.itemsize for name, dtype in base_module._DTYPES.items()} == DTYPE_BYTES
    assert isinstance(Shapes.from_json(Shapes.of(torch.nn.Linear(3, 2)).to_json()), Shapes)
