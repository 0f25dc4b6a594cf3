"""Current open bases (issue 25): their bundled config.json facts count what their model cards publish, and
their LoRA role maps adapt exactly the projections each role names."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config
from refusals import refused

from llasmol.model.base import arch_config, arch_facts
from llasmol.model.lora import apply_lora, modules_with_adapters
from llasmol.model.counting import count_trainable

# model= name: (bundled arch, the parameter count its Hub model card / safetensors metadata publishes,
# the exact count of the base built from the bundled facts). The exact figures are the published
# safetensors totals; the rounded ones are what the cards print.
CURRENT_BASES = {
    "mistral_v03": ("mistral-7b-v0.3", 7.25e9, 7_248_023_552),
    "mistral_nemo": ("mistral-nemo-12b", 12.2e9, 12_247_782_400),
    "llama31": ("llama3.1-8b", 8.03e9, 8_030_261_248),
    "qwen25": ("qwen2.5-7b", 7.61e9, 7_615_616_512),
    "qwen3": ("qwen3-8b", 8.2e9, 8_190_735_360),
    "gemma2": ("gemma2-9b", 9.24e9, 9_241_705_984),
    "olmo2": ("olmo2-7b", 7.3e9, 7_298_617_344),
}
FULL_ROLES = ("q", "k", "v", "o", "gate", "up", "down")


def lora_full_trainable(arch: str, r: int = 16) -> int:
    """LoRA's A (r × in) and B (out × r) on every attention and FFN projection, from the facts alone."""
    f = arch_facts(arch)
    hidden, heads, kv = f["hidden_size"], f["num_attention_heads"], f["num_key_value_heads"]
    head_dim = f.get("head_dim") or hidden // heads
    shapes = [(hidden, heads * head_dim), (hidden, kv * head_dim), (hidden, kv * head_dim),
              (heads * head_dim, hidden)] + [(hidden, f["intermediate_size"])] * 2 + [(f["intermediate_size"], hidden)]
    return f["num_hidden_layers"] * r * sum(i + o for i, o in shapes)


@pytest.mark.parametrize("model", list(CURRENT_BASES))
def test_params_counts_the_published_size(model):
    arch, published, exact = CURRENT_BASES[model]
    cfg = compose_config([f"model={model}", "lora=full"], config_name="params")
    assert cfg.model.arch == arch and cfg.model.dtype == "bfloat16"
    counts = count_trainable(cfg)
    assert counts["base"] == exact
    assert abs(counts["base"] - published) / published < 0.005
    assert counts["trainable"] == lora_full_trainable(arch)
    assert counts["total"] == exact + counts["trainable"]


def test_gemma2_ties_its_head_and_plus_trains_a_copy_of_it():
    full = count_trainable(compose_config(["model=gemma2", "lora=full"], config_name="params"))
    plus = count_trainable(compose_config(["model=gemma2", "lora=plus"], config_name="params"))
    # The tied embedding is counted once in the base; `plus` adds one trainable 256000 × 3584 head.
    assert plus["trainable"] - full["trainable"] == 256_000 * 3584
    assert plus["base"] == full["base"] == CURRENT_BASES["gemma2"][2]


@pytest.mark.parametrize("model", list(CURRENT_BASES))
def test_full_adapts_every_projection_of_a_tiny_instance(model):
    """A 2-layer instance of the base's own architecture: the role map names real modules, all of them."""
    cfg = compose_config([f"model={model}", "lora=full", "paths.output_dir=/tmp/unused"])
    from transformers import AutoModelForCausalLM

    f = arch_facts(cfg.model.arch)
    dims = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2 if f["num_key_value_heads"] < f["num_attention_heads"] else 4,
                vocab_size=64, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if "head_dim" in f:
        dims["head_dim"] = 8
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(arch_config(cfg.model.arch, **dims))
    linear = {n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    adapted = modules_with_adapters(apply_lora(base, cfg.model, cfg.lora))
    assert {n.removeprefix("base_model.model.") for n in adapted} == linear
    assert len(linear) == 2 * len(FULL_ROLES)


@pytest.mark.parametrize("model,packs", [("llama31", True), ("mistral_nemo", True), ("qwen25", False),
                                         ("qwen3", False), ("gemma2", False), ("olmo2", False)])
def test_packing_runs_on_llama_and_mistral_types_and_is_refused_with_one_line_elsewhere(model, packs):
    from llasmol.model.base import check_packing

    cfg = compose_config([f"model={model}"])
    if packs:
        check_packing(cfg.model)
    else:
        with refused("data.packing=true", f"model={model}", "data.packing=false"):
            check_packing(cfg.model)
