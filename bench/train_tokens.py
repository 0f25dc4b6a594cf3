"""Benchmark 1: useful (non-padding) training tokens per second, length-grouped vs random micro-batches.

    python bench/train_tokens.py [--samples 800] [--repeats 2] [--packed] [--step-cost]

Baseline: the paper's collation — micro-batches of 4 consecutive samples of a random order, each padded to
its longest sample. Ours: the same samples, grouped by length (`data.group_by_length=true`, the default).
Both train the tiny model (LoRA `full`) for the same samples, one thread, interleaved A/B runs; the best
time of each is kept. Prints both figures, the ratio and the padding fractions; writes
bench/results/train_tokens.json.

`--packed` adds a third plan: the random micro-batches of 4 through `data.packing` (`PackCollator`: one
row per micro-batch without padding, positions restarting at every sample so that attention stays inside
each sample, each sample's first label masked). Its loss on a micro-batch is checked to equal the padded
batch's before timing.

`--step-cost` is the profile behind the gap: the time of one training step (forward, backward, AdamW)
on micro-batches of 4 rows of 16…256 random tokens, median of 15, fitted as fixed + per-token cost.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date

import numpy as np
import torch

from _common import ROOT, SEED, compose_config  # offline settings first
from llasmol.data.collate import PackCollator
from llasmol.data.sampler import ShardedShuffleSampler
from llasmol.model.base import load_tokenizer
from llasmol.finetune.build import build_model
from llasmol.finetune.module import LoRACausalLM


def batches_of(order: np.ndarray, size: int) -> list[np.ndarray]:
    return [order[i : i + size] for i in range(0, len(order) - size + 1, size)]


def step_cost(model, optimizer, vocab: int, lengths=(16, 32, 64, 128, 256), repeats: int = 15) -> dict:
    """Median step time of 4-row micro-batches by length, and the least-squares fixed + per-token cost."""
    times = []
    g = torch.Generator().manual_seed(0)
    for n in lengths:
        ids = torch.randint(3, vocab, (4, n), generator=g)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            samples.append(time.perf_counter() - start)
        times.append(float(np.median(samples)))
    tokens = np.array([4 * n for n in lengths], dtype=float)
    per_token, fixed = np.polyfit(tokens, np.array(times), 1)
    return {"tokens": tokens.tolist(), "median_seconds": times, "fixed_seconds": float(fixed),
            "seconds_per_token": float(per_token)}


def run(model, dataset, collate, batches, optimizer) -> tuple[float, int, int]:
    """Seconds, useful tokens and padded tokens for one pass of training steps over `batches`."""
    useful = padded = 0
    start = time.perf_counter()
    for rows in batches:
        batch = collate([dataset[int(i)] for i in rows])
        loss = model(batch)  # LoRACausalLM.forward: padded batches and packed rows alike
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        useful += int(batch["attention_mask"].sum())
        padded += batch["attention_mask"].numel()
    return time.perf_counter() - start, useful, padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=800)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--packed", action="store_true", help="also time packed rows (see above)")
    parser.add_argument("--step-cost", action="store_true", help="also fit the fixed and per-token step cost")
    args = parser.parse_args()
    torch.set_num_threads(1)

    import hydra

    cfg = compose_config(["paths.output_dir=/tmp/unused", "data.micro_batch_size=4"])
    tokenizer = load_tokenizer(cfg.model)
    dm = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    train = dm.dataset("train")
    sampler = ShardedShuffleSampler(len(train), seed=SEED, rank=0, world_size=1, lengths=train.split.length_hints(),
                                    batch_size=4)
    subset = sampler._order()[: args.samples]
    plans = {"random (paper)": batches_of(subset, 4), "length-grouped (ours)": batches_of(sampler._group_by_length(subset), 4)}
    assert sorted(np.concatenate(plans["random (paper)"])) == sorted(np.concatenate(plans["length-grouped (ours)"]))

    peft_model, _ = build_model(cfg, tokenizer)
    model = LoRACausalLM(peft_model, optimizer=None)
    collates = {name: dm.collate for name in plans}
    if args.packed:
        plans["packed rows"] = plans["random (paper)"]
        collates["packed rows"] = PackCollator()
        first = [train[int(i)] for i in plans["packed rows"][0]]
        training = model.training
        model.eval()
        with torch.no_grad():
            unpacked, packed = model(dm.collate(first)), model(PackCollator()(first))
        model.train(training)
        assert torch.allclose(unpacked, packed, rtol=1e-5), (unpacked, packed)
        print(f"packed loss {packed.item():.6f} = unpacked {unpacked.item():.6f} on the first micro-batch")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    results = {name: {"seconds": float("inf")} for name in plans}
    run(model, train, dm.collate, plans["random (paper)"][:5], optimizer)  # warm-up
    for _ in range(args.repeats):
        for name, batches in plans.items():
            seconds, useful, padded = run(model, train, collates[name], batches, optimizer)
            if seconds < results[name]["seconds"]:
                results[name] = {"seconds": seconds, "useful_tokens": useful, "padded_tokens": padded,
                                 "useful_tokens_per_sec": useful / seconds, "padding_fraction": 1 - useful / padded}
    base, ours = results["random (paper)"], results["length-grouped (ours)"]
    ratio = ours["useful_tokens_per_sec"] / base["useful_tokens_per_sec"]
    if args.packed:
        results["packed rows"]["ratio"] = results["packed rows"]["useful_tokens_per_sec"] / base["useful_tokens_per_sec"]
    for name, r in results.items():
        print(f"{name:>22}: {r['useful_tokens_per_sec']:8.0f} useful tokens/s  padding {r['padding_fraction']:.1%}  "
              f"({r['useful_tokens']} tokens in {r['seconds']:.1f} s)")
    print(f"ratio: {ratio:.2f}x (target 1.5x)")
    cost = None
    if args.step_cost:
        cost = step_cost(model, optimizer, len(tokenizer))
        mean_tokens = base["padded_tokens"] / len(plans["random (paper)"])
        fixed_share = cost["fixed_seconds"] / (cost["fixed_seconds"] + cost["seconds_per_token"] * mean_tokens)
        cost.update(baseline_tokens_per_step=mean_tokens, fixed_share_at_baseline=fixed_share)
        print(f"step cost: {cost['fixed_seconds'] * 1e3:.1f} ms fixed + {cost['seconds_per_token'] * 1e6:.1f} us/token; "
              f"at the baseline's {mean_tokens:.0f} tokens a micro-batch the fixed part is {fixed_share:.0%}")
    out = ROOT / "bench" / "results" / "train_tokens.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "train_tokens", "date": str(date.today()), "machine": platform.processor() or platform.machine(),
                               "samples": args.samples, "micro_batch": 4, "baseline": base, "ours": ours,
                               "ratio": ratio, "target": 1.5, "packed": results.get("packed rows"),
                               "step_cost": cost}, indent=2) + "\n")


if __name__ == "__main__":
    main()
