"""Benchmark: generation with the adapter merged into the base (merge_adapter=true, as the official
evaluation does) against PEFT's separate adapter layers, on the bundled validation split.

    python bench/merged_generation.py [--per-task 8] [--adapter DIR]

The same trained adapter (benchmark 2's 150-step adapter unless --adapter) is loaded twice by
`load_model`, merged and not; both answer the same task-balanced prompts with the paper's per-task beams
(the demo's new-token cap), tasks alternating which goes first. Prints each one's samples per second, the
ratio, and how many samples' responses and extracted answers differ. Writes
bench/results/merged_generation.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compose_config, write_result  # noqa: E402
from generation import trained_adapter  # noqa: E402
from llasmol.data.formatting import PromptFormatter  # noqa: E402
from llasmol.data.source import SMolInstructSource  # noqa: E402
from llasmol.inference.beam_search import BeamGenerator, task_settings  # noqa: E402
from llasmol.inference.loading import load_model  # noqa: E402
from llasmol.inference.pipeline import balanced_subset  # noqa: E402
from llasmol.metrics.extract import extract_answer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--adapter", default=None)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from omegaconf import OmegaConf

    cfg = compose_config([], "evaluate")
    adapter = args.adapter or str(trained_adapter())
    split = SMolInstructSource.from_config(OmegaConf.to_container(cfg.data, resolve=True)).split("validation")
    by_task: dict[str, list[str]] = {}
    for i in balanced_subset(split, args.per_task, cfg.seed):
        by_task.setdefault(split[i]["task"], []).append(split[i]["input"])
    generators = {}
    for name, merge in (("separate", False), ("merged", True)):
        model, tok = load_model(cfg.model, adapter, merge=merge)
        generators[name] = BeamGenerator(model, tok, PromptFormatter(tok, cfg.model.prompt_template),
                                         cfg.generation.max_prompt_tokens, cfg.generation.batch_size)
    seconds = {name: 0.0 for name in generators}
    differ_raw = differ_answers = n = 0
    for k, (task, queries) in enumerate(by_task.items()):
        settings = task_settings(cfg.generation, task)
        order = list(generators) if k % 2 == 0 else list(reversed(generators))
        outs = {}
        for name in order:
            start = time.perf_counter()
            outs[name] = generators[name].generate(queries, settings)
            seconds[name] += time.perf_counter() - start
        for a, b in zip(outs["separate"], outs["merged"]):
            n += 1
            differ_raw += a != b
            differ_answers += [extract_answer(task, r) for r in a or []] != [extract_answer(task, r) for r in b or []]
    rates = {name: n / s for name, s in seconds.items()}
    ratio = rates["merged"] / rates["separate"]
    print(f"separate adapter: {rates['separate']:.2f} samples/s; merged: {rates['merged']:.2f} samples/s "
          f"({ratio:.2f}x); responses differ in {differ_raw} of {n} samples, answers in {differ_answers}")
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    write_result("merged_generation", {
        "command": "python bench/merged_generation.py " + " ".join(sys.argv[1:]), "adapter": adapter, "samples": n,
        "seconds": seconds, "samples_per_s": rates, "ratio": ratio, "differing_responses": differ_raw,
        "differing_answers": differ_answers, "load_average": load})


if __name__ == "__main__":
    main()
