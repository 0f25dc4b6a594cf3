"""GPU check: a Mistral-7B-shaped model with random bf16 weights (nothing downloaded), the paper's LoRA
(`full`, r=16) and 8-bit AdamW, 20 training steps on 512-token micro-batches, then one beam-search
validation batch. Prints training tokens/s, peak GPU memory and model-FLOPs utilisation (MFU).
`--quantization 4bit|8bit` loads the base quantised (QLoRA) through llasmol's own loader instead.

    bash bench/gpu_check.sh                      # on a machine with an NVIDIA GPU; about a minute on an H200
    python bench/gpu_check.py --help             # shapes, steps, switches

MFU counts the FLOPs a LoRA step needs, not those of full fine-tuning: per token 2N (forward) + 2N
(gradients with respect to activations; frozen weights get no weight gradients) over the N frozen matmul
weights, 6 per adapter weight, and 12·layers·seq·hidden for attention scores (PaLM's count, forward and
backward). Divided by the GPU's dense bf16 peak (table below, or --peak-tflops).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MAX_LENGTH, compose_config  # noqa: E402  (sets offline mode before transformers loads)


# Dense bf16 peak, TFLOP/s, by device-name fragment (vendor datasheets, without sparsity).


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="mistral-7b", help="bundled architecture (llasmol/model/arch/*.json)")
    p.add_argument("--lora", default="full", help="LoRA variant (conf/lora)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (kernel selection, allocator)")
    p.add_argument("--micro-batch", type=int, default=4, help="the paper's micro-batch")
    p.add_argument("--seq-len", type=int, default=MAX_LENGTH, help="the paper's maximum length")
    p.add_argument("--prompts", type=int, default=8, help="prompts in the beam-search batch")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64, help="generated per beam (forced: no early stop)")
    p.add_argument("--beams", type=int, default=8, help="forward synthesis: 8 beams, 5 returned")
    p.add_argument("--returns", type=int, default=5)
    p.add_argument("--optimizer", choices=["adamw8bit", "adamw"], default="adamw8bit")
    p.add_argument("--quantization", choices=["none", "8bit", "4bit"], default="none",
                   help="QLoRA: the base quantised by bitsandbytes, loaded as llasmol.train loads it")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the architecture's)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not in the table")
    p.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    return p.parse_args(argv)


def build(args, torch):
    from transformers import AutoModelForCausalLM

    # lazy (here and in quantized_base): the model modules import torch (2-3 s), which `--help` and the one-line
    # "no CUDA GPU" error come before
    from llasmol.model.base import arch_config
    from llasmol.model.blocks import compile_blocks, enable_gradient_checkpointing
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["model=mistral", f"lora={args.lora}", f"quantization={args.quantization}",
                          "paths.output_dir=/unused"])
    config = arch_config(args.arch, **({"num_hidden_layers": args.layers} if args.layers else {}))
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    if args.quantization == "none":
        with torch.device(args.device):
            base = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        base = quantized_base(cfg, config, dtype, torch)
    model = apply_lora(base, cfg.model, cfg.lora)
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if args.compile:
        compile_blocks(model)
    return model, config


def quantized_base(cfg, config, dtype, torch):
    """Random weights written as safetensors, then loaded quantised by `load_base_model` from that folder,
    exactly as `llasmol.train model.path=<folder> quantization=4bit` loads a real base."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from llasmol.model.base import load_base_model  # lazy: see build

    with tempfile.TemporaryDirectory(prefix="llasmol-gpu-check-") as folder:
        AutoModelForCausalLM.from_config(config, dtype=dtype).save_pretrained(folder, safe_serialization=True)
        cfg.model.path, cfg.model.dtype = folder, str(dtype).removeprefix("torch.")
        no_tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()  # the loader reads only the pad id
        return load_base_model(cfg.model, no_tokenizer, cfg.quantization)


def flops_per_token(model, config, seq_len: int) -> float:
    """Model FLOPs of one LoRA training token (see the module docstring)."""
    frozen = trainable = 0
    for name, p in model.named_parameters():
        if "embed" in name or p.dim() < 2:
            continue  # lookups and norms are not matmuls
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    attention = 12 * config.num_hidden_layers * seq_len * config.hidden_size
    return 4 * frozen + 6 * trainable + attention


def peak_tflops(args, torch) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if not args.device.startswith("cuda"):
        return None
    from llasmol.model.plan import GPU_TFLOPS  # the one table, which `params` plans runs with

    name = torch.cuda.get_device_name()
    return next((v for k, v in GPU_TFLOPS.items() if k in name), None)


def train_steps(model, args, torch, vocab: int) -> dict:
    params = [p for p in model.parameters() if p.requires_grad]
    if args.optimizer == "adamw8bit":
        import bitsandbytes as bnb  # main() checked it is installed

        optimizer = bnb.optim.AdamW8bit(params, lr=1e-4, weight_decay=0.0)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    cuda = args.device.startswith("cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    generator = torch.Generator(device="cpu").manual_seed(1)
    model.train()
    losses = []
    device = next(p.device for p in model.parameters() if p.requires_grad)

    def step():
        ids = torch.randint(0, vocab, (args.micro_batch, args.seq_len), generator=generator).to(device)
        with autocast:
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())  # no host sync per step

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = args.steps * args.micro_batch * args.seq_len
    return {"seconds": round(seconds, 6), "tokens_per_sec": round(tokens / seconds, 1),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "first_loss": round(float(losses[0]), 4), "last_loss": round(float(losses[-1]), 4)}


def beam_search(model, args, torch, vocab: int) -> dict:
    cuda = args.device.startswith("cuda")
    model.eval()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(3, vocab, (args.prompts, args.prompt_len), generator=torch.Generator().manual_seed(2))
    ids = ids.to(next(model.parameters()).device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=args.beams,
            num_return_sequences=args.returns, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
            do_sample=False, pad_token_id=0,
        )
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new = out.shape[1] - args.prompt_len
    return {"seconds": round(seconds, 6), "sequences": int(out.shape[0]), "new_tokens_per_sequence": int(new),
            "beam_tokens_per_sec": round(args.prompts * args.beams * new / seconds, 1),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None}


def _has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device cuda but no CUDA GPU is visible: run on a GPU machine (or --device cpu "
                 "--arch tiny-mistral for a dry run)")
    if (args.optimizer == "adamw8bit" or args.quantization != "none") and not _has_bitsandbytes():
        if args.quantization != "none":
            sys.exit("error: --quantization needs bitsandbytes, which is not installed (bash bench/gpu_wheels.sh "
                     "fetches its wheel for the GPU machine)")
        print("bitsandbytes is not installed: torch AdamW instead of the paper's 8-bit AdamW", flush=True)
        args.optimizer = "adamw"
    started = time.perf_counter()
    model, config = build(args, torch)
    built = time.perf_counter() - started
    vocab = config.vocab_size
    train = train_steps(model, args, torch, vocab)
    per_token = flops_per_token(model, config, args.seq_len)
    peak = peak_tflops(args, torch)
    train["model_tflops_per_sec"] = round(train["tokens_per_sec"] * per_token / 1e12, 2)
    train["mfu"] = round(train["model_tflops_per_sec"] / peak, 4) if peak else None
    result = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "arch": args.arch, "lora": args.lora, "micro_batch": args.micro_batch, "seq_len": args.seq_len,
        "optimizer": args.optimizer, "quantization": args.quantization, "layers": config.num_hidden_layers,
        "gradient_checkpointing": args.gradient_checkpointing,
        "compile": args.compile, "peak_tflops": peak, "build_seconds": round(built, 1),
        "flops_per_token": per_token, "train": train, "beam_search": beam_search(model, args, torch, vocab),
        "total_seconds": round(time.perf_counter() - started, 1),
    }
    print(f"train: {train['tokens_per_sec']:,.0f} tokens/s, peak {train['peak_memory_gib']} GiB, "
          f"MFU {train['mfu']}; beam search: {result['beam_search']['seconds']} s for {args.prompts} prompts "
          f"x {args.beams} beams x {args.new_tokens} tokens")
    print(json.dumps(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
