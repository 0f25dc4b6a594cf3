"""A GPU run planned from `params`' numbers: the training peak per device (`llasmol.model.memory` counts its parts)
and the tokens and time of an epoch, each printed with what it rests on.

The time is model FLOPs (bench/gpu_check.py's count: 4 per frozen matmul weight, forward and input gradient; 6 per
adapter weight; attention at the max length) at the utilisation the GPU check measured on an H200, taken for every
GPU and base: an assumption, not a measurement. Tokens come from each task's mean sample length under Mistral-7B's
tokenizer, so another tokenizer's differ (Tekken's are 5-15% shorter, BENCHMARKS §7).
"""

from __future__ import annotations

import math

from llasmol.core.tasks import get_task
from llasmol.model.memory import DTYPE_BYTES, activation_bytes, trainable_bytes
from llasmol.model.roles import role_map
from llasmol.model.shapes import CONV1D, LINEAR, Shapes

# Dense bf16 peak, TFLOP/s (vendor datasheets, without sparsity): what bench/gpu_check.py's MFU divides by too.
GPU_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 70.0, "L4": 121.0}
PLANNED = ("H100", "H200", "A100")  # the classes `params` gives times for: the paper's and the GPU check's
# BENCHMARKS §6: LoRA full on Mistral-7B, 4 x 512-token micro-batches, bf16, 8-bit AdamW, one H200; and QLoRA (an
# NF4 base of 4 layers, gradient checkpointing), whose matmuls dequantise the base's weights first.
MEASURED_MFU = 0.221
MEASURED_MFU_QLORA = 0.068
# A sample's mean tokens under Mistral-7B's tokenizer (v1), cut at 512: the bundled sample's 360 a task, encoded as
# training encodes them (BENCHMARKS §7's encoding; tests/test_params_plan.py recounts them).
MEAN_TOKENS = {"forward_synthesis": 138.3, "retrosynthesis": 121.5, "name_conversion-i2f": 114.1,
               "name_conversion-i2s": 147.9, "name_conversion-s2f": 101.2, "name_conversion-s2i": 149.2,
               "property_prediction-esol": 79.9, "property_prediction-lipo": 95.2, "property_prediction-bbbp": 88.4,
               "property_prediction-clintox": 92.1, "property_prediction-hiv": 84.5}
# Real tokens among a micro-batch's positions: the paper's random micro-batches of 4 (BENCHMARKS §7), length-grouped
# ones (§1: 12.7% padding), packed rows.
REAL_SHARE = {"random": 0.72, "grouped": 0.873, "packed": 1.0}


def _size(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 / 10 else f"{n / 2 ** 20:.1f} MiB"


def memory_plan(cfg, shapes: Shapes, sizes: dict, trainable: int) -> tuple[list[str], dict, dict]:
    """The training peak per device with gradient checkpointing off and on (`sizes`: the weights' bytes,
    `llasmol.model.memory.weight_bytes`), the lines that say what it rests on, and the activations' count."""
    lora, data, on, roles = cfg.lora, cfg.data, int(cfg.gradient_checkpointing), role_map(cfg.model)
    half, cuda = str(cfg.trainer.precision).startswith(("bf16", "16")), cfg.trainer.accelerator != "cpu"
    # PEFT casts a quantised base's unquantised parts to fp32, and copies lora=plus's head in that dtype
    base_bytes = 4 if (cfg.get("quantization") or {}).get("bits") else DTYPE_BYTES[cfg.model.dtype]
    head_copy = sum(p.own * p.repeat for p in shapes.parts if p.name == shapes.head) if lora.get("train_head") else 0
    held = trainable_bytes(trainable - head_copy, head_copy, base_bytes, cfg.optimizer._target_)
    acts = [activation_bytes(shapes, roles, [x for x in lora.targets if roles.get(x)], r=lora.r, half=half, cuda=cuda,
                             tokens=data.micro_batch_size * data.max_length, dropout=lora.dropout > 0, checkpointing=c,
                             residual=base_bytes, fp32_head=base_bytes == 4, train_head=head_copy > 0) for c in (0, 1)]
    peak, act = [sizes["training"] + sum(held.values()) + a["peak"] for a in acts], acts[on]
    return [f"training peak per {'GPU' if cuda else 'CPU process'} ({'bf16 autocast' if half else 'fp32'}): "
            f"{_size(peak[on])} with gradient_checkpointing={str(bool(on)).lower()} ({_size(peak[1 - on])} with it "
            f"{'off' if on else 'on'}) = weights {_size(sizes['training'])} + fp32 adapters"
            f"{' and head copy' * bool(head_copy)} {_size(held['weights'])} + their gradients "
            f"{_size(held['gradients'])} + {cfg.optimizer._target_.rsplit('.', 1)[-1]} state {_size(held['optimizer'])}"
            f" + activations {_size(act['peak'])}",
            f"  activations of {data.micro_batch_size} x {data.max_length} tokens (micro-batch x max length), "
            f"{act['layers']} layers, hidden {act['hidden']}, vocabulary {act['vocab']}, checkpointing "
            f"{'on' if on else 'off'}; rests on PEFT's LoRA on Llama-style blocks (llasmol/model/memory.py), checked "
            f"against the GPU check's peaks (BENCHMARKS §6)"], {
        "train_peak_bytes": peak[on], "train_peak_bytes_checkpointing": {"off": peak[0], "on": peak[1]}}, act


def time_plan(cfg, shapes: Shapes, trainable: int, act: dict, samples: dict[str, int] | None) -> tuple[list, dict]:
    """The tokens of an epoch of `samples` (task -> training samples, before data.max_samples_per_task's cap; None:
    data of one's own, not estimated) and its training time on each GPU class (`act`: `memory_plan`'s count of
    blocks), and the lines that say so."""
    if samples is None:
        return [f"tokens per epoch: not estimated for data of one's own (data.path={cfg.data.get('path')})"], {
            "tokens_per_epoch": None, "epoch_seconds": None, "run_seconds": None}
    samples = {t: min(n, (cfg.data.get("max_samples_per_task") or {}).get("train") or n) for t, n in samples.items()}
    # A task the bundled sample lacks (captioning, molecule generation, SIDER: 4% of SMolInstruct): the others' mean
    table = {t: get_task(t).paper_counts[0] for t in MEAN_TOKENS}
    other = sum(MEAN_TOKENS[t] * n for t, n in table.items()) / sum(table.values())
    tokens = sum(n * MEAN_TOKENS.get(t, other) for t, n in samples.items())
    layout = "packed" if cfg.data.packing else "grouped" if cfg.data.group_by_length else "random"
    length, every, real = cfg.data.max_length, cfg.val_every_n_steps, REAL_SHARE[layout]
    frozen = sum(math.prod(p.shape) * p.repeat for p in shapes.parts if p.kind in (LINEAR, CONV1D))
    flops = 4 * frozen + 6 * trainable + 12 * act["layers"] * length * act["hidden"]
    quantized = bool((cfg.get("quantization") or {}).get("bits"))
    mfu, measured = (MEASURED_MFU_QLORA, "QLoRA MFU") if quantized else (MEASURED_MFU, "MFU")
    epoch = {g: tokens / real * flops / (mfu * GPU_TFLOPS[g] * 1e12) for g in PLANNED}
    steps = math.ceil(sum(samples.values()) / cfg.data.effective_batch_size)
    run = min(cfg.trainer.max_epochs * steps, cfg.trainer.max_steps if cfg.trainer.max_steps > 0 else math.inf)
    return [f"tokens per epoch: {tokens / 1e6:.2f}M in {sum(samples.values()):,} samples of {len(samples)} task(s) "
            f"(each task's mean tokens under Mistral-7B's tokenizer, BENCHMARKS §7), {tokens / real / 1e6:.2f}M "
            f"positions ({layout} micro-batches: {real:.0%} real)",
            "training time on one GPU (÷ GPUs under trainer=ddp): " + "; ".join(
                f"{g} {s / 3600:.3g} h an epoch, {s * run / steps / 3600:.3g} h in all" for g, s in epoch.items())
            + f" ({run:,} steps, {steps:,} an epoch); rests on {flops / 1e9:.3g} GFLOP a token (4 a frozen matmul "
            f"weight, 6 an adapter weight, attention at {length} tokens) at the GPU check's {measured} {mfu} (H200) "
            f"of each GPU's dense bf16 peak; {run // every} validations (every {every} steps) not included"], {
        "tokens_per_epoch": round(tokens), "epoch_seconds": {g: round(s, 1) for g, s in epoch.items()},
        "run_seconds": {g: round(s * run / steps, 1) for g, s in epoch.items()}}
