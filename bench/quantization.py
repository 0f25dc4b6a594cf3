"""Benchmark: the memory and speed of a quantised base (quantization=none|8bit|4bit) on a CPU.

    python bench/quantization.py [--layers 2] [--steps 6] [--rounds 3]

Memory: a Mistral-7B-shaped stack at full width (hidden 4096, intermediate 14336, 32 heads / 8 KV heads,
vocabulary 32000: the bundled config.json with `--layers` decoder layers) with random bf16 weights is
written once as safetensors, then each of none (bf16), 8bit and 4bit loads it in a fresh process the way
`llasmol.train model.path=<folder>` does (`load_base_model`: from_pretrained with the bitsandbytes settings,
then PEFT's preparation for k-bit training) and puts LoRA `full` on top. Each process reports its peak RSS,
the bytes of the decoder layers' weights (quantisation metadata included), the bytes of the whole model as
prepared for training (PEFT casts the unquantised embeddings, norms and head to fp32) beside the meta-device
estimate `python -m llasmol.params` prints. Ratios are to bf16 in the same run.

Speed: optimizer steps per second of the tiny model (LoRA `full`, micro-batch 8 of 128 tokens, 8-bit AdamW)
for none/8bit/4bit in one process, interleaved in rounds (so a busy machine slows each alike); the median
step of each is kept. Writes bench/results/quantization.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, compose_config, write_result  # offline settings first
from llasmol.model.base import arch_config, load_base_model, load_tokenizer
from llasmol.model.lora import apply_lora, count_parameters
from llasmol.model.memory import weight_bytes

MODES = ("none", "8bit", "4bit")


def _write_stack(folder: Path, layers: int) -> None:
    """The Mistral-7B shape with `layers` decoder layers and random bf16 weights, saved as safetensors."""
    import torch
    from transformers import AutoModelForCausalLM

    config = arch_config("mistral-7b", num_hidden_layers=layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)


def load_once(folder: str, mode: str, layers: int) -> dict:
    """In a fresh process: load the stack as `mode`, add LoRA `full`, report memory."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = compose_config(["model=mistral", f"quantization={mode}", f"model.path={folder}"])
    no_tokenizer = type("Tokenizer", (), {"pad_token_id": 0})()  # the loader reads only the pad id
    start = time.perf_counter()
    base = load_base_model(cfg.model, no_tokenizer, cfg.quantization)
    # As prepared for training: PEFT has cast the unquantised parts (embeddings, norms, head) to fp32.
    loaded = sum(t.numel() * t.element_size() for t in base.state_dict().values())
    layer_types = ("Linear4bit", "Linear8bitLt") if mode != "none" else ("Linear",)
    layers = sum(t.numel() * t.element_size() for name, m in base.named_modules()
                 if type(m).__name__ in layer_types and name.split(".")[-1] != "lm_head"
                 for t in m.state_dict().values())
    model = apply_lora(base, cfg.model, cfg.lora)
    seconds = time.perf_counter() - start
    with torch.device("meta"):  # what `params` estimates for the same shape
        meta = AutoModelForCausalLM.from_config(arch_config("mistral-7b", num_hidden_layers=layers))
    estimate = weight_bytes(meta, torch.bfloat16, cfg.quantization)
    return {"mode": mode, "weight_bytes": loaded, "layer_bytes": layers, "estimate": estimate,
            "load_seconds": round(seconds, 1),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "params": count_parameters(model)}


def memory(layers: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="llasmol-bench-stack-") as folder:
        _write_stack(Path(folder), layers)
        rows = []
        for mode in MODES:
            out = subprocess.run([sys.executable, __file__, "--load-once", folder, mode, "--layers", str(layers)],
                                 capture_output=True, text=True, cwd=ROOT / "bench", check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = next(r for r in rows if r["mode"] == "none")
    for row in rows:
        row["layer_ratio"] = round(row["layer_bytes"] / base["layer_bytes"], 4)
        row["weight_ratio"] = round(row["weight_bytes"] / base["weight_bytes"], 4)
        row["rss_ratio"] = round(row["peak_rss_bytes"] / base["peak_rss_bytes"], 4)
    return rows


def speed(steps: int, rounds: int) -> list[dict]:
    import torch

    import hydra

    runs = {}
    for mode in MODES:
        cfg = compose_config([f"quantization={mode}", "optimizer._target_=bitsandbytes.optim.AdamW8bit"])
        tok = load_tokenizer(cfg.model)
        model = apply_lora(load_base_model(cfg.model, tok, cfg.quantization), cfg.model, cfg.lora).train()
        optimizer = hydra.utils.instantiate(cfg.optimizer)([p for p in model.parameters() if p.requires_grad])
        runs[mode] = (model, optimizer)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(4, 1000, (8, 128), generator=generator)
    times = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode, (model, optimizer) in runs.items():
            for _ in range(steps):
                start = time.perf_counter()
                model(input_ids=batch, labels=batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                times[mode].append(time.perf_counter() - start)
    base = statistics.median(times["none"])
    return [{"mode": mode, "median_step_seconds": round(statistics.median(t), 4),
             "steps_per_second": round(1 / statistics.median(t), 2),
             "slowdown_vs_none": round(statistics.median(t) / base, 2)} for mode, t in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-only", action="store_true", help="skip the memory part")
    parser.add_argument("--load-once", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_once:
        print(json.dumps(load_once(*args.load_once, args.layers)))
        return
    rows = [] if args.speed_only else memory(args.layers)
    gib = 1024 ** 3
    for r in rows:
        print(f"{r['mode']:>5}: decoder-layer weights {r['layer_bytes'] / gib:.3f} GiB ({r['layer_ratio']:.3f} of bf16), "
              f"whole model as trained {r['weight_bytes'] / gib:.3f} GiB ({r['weight_ratio']:.3f}; params estimate "
              f"{r['estimate']['training'] / gib:.3f}), peak RSS {r['peak_rss_bytes'] / gib:.2f} GiB "
              f"({r['rss_ratio']:.2f} of bf16), loaded in {r['load_seconds']} s")
    rates = speed(args.steps, args.rounds)
    for r in rates:
        print(f"{r['mode']:>5}: {r['steps_per_second']} steps/s on the tiny model ({r['slowdown_vs_none']}x the "
              "unquantised step time)")
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    write_result("quantization", {"command": "python bench/quantization.py " + " ".join(sys.argv[1:]),
                                  "layers": args.layers, "memory": rows, "speed": rates, "load_average": load})


if __name__ == "__main__":
    main()
