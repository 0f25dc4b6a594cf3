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

from llasmol.core.errors import UserError
from llasmol.model.blocks import clean_name, decoder_layer_types
from llasmol.finetune.lightning_private import FSDPStrategyWithModelHook

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


class LoRAFSDPStrategy(FSDPStrategyWithModelHook):
    """`FSDPStrategy` whose wrap policy is derived from the model once it exists (see module docstring)."""

    def wrap_policy(self, model: torch.nn.Module):
        return lora_wrap_policy(decoder_layer_types(model))


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


def check_optimizer(optimizer_cfg, trainer_cfg) -> None:
    """A paged bitsandbytes optimizer pages its state between GPU and CPU memory through CUDA unified
    memory; on a CPU bitsandbytes falls back to the unpaged optimizer with a warning, which would run
    another optimizer than the one asked for. Say so in one line instead."""
    target = str(optimizer_cfg.get("_target_", "")) if optimizer_cfg else ""
    name = target.rsplit(".", 1)[-1]
    if not name.startswith("Paged"):
        return
    if trainer_cfg.get("accelerator") == "cpu" or not torch.cuda.is_available():
        raise UserError(f"optimizer._target_={target} pages its state through CUDA memory and this run has no GPU "
                        f"(trainer.accelerator={trainer_cfg.get('accelerator')}): use "
                        f"optimizer._target_=bitsandbytes.optim.{name.removeprefix('Paged')} (the same update, unpaged)")


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
