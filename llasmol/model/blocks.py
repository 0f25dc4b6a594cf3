"""The transformer blocks of a base model: found by class, recomputed in backward, compiled one by one."""

from __future__ import annotations

from typing import Optional

import torch

# Inserted into parameter names by torch's activation-checkpoint wrapper and torch.compile of a whole module (FSDP2
# and the per-block compile here rename nothing).
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """A parameter's name as the unwrapped model calls it."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether FSDP2 (`fully_shard`) has sharded any part of `model`."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def decoder_layer_types(model: torch.nn.Module) -> tuple[type, ...]:
    """The classes of the transformer blocks of a Hugging Face model (its `_no_split_modules`)."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    types = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not types:
        raise ValueError(f"no transformer block classes found in {type(model).__name__} (no _no_split_modules)")
    return tuple(types)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Keep only each block's input in the forward pass and recompute the rest in backward.

    Non-reentrant checkpointing: it needs no gradient on the (frozen) embeddings' output, and it replays
    the block's random state, so LoRA dropout draws the same masks in the recomputation.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    base.config.use_cache = False  # a cache is meaningless while recomputing, and HF warns about it


def compile_blocks(model: torch.nn.Module, backend: str = "inductor", mode: Optional[str] = None) -> int:
    """`torch.compile` each transformer block in place; returns how many.

    Per block rather than the whole model (as torchtune does): identical blocks share one compiled graph,
    so compiling takes seconds, not minutes, and parameter names (checkpoints, adapters) do not change.
    """
    types = decoder_layer_types(model)
    blocks = [m for m in model.modules() if isinstance(m, types)]
    for block in blocks:
        block.compile(backend=backend, mode=mode)
    return len(blocks)
