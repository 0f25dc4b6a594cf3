"""Sharded data parallel training of LoRA models: FSDP2 (`torch.distributed.fsdp.fully_shard`) through
Lightning's `ModelParallelStrategy`, the strategy of `trainer=fsdp`.

Every process holds 1/W of every parameter, frozen base weights and adapters alike, as DTensor shards, and
all-gathers one unit's weights just before its forward (and again before its backward). The units: each decoder
block, with its largest part (a Llama-family block's MLP) a unit inside it; the input embeddings and the head,
when they are two tensors (as torchtitan shards them); the base model as the root (the final norm, or the tied
embeddings and head). FSDP2 keeps `requires_grad` per parameter, so the frozen weights and the adapters of a
unit share it and only the adapters get gradients and optimizer state (FSDP1's flat parameters needed a unit
per adapter for that). `lora=plus`'s trainable head copy sits in the head's unit beside the frozen head.

A pretrained base never exists whole in a process: it is built on the meta device and each process reads its
own rows of the weights after sharding (`llasmol.model.deferred`, called from `FSDP2Strategy.shard`).

Mixed precision follows the trainer's precision: with `bf16-mixed` (the GPU presets) the all-gathered
weights and the compute are bf16 and gradients are reduce-scattered in fp32 into the fp32 adapter shards the
optimizer updates; with `32-true` (CPU) everything is fp32. Activation recomputation
(`gradient_checkpointing=true`) is per block, inside the block's unit.

A forward is collective under FSDP2 (each unit's all-gather), so every rank must run as many forwards as the
others: validation batches are padded to one count per rank (`llasmol.data.sampler`) and generation runs in
lockstep (`llasmol.inference.beam_search`). Checkpoints hold the adapters only, gathered whole to rank 0 (a
few MB to tens of MB), with the optimizer state gathered the same way: one `.ckpt` file, as on one device.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch

from llasmol.finetune.lightning_private import ModelParallelOverEveryProcess
from llasmol.model.blocks import clean_name, decoder_layer_types, is_sharded
from llasmol.model.deferred import fill_from_files

log = logging.getLogger("llasmol.train")

SHARDED_KEY = "llasmol_fsdp2"  # in a checkpoint: saved under trainer=fsdp (its optimizer state is keyed otherwise)


def mixed_precision(precision: str):
    """FSDP2's mixed-precision policy for a Lightning precision name: bf16 (or fp16) weights and compute with
    fp32 gradient reduction for the `*-mixed` ones, the parameters' own dtype otherwise."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(str(precision))
    if half is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)


def shard_model(model: torch.nn.Module, mesh, precision: str, reshard_after_forward: bool = True) -> int:
    """`fully_shard` each transformer block of `model` (a PEFT model), its input embeddings and its head (when
    they are two tensors), then its base model as the root; returns the number of blocks. The root is the base
    model rather than the PEFT wrapper because generation calls the base model directly (`PeftModel.generate`),
    and training reaches it too.

    The embeddings and the head are units of their own, as torchtitan shards them: in a root unit both would
    stay gathered from the first block's forward to the last one's backward (FSDP2 keeps a root gathered after
    its forward), 1 GB for Mistral-7B in fp32; apart, the embeddings are gathered for their forward only (not in
    backward when nothing in them trains: no adapter reaches them) and the head from its forward to its
    backward. A head tied to the embeddings (Gemma, Galactica) is one tensor, which FSDP2 keeps in one unit:
    the root's."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(precision)
    types = decoder_layer_types(model)
    blocks = [m for m in model.modules() if isinstance(m, types)]
    for block in blocks:
        part = _largest_part(block)
        if part is not None:
            fully_shard(part, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    root = model.get_base_model() if hasattr(model, "get_base_model") else model
    # (lora=plus: the head is PEFT's wrapper of the frozen head and its trainable copy, both in its unit)
    embeddings, head = root.get_input_embeddings(), root.get_output_embeddings()
    if head is not None and not {id(p) for p in embeddings.parameters()} & {id(p) for p in head.parameters()}:
        fully_shard(embeddings, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
        if not any(p.requires_grad for p in embeddings.parameters()):
            embeddings.set_unshard_in_backward(False)  # a frozen embedding's backward needs no weight
        fully_shard(head, mesh=mesh, mp_policy=policy, reshard_after_forward=False)  # its backward follows at once
    fully_shard(root, mesh=mesh, mp_policy=policy)
    if mesh.device_type == "cpu":
        _gather_one_unit_at_a_time(model, root)
    return len(blocks)


def _largest_part(block: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The part of a transformer block that holds most of its weights (a Llama-family block's MLP: 80% of a
    Mistral-7B block), which is then a unit of its own inside the block's. A unit's weights are held twice for a
    moment as they are gathered (FSDP2's all-gather buffer, and the weights copied out of it): a block in two
    units holds its MLP twice at most, not the whole block. None where no part holds more than half (OPT's two
    projections are direct children of the block)."""
    def size(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    parts = list(block.children())
    largest = max(parts, key=size, default=None)
    return largest if largest is not None and 2 * size(largest) > size(block) else None


def _gather_one_unit_at_a_time(model: torch.nn.Module, root) -> None:
    """On CPUs (gloo), no more than one unit's weights gathered at a time, and its all-gather buffer freed as
    soon as they are copied out. On GPUs FSDP2 keeps the buffer until the next unit's all-gather and gathers the
    next unit during a backward, so that copies and collectives overlap with compute on other streams; a CPU has
    no streams, and gloo shares the cores that compute, so both would only hold a unit's size more at the peak
    (a block of Mistral-7B: 0.87 GB in fp32, measured in BENCHMARKS.md §15)."""
    from torch.distributed.fsdp import FSDPModule

    root._set_unshard_async_op(True)  # FSDPModule's documented switch for this, named with a `_`
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            # Naming the unit itself as the one to gather ahead of its backward turns off the implicit gathering
            # of the next one: at its backward a unit is gathered already, so nothing more is gathered.
            unit.set_modules_to_backward_prefetch([unit])


class FSDP2Strategy(ModelParallelOverEveryProcess):
    """`trainer=fsdp`: FSDP2 over every process of every node (see the module docstring).

    `reshard_after_forward=False` keeps each block's gathered weights from its forward to its backward
    (ZeRO-2-like: less communication, more memory)."""

    def __init__(self, reshard_after_forward: bool = True, **kwargs: Any) -> None:
        # One file of whole adapters on rank 0, not a folder of shards: small, and read as any other .ckpt.
        super().__init__(save_distributed_checkpoint=False, **kwargs)
        self.reshard_after_forward = reshard_after_forward

    def shard(self, model: torch.nn.Module) -> None:
        """Shard `model` over the data-parallel mesh, once (Lightning asks at every fit and validate); a base built
        on the meta device (`llasmol.model.deferred`) then gets its values, each process its own rows."""
        if not is_sharded(model):
            shard_model(model, self.device_mesh["data_parallel"], self.precision_plugin.precision,
                        self.reshard_after_forward)
        root = model.get_base_model() if hasattr(model, "get_base_model") else model
        weights = getattr(root, "deferred_weights", None)
        if weights is not None:
            started = time.perf_counter()
            read = fill_from_files(model, weights, self.root_device)
            del root.deferred_weights  # filled once: a later fit or validate finds the values in place
            log.info("read this process's shards of the base: %s MiB in %.1f s", f"{read / 2**20:,.1f}",
                     time.perf_counter() - started)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The trainable tensors whole, on rank 0 (empty elsewhere); collective. Lightning's own would gather the
        frozen base too (14 GB for a 7B) only for `on_save_checkpoint` to drop it."""
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        module = self.lightning_module
        for unit in module.modules():  # the sharded parameters in place (the root stays gathered after a forward)
            if isinstance(unit, FSDPModule):
                unit.reshard()
        state = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            whole = param.full_tensor() if isinstance(param, DTensor) else param
            if self.is_global_zero:
                state[clean_name(name)] = whole.detach().cpu().clone()
        return state

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict[str, Any]:
        # Lightning loads the weights here, non-strictly (the frozen base is not in the file), and hands the
        # module a checkpoint without them: check first that they are this model's adapters.
        saved = torch.load(checkpoint_path, map_location="cpu", mmap=True, weights_only=True)["state_dict"]
        self.lightning_module.check_adapter_keys(set(saved))
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)


def uses_fsdp2(trainer) -> bool:
    """Whether `trainer` (a Lightning Trainer) runs trainer=fsdp's strategy."""
    return isinstance(getattr(trainer, "strategy", None), FSDP2Strategy)
