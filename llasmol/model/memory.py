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
"""

from __future__ import annotations

import math
from typing import Any, Optional

from llasmol.core.errors import UserError
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
