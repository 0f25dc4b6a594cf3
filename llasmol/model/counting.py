"""A base's parameters, its adapters' and its weight bytes, with nothing allocated or downloaded: what `params`
prints and the tests and benchmarks count.

A bundled architecture is counted from its kept shapes (`llasmol.model.shapes`: no torch, so `params` answers in
about a second); a folder's base, or one whose facts changed since its shapes were kept, is built on the meta
device from its config.json facts.
"""

from __future__ import annotations

from llasmol.model.lora import apply_lora, count_parameters, count_with_adapters
from llasmol.model.memory import DTYPE_BYTES, check_dtype, weight_bytes
from llasmol.model.shapes import Shapes, bundled_shapes


def meta_base(cfg):
    """`cfg.model`'s base built on the meta device (the tiny model's vocabulary is its bundled tokenizer's; real
    bases carry theirs in config.json)."""
    # here: the builder imports torch and transformers (2-3 s), which the kept shapes of a bundled base spare
    import torch

    from llasmol.model.base import build_meta_model, load_tokenizer

    vocab = len(load_tokenizer(cfg.model)) if cfg.model.get("tokenizer") == "tiny" else None
    with torch.device("meta"):
        return build_meta_model(cfg.model, vocab_size=vocab)


def kept_shapes(cfg):
    """The kept shapes of `cfg.model`'s bundled architecture, None for a folder's or one whose facts changed."""
    arch = str(cfg.model.arch)
    if (cfg.model.get("tokenizer") == "tiny") != arch.startswith("tiny"):
        return None  # the tiny tokenizer sets a tiny base's vocabulary (`meta_base`), and only a tiny base's
    return bundled_shapes(arch)


def base_of(cfg):
    """What `cfg.model`'s base is counted from: its kept shapes, else the base built on the meta device."""
    kept = kept_shapes(cfg)
    return kept if kept is not None else meta_base(cfg)


def count_trainable(cfg, base=None) -> dict:
    """Parameter counts of `cfg.model` with the adapters of `cfg.lora` (`total` counts the adapters too, as the
    paper's percentages divide by it), and of the base alone (`base`); `base`: its shapes or meta model, when
    the caller has them."""
    base = base if base is not None else base_of(cfg)
    if isinstance(base, Shapes):  # a bundled architecture: summed from its shapes, no torch
        return {**count_with_adapters(base, cfg.model, cfg.lora), "base": base.total()}
    from llasmol.model.base import arch_is_bundled  # loaded already: the meta model came from it

    base_count = count_parameters(base)["total"]
    if arch_is_bundled(cfg.model.arch):  # plain Linear projections: summed (tests/test_lora.py: as PEFT counts)
        return {**count_with_adapters(base, cfg.model, cfg.lora), "base": base_count}
    # A folder's base may be any architecture, where PEFT has rules of its own (it refuses Mamba's out_proj): PEFT
    # itself adapts it (in place: the caller's `base` is then the adapted model).
    return {**count_parameters(apply_lora(base, cfg.model, cfg.lora)), "base": base_count}


def base_weight_bytes(cfg, base=None) -> dict:
    """The base's weight memory in `model.dtype`, quantised as `cfg.quantization` says (from its shapes)."""
    check_dtype(cfg.model.dtype)
    return weight_bytes(base if base is not None else base_of(cfg), DTYPE_BYTES[cfg.model.dtype], cfg.get("quantization"))
