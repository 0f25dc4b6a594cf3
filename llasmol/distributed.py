"""Sharded training of LoRA models with Lightning's FSDP strategy, and names that survive wrapping.

FSDP flattens the parameters of each wrapped unit into one tensor and keeps a gradient for the whole of
it. Wrapping every decoder layer as a unit (the usual transformer policy) would put frozen base weights and
trainable adapters in the same flat tensors, so the frozen 7B would carry gradients. The LoRA-aware policy
here also wraps each trainable leaf (`lora_A`, `lora_B`, `plus`'s head copy) as its own unit: gradients and
optimizer state exist for the adapters only, and the frozen units stay in the base dtype.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from lightning.pytorch.strategies import FSDPStrategy

from llasmol.errors import UserError
from llasmol.model.blocks import decoder_layer_types

# Inserted into parameter names by FSDP and activation-checkpoint wrappers.
_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    """A parameter's name as the unwrapped model calls it."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _is_trainable_leaf(module: torch.nn.Module) -> bool:
    params = list(module.parameters(recurse=False))
    return not list(module.children()) and bool(params) and all(p.requires_grad for p in params)


def lora_wrap_policy(layer_types: tuple[type, ...]) -> Callable[..., bool]:
    """FSDP auto-wrap policy: a unit per transformer block and per trainable leaf inside it."""

    def policy(module: torch.nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        if recurse:
            return True  # look inside every module
        return isinstance(module, layer_types) or _is_trainable_leaf(module)

    return policy


class LoRAFSDPStrategy(FSDPStrategy):
    """`FSDPStrategy` whose wrap policy is derived from the model once it exists (see module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        self._policy_given = "auto_wrap_policy" in kwargs
        super().__init__(**kwargs)

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if not self._policy_given:
            self.kwargs["auto_wrap_policy"] = lora_wrap_policy(decoder_layer_types(model))
        root = super()._setup_model(model)
        clip_norm_through_root(self.precision_plugin, root)
        return root


def clip_norm_through_root(precision, root) -> None:
    """Let `trainer.gradient_clip_val` clip by norm under FSDP (the paper recipe clips at 1.0).

    Lightning's FSDP precision plugin refuses norm clipping: it holds no handle on the sharded root, and
    a norm over one rank's shards would be wrong. The root's `clip_grad_norm_` computes the global norm.
    """
    precision.clip_grad_by_norm = lambda optimizer, clip_val: root.clip_grad_norm_(clip_val)


def module_state_dict(trainer) -> dict:
    """The LightningModule's state dict with every tensor whole (on rank 0 at least); collective.

    FSDP gathers through Lightning's full-state-dict path. DeepSpeed ZeRO-3 partitions parameters, so the
    trainable ones (the adapters, small) are gathered here; ZeRO-2 and DDP hold whole parameters already.
    """
    strategy = trainer.strategy
    if getattr(strategy, "zero_stage_3", False):
        import deepspeed

        module = trainer.lightning_module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            return {clean_name(n): p.detach().cpu().clone() for n, p in named}
    return strategy.lightning_module_state_dict()


def check_trainer(trainer_cfg) -> None:
    """Stop early, in one line, on a strategy this machine cannot run."""
    strategy = trainer_cfg.get("strategy")
    # A preset's `_target_` class, or a Lightning strategy name such as "fsdp" or "deepspeed_stage_3".
    target = str(strategy.get("_target_", "") if hasattr(strategy, "get") else strategy or "").lower()
    name = "fsdp" if "fsdp" in target else "deepspeed" if "deepspeed" in target else None
    if name is None:
        return
    if name == "deepspeed":
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise UserError('trainer=deepspeed needs the DeepSpeed package: pip install -e ".[deepspeed]" '
                            "(on a CUDA machine), or use trainer=fsdp")
    if trainer_cfg.get("accelerator") == "cpu" or not torch.cuda.is_available():
        raise UserError(f"trainer={name} shards the model over GPUs and this machine has none "
                        f"(accelerator={trainer_cfg.get('accelerator')}): on CPU use trainer=ddp "
                        "trainer.accelerator=cpu trainer.devices=2")
