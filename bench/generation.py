"""Benchmark 2: validation/test generation, batched (batch_size=8) against one prompt at a time.

Both runs use BeamGenerator with the same per-task BeamSettings (the default config: the paper's beams,
`conf/generation/paper.yaml`, with the demo's `max_new_tokens_limit`), over the same task-balanced prompts
of the bundled sample's validation split; tasks alternate which run goes first so both see the same
machine load. Outputs (raw responses, best first, and so the extracted answers) must be identical.

- baseline: `BeamGenerator(batch_size=1)`, one prompt at a time (the paper's evaluation);
- ours: `BeamGenerator(batch_size=8)` (the config's `generation.batch_size`): batched, length-sorted.

With --profile, one SMILES task is also run under cProfile at both batch sizes, and the split of time
between the model's forward passes and the rest of beam search is printed.

    python bench/generation.py [--per-task 16] [--profile] [--adapter DIR | --random-init] [--max-new-tokens-limit N]

Without --adapter, a briefly trained adapter (150 steps of the default run) is trained once into
/tmp/llasmol-bench-adapter and reused (--random-init uses the untrained base instead).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compose_config, write_result  # noqa: E402
from llasmol.inference.beam_search import BeamGenerator, task_settings  # noqa: E402
from llasmol.inference.loading import load_model  # noqa: E402
from llasmol.inference.pipeline import balanced_subset  # noqa: E402
from llasmol.metrics.extract import extract_answer  # noqa: E402
from llasmol.train import train  # noqa: E402

ADAPTER_DIR = Path("/tmp/llasmol-bench-adapter")


def trained_adapter() -> Path:
    adapter = ADAPTER_DIR / "checkpoints" / "last.adapter"
    if not (adapter / "adapter_config.json").is_file():
        print("training a 150-step adapter once into", ADAPTER_DIR, flush=True)
        train(compose_config([f"paths.output_dir={ADAPTER_DIR}", "logger=csv", "trainer.max_steps=150",
                              "val_every_n_steps=1000", "trainer.enable_progress_bar=false"]))
    return adapter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-task", type=int, default=16)
    parser.add_argument("--adapter", default=None)
    parser.add_argument("--random-init", action="store_true")
    parser.add_argument("--max-new-tokens-limit", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)

    cfg = compose_config()
    gen_cfg = cfg.generation
    if args.max_new_tokens_limit is not None:
        gen_cfg.max_new_tokens_limit = args.max_new_tokens_limit
    adapter = None if args.random_init else (args.adapter or str(trained_adapter()))
    model, tokenizer = load_model(cfg.model, adapter)
    import hydra
    from omegaconf import OmegaConf

    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    data_cfg.pop("split", None)
    dm = hydra.utils.instantiate(data_cfg, tokenizer=tokenizer, _convert_="all")
    split = dm.split("validation")
    indices = balanced_subset(split, args.per_task, cfg.seed)
    by_task: dict[str, list[str]] = {}
    for i in indices:
        sample = split[i]
        by_task.setdefault(sample["task"], []).append(sample["input"])

    one = BeamGenerator(model, tokenizer, dm.formatter, gen_cfg.max_prompt_tokens, batch_size=1)
    batched = BeamGenerator(model, tokenizer, dm.formatter, gen_cfg.max_prompt_tokens, batch_size=args.batch_size)
    # Warm-up (first-call allocations, lazy imports) outside the timings.
    first_task = next(iter(by_task))
    one.generate(by_task[first_task][:1], task_settings(gen_cfg, first_task))

    times = {"baseline": 0.0, "ours": 0.0}
    per_task = {}
    mismatches = []
    n = 0
    for k, (task, queries) in enumerate(by_task.items()):
        settings = task_settings(gen_cfg, task)
        runs = [("baseline", one), ("ours", batched)]
        if k % 2:
            runs.reverse()
        outs, secs = {}, {}
        for name, gen in runs:
            t0 = time.perf_counter()
            outs[name] = gen.generate(queries, settings)
            secs[name] = time.perf_counter() - t0
            times[name] += secs[name]
        n += len(queries)
        same_raw = outs["baseline"] == outs["ours"]
        answers = {name: [[extract_answer(task, p) for p in (o or [])] for o in out] for name, out in outs.items()}
        same_answers = answers["baseline"] == answers["ours"]
        if not same_answers:
            mismatches.append(task)
        per_task[task] = {"samples": len(queries), "settings": settings.__dict__, "baseline_s": round(secs["baseline"], 3),
                          "ours_s": round(secs["ours"], 3), "identical_raw": same_raw, "identical_answers": same_answers}
        print(f"{task:<30} n={len(queries)} beams={settings.num_beams}/{settings.num_return_sequences} "
              f"max_new={settings.max_new_tokens}  bs1 {secs['baseline']:.2f}s  bs{args.batch_size} {secs['ours']:.2f}s  "
              f"identical raw={same_raw} answers={same_answers}", flush=True)

    base_sps, ours_sps = n / times["baseline"], n / times["ours"]
    ratio = ours_sps / base_sps
    print(f"baseline (batch_size=1): {base_sps:.2f} samples/s ({times['baseline']:.1f}s for {n})")
    print(f"ours (batch_size={args.batch_size}): {ours_sps:.2f} samples/s ({times['ours']:.1f}s for {n})")
    print(f"ratio: {ratio:.2f}x (target >= 4x)  identical answers: {not mismatches}")
    prof = profile(model, one, batched, by_task, gen_cfg, task_settings) if args.profile else None
    write_result("generation", {"profile": prof,
        "model": "tiny" + (" + 150-step adapter" if adapter else " (random init)"), "adapter": adapter,
        "samples": n, "per_task": args.per_task, "max_new_tokens_limit": gen_cfg.max_new_tokens_limit,
        "baseline": {"what": "BeamGenerator batch_size=1", "seconds": times["baseline"], "samples_per_s": base_sps},
        "ours": {"what": f"BeamGenerator batch_size={args.batch_size}", "seconds": times["ours"], "samples_per_s": ours_sps},
        "ratio": ratio, "target": 4.0, "met": ratio >= 4.0 and not mismatches,
        "identical_answers": not mismatches, "mismatched_tasks": mismatches, "tasks": per_task,
    })


def profile(model, one, batched, by_task, gen_cfg, task_settings, task: str = "forward_synthesis") -> dict:
    """cProfile of one task at both batch sizes: forward passes vs the rest, and the top functions."""
    import cProfile
    import io
    import pstats

    queries = by_task[task]
    settings = task_settings(gen_cfg, task)
    out = {}
    for name, gen in (("batch_size=1", one), (f"batch_size={batched.batch_size}", batched)):
        prof = cProfile.Profile()
        prof.enable()
        gen.generate(queries, settings)
        prof.disable()
        stats = pstats.Stats(prof)
        total = stats.total_tt
        # The outermost model forward (MistralForCausalLM.forward): the largest cumulative "forward" there.
        forward = max((v[3] for k, v in stats.stats.items() if k[2] == "forward" and "modeling_mistral" in k[0]),
                      default=0.0)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(8)
        top = "\n".join(line for line in buf.getvalue().splitlines() if line.strip().startswith(tuple("0123456789")))
        out[name] = {"total_s": total, "model_forward_s": forward, "top_by_tottime": top}
        print(f"--- profile {task}, {len(queries)} prompts, {name}: {total:.2f}s, model forward {forward:.2f}s "
              f"({100 * forward / total:.0f}%), rest of beam search {total - forward:.2f}s\n{top}")
    return out


if __name__ == "__main__":
    main()
