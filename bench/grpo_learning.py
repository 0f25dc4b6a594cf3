"""Benchmark 21: GRPO learns on a CPU (issue #50 item 4). From the default job's run, `objective=grpo` trains
forward synthesis for --steps steps; this reads the run's rollouts (every completion's reward and reward terms)
and reports each step's mean, the first and last --window steps' means with 95% bootstrap intervals (steps
resampled: a step's completions share a prompt and an adapter, so they are not independent), and the change
between them with its interval.

    python bench/grpo_learning.py                       # trains what is missing into /tmp, then reads it
    python bench/grpo_learning.py --grpo RUN            # only reads a finished GRPO run

The two commands it runs (the README's):
    python -m llasmol.train hydra.run.dir=<sft>                        (both with logger=csv)
    python -m llasmol.train objective=grpo init_from=<sft> data.tasks=[forward_synthesis] trainer.max_steps=300 \
        trainer.max_epochs=-1 optimizer.lr=2e-4 hydra.run.dir=<grpo>
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, SEED, write_result  # noqa: E402


def grpo_command(sft: Path, grpo: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "llasmol.train", "objective=grpo", f"init_from={sft}",
            "data.tasks=[forward_synthesis]", f"trainer.max_steps={steps}", "trainer.max_epochs=-1",
            "optimizer.lr=2e-4", f"hydra.run.dir={grpo}", "logger=csv", "trainer.enable_progress_bar=false"]


def run(command: list[str]) -> float:
    print("$", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def step_means(grpo: Path) -> dict[str, np.ndarray]:
    """`reward` and each reward term: the mean over each step's completions, in step order."""
    files = sorted((grpo / "rollouts").glob("step*.jsonl"), key=lambda p: int(p.stem[4:]))
    series: dict[str, list[float]] = {}
    for path in files:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        series.setdefault("reward", []).append(float(np.mean([r["reward"] for r in records])))
        for term in records[0]["terms"]:
            series.setdefault(term, []).append(float(np.mean([r["terms"][term] for r in records])))
    return {name: np.asarray(values) for name, values in series.items()}


def interval(values: np.ndarray, rng: np.random.Generator, resamples: int) -> list[float]:
    means = rng.choice(values, size=(resamples, values.size)).mean(axis=1)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def windows(series: np.ndarray, window: int, resamples: int = 10_000, seed: int = SEED) -> dict:
    rng = np.random.default_rng(seed)
    first, last = series[:window], series[-window:]
    change = (rng.choice(last, size=(resamples, window)).mean(axis=1)
              - rng.choice(first, size=(resamples, window)).mean(axis=1))
    return {"first": float(first.mean()), "first_95": interval(first, rng, resamples),
            "last": float(last.mean()), "last_95": interval(last, rng, resamples),
            "change": float(last.mean() - first.mean()),
            "change_95": [float(np.percentile(change, 2.5)), float(np.percentile(change, 97.5))]}


def plot(series: dict[str, np.ndarray], path: Path, smooth: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, values in series.items():
        kernel = np.ones(smooth) / smooth
        ax.plot(np.arange(smooth, values.size + 1), np.convolve(values, kernel, mode="valid"), label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"mean over the step's completions\n(moving average of {smooth} steps)")
    ax.set_title("GRPO from the default job's run: forward synthesis, tiny model, CPU", fontsize="medium")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sft", type=Path, default=Path("/tmp/llasmol-bench-sft"))
    p.add_argument("--grpo", type=Path, default=Path("/tmp/llasmol-bench-grpo"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=50)
    args = p.parse_args(argv)
    seconds = {}
    if not (args.grpo / "rollouts").is_dir():
        if not (args.sft / "checkpoints").is_dir():
            seconds["sft"] = run([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={args.sft}", "logger=csv",
                                  "trainer.enable_progress_bar=false"])
        seconds["grpo"] = run(grpo_command(args.sft, args.grpo, args.steps))
    series = step_means(args.grpo)
    steps = series["reward"].size
    result = {"grpo_run": str(args.grpo), "steps": steps, "window": args.window, "wall_s": seconds,
              **{name: windows(values, args.window) for name, values in series.items()},
              "per_25_steps": {name: [round(float(values[i:i + 25].mean()), 4) for i in range(0, steps, 25)]
                               for name, values in series.items()}}
    plot(series, RESULTS / "grpo_learning.png")
    print(json.dumps({k: v for k, v in result.items() if k != "per_25_steps"}, indent=2))
    write_result("grpo_learning", result)


if __name__ == "__main__":
    main()
