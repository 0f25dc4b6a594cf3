"""The bytes a base's weights take, in its dtype or quantised by bitsandbytes, from its shapes alone.

Counted on the `meta` device (nothing allocated or downloaded) and checked against the bytes of a really
quantised model in the tests and in `bench/quantization.py`. What bitsandbytes stores per quantised
linear layer of n = out × in weights:

- 8-bit (LLM.int8()): n int8 weights and one fp32 scale per output row (`SCB`).
- 4-bit (NF4/FP4): n/2 bytes of packed codes, one absmax per block of 64 weights (fp32, or with double
  quantisation 8-bit codes plus one fp32 absmax per 256 blocks and a 256-entry fp32 code book), and the
  16-entry fp32 code book of the data type.

A few hundred bytes of serialised metadata per layer are left out. transformers quantises every linear
layer but the output head; embeddings and norms stay in the base's dtype, and for training PEFT's
`prepare_model_for_kbit_training` casts those unquantised parameters to fp32.

Beside the weights, a LoRA training step holds the fp32 adapters, their gradients and optimizer state, and the
activations autograd keeps for backward (`activation_bytes`), counted from the block's shapes for a Llama-family
block (RMSNorm, rotary attention, gated FFN) adapted by PEFT. tests/test_params_plan.py holds the count equal to
the bytes torch saves on a small Mistral, and the peak within 15% of the GPU check's (BENCHMARKS §6).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from llasmol.core.errors import UserError
from llasmol.model.roles import names_target
from llasmol.model.shapes import LINEAR, Shapes

BLOCK_4BIT = 64  # bitsandbytes' 4-bit block size for weights
BLOCKS_PER_NESTED = 256  # double quantisation: absmax values grouped 256 to one fp32 scale
CODE_BOOK_4BIT = 16 * 4  # NF4/FP4 code book: 16 fp32 values
CODE_BOOK_NESTED = 256 * 4  # the absmax code book of double quantisation: 256 fp32 values


def quantized_linear_bytes(out_features: int, in_features: int, bits: int, double_quant: bool = True) -> int:
    """Bytes bitsandbytes keeps for one quantised linear layer's weight (metadata left out)."""
    n = out_features * in_features
    if bits == 8:
        return n + 4 * out_features
    blocks = math.ceil(n / BLOCK_4BIT)
    absmax = blocks + 4 * math.ceil(blocks / BLOCKS_PER_NESTED) + CODE_BOOK_NESTED if double_quant else 4 * blocks
    return math.ceil(n / 2) + absmax + CODE_BOOK_4BIT


# Bytes per weight of each `model.dtype` (`llasmol.model.base` maps the same names to torch's dtypes).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def check_dtype(name: str, key: str = "model.dtype") -> str:
    """`name` if it is a dtype llasmol loads weights in, else the one-line error naming `key`."""
    if name not in DTYPE_BYTES:
        raise UserError(f"unknown {key} {name!r}: use one of {', '.join(DTYPE_BYTES)}")
    return name


def weight_bytes(model, dtype, quant_cfg: Optional[Any] = None) -> dict[str, int]:
    """The weight memory of `model` (a model built on any device, `meta` included, or its `Shapes`) loaded in
    `dtype` (a torch dtype, or its bytes per weight), quantised as `quant_cfg` says (`bits` 4 or 8,
    `double_quant`; None or bits null: not quantised).

    `quantized`: bytes of the quantised layers; `other`: everything else in `dtype`; `total`: as loaded;
    `training`: with the unquantised parameters in fp32, as PEFT prepares a quantised base for training.
    """
    shapes = model if isinstance(model, Shapes) else Shapes.of(model)
    itemsize = dtype if isinstance(dtype, int) else dtype.itemsize
    bits = quant_cfg.get("bits") if quant_cfg else None
    double_quant = bits == 4 and quant_cfg["double_quant"]  # 8-bit layers keep one plain fp32 scale a row
    quantized, rest = 0, 0
    for part in shapes.parts:  # tied weights once (at their first module); biases stay in `dtype`
        if bits and part.kind == LINEAR and part.name != shapes.head:
            out_features, in_features = part.shape
            quantized += part.repeat * quantized_linear_bytes(out_features, in_features, bits, double_quant)
            rest += part.repeat * (part.numel - out_features * in_features)
        else:
            rest += part.repeat * part.numel
    other = rest * itemsize
    training = quantized + rest * 4 if bits else other
    return {"quantized": quantized, "other": other, "total": quantized + other, "training": training}


def describe(sizes: dict[str, int], dtype_name: str, quant_cfg: Optional[Any] = None) -> str:
    """One line for `params`: the weights' memory as loaded (and for training, when quantised)."""
    gib = 1024 ** 3
    bits = quant_cfg.get("bits") if quant_cfg else None
    if not bits:
        return f"weights: {sizes['total'] / gib:.2f} GiB in {dtype_name}"
    kind = "8-bit" if bits == 8 else f"4-bit {quant_cfg['quant_type']}" + (
        ", double-quantised" if quant_cfg["double_quant"] else "")
    return (f"weights: {sizes['total'] / gib:.2f} GiB ({kind}: {sizes['quantized'] / gib:.2f} GiB in the quantised "
            f"layers, {sizes['other'] / gib:.2f} GiB of embeddings, norms and head in {dtype_name}); "
            f"{sizes['training'] / gib:.2f} GiB when training (the unquantised parts cast to fp32)")


def trainable_bytes(adapters: int, head_copy: int, head_dtype_bytes: int, optimizer_target: str) -> dict[str, int]:
    """The trainable weights' memory: PEFT's fp32 adapters (`adapters` weights) and `lora=plus`'s head copy
    (`head_copy` weights, in the base's dtype as PEFT copies it), each with its gradient and the state of
    `optimizer._target_` (AdamW or bitsandbytes' 8-bit ones; another is the one-line error naming it)."""
    if not str(optimizer_target).endswith(("AdamW", "AdamW8bit")):  # torch's, bitsandbytes' (paged or not)
        raise UserError(f"params sizes no optimizer._target_={optimizer_target}: use optimizer=adamw or adamw8bit")
    # bitsandbytes' 8-bit Adam keeps each moment in a byte a weight (its per-block scales, and the fp32 state of
    # tensors under 4,096 weights, left out); torch's AdamW keeps both in the parameter's dtype
    weights = 4 * adapters + head_dtype_bytes * head_copy
    return {"weights": weights, "gradients": weights,
            "optimizer": 2 * (adapters + head_copy) if str(optimizer_target).endswith("8bit") else 2 * weights}


def activation_bytes(shapes: Shapes, roles: dict, adapted: list[str], *, tokens: int, r: int, half: bool, cuda: bool,
                     dropout: bool, residual: int, checkpointing: bool, fp32_head: bool = False,
                     train_head: bool = False) -> dict[str, int]:
    """Activation memory of one micro-batch of `tokens` tokens through `shapes` (`roles`: LoRA role -> module name;
    `adapted`: the roles with adapters of rank `r`), under bf16 autocast (`half`) or fp32, on CUDA or a CPU;
    `residual`: bytes of the residual stream (the base's unquantised dtype). `saved`: what autograd keeps from the
    forward for the backward (less each attention's fp32 log-sum-exp, 4 B per head, and the rotary tables: under
    0.1%); `peak`: with what the backward adds at its largest. Per token and block, what is kept:

    - each RMSNorm's input in fp32 (it upcasts) and its fp32 scale; a frozen projection keeps nothing per token;
    - each adapter's dropout mask (a bool on CUDA; on a CPU a float of the fp32 adapter's dtype), lora_A's input
      cast to the compute dtype and lora_B's r inputs; under autocast, bf16 copies of both matrices a block;
    - q and k after rotation, v and the attention's output; the gated FFN's gate output, its activation and up's.
    The first block's input (from frozen embeddings) needs no gradient: what precedes its first adapter keeps
    nothing. Then the final norm, the loss's fp32 log-probabilities and int64 targets; the loss's backward adds
    their gradient and the logits' (8 B a vocabulary entry). Recomputation keeps each block's input alone and
    rebuilds one block at a time in backward.
    """
    dims = {role: p.shape for role, name in roles.items() for p in shapes.parts if name and names_target(p.name, name)}
    layers = sum(p.repeat for p in shapes.parts if names_target(p.name, roles[next(iter(dims))]))  # the blocks
    a, mask = (2 if half else 4), ((1 if cuda else 4) if dropout else 0)  # a matmul output's bytes; a mask's
    out = {role: dims.get(role, (0, 0))[0] for role in ("q", "k", "v", "up")}
    hidden = (dims.get("q") or dims.get("up") or next(iter(dims.values())))[1]
    norm, attention = 4 * hidden + 4, a * (2 * out["q"] + out["k"] + out["v"])
    per_token = 2 * norm + attention + (3 if "gate" in dims else 2) * a * out["up"] \
        + sum((mask + a) * dims[x][1] + a * r for x in adapted)
    per_block = 2 * r * sum(sum(dims[x]) for x in adapted) if half else 0
    # the first block up to its first adapter: its input norm and the masks (and lora_A copies) of the adapters
    # reading it; with none in attention, the attention, the second norm, and gate's and up's
    early = [x for x in adapted if x in ("q", "k", "v")] or [x for x in adapted if x in ("gate", "up")]
    skip = norm if any(x in adapted for x in ("q", "k", "v", "o")) else 2 * norm + attention
    first = tokens * (skip + sum(mask * dims[x][1] for x in early)) + sum(2 * r * dims[x][1] for x in early if half)
    vocab = next((p.shape[0] for p in shapes.parts if p.name == shapes.head and p.shape), shapes.vocab_size or 0)
    # a trainable head (lora=plus's copy) keeps its input; an fp32 head under autocast, its bf16 copy
    loss = tokens * (norm + 4 * vocab + 8 + a * hidden * train_head) + 2 * vocab * hidden * (fp32_head and half)
    block, backward = tokens * per_token + per_block, tokens * 8 * vocab
    saved = layers * tokens * residual * hidden + loss if checkpointing else layers * block - first + loss
    peak = saved + (max(block, backward) if checkpointing else backward)  # the loss's backward ends before a rebuild
    return {"saved": saved, "peak": peak, "layers": layers, "hidden": hidden, "vocab": vocab}
