"""Benchmark: training tokens per second on a CPU, alone and beside one competing process, by thread count
and OpenMP wait policy.

    python bench/cpu_threads.py [--seconds 15] [--repeats 3]

Each measurement is a fresh process (OpenMP reads its wait policy once, when torch loads it) that trains
the default job's tiny model (LoRA `full`, AdamW) on micro-batches of 4 rows of 128 tokens for `--seconds`
after a warm-up, and prints the tokens it trained per second and the threads it ended on. The settings:

- `spin`: torch's default of one thread per core with libgomp's default wait (a thread at a barrier spins
  300,000 times before it sleeps);
- `passive`: one thread per core, a waiting thread sleeps at once (`cpu.wait_policy=passive`);
- `one thread`: one intra-op thread (no barriers to wait at);
- `auto`: the default of conf/cpu/ (`wait_policy: auto`) applied as a command applies it
  (`llasmol.core.threads.use_cpu_threads`: the runtime's wait, one thread per core other work leaves free,
  counted while torch loads) and recounted as training does (`retune_threads` after every step).

Three conditions: alone; beside one competing process that keeps one core busy (a Python loop) from before
the start, as another user's job would; and with that process joining 4 seconds after the start (so `auto`
counts all cores free at start and must notice). The configurations are interleaved, `--repeats` times, and
the median of each is kept; the machine's load average is recorded, since other work changes every figure.
Writes bench/results/cpu_threads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import os, sys, time
sys.path.insert(0, {bench!r})
from _common import compose_config
from llasmol.core.threads import retune_threads, use_cpu_threads

threads = {threads!r}
if threads == "auto":  # as a command does it: before anything loads torch
    use_cpu_threads(compose_config([]).cpu)
import torch
from llasmol.model.base import load_tokenizer
from llasmol.finetune.build import build_model
from llasmol.finetune.module import LoRACausalLM

if threads not in ("auto", "default"):
    torch.set_num_threads(int(threads))
cfg = compose_config(["paths.output_dir=/tmp/unused"])
tok = load_tokenizer(cfg.model)
model, _ = build_model(cfg, tok)
module = LoRACausalLM(model, optimizer=None)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
g = torch.Generator().manual_seed(0)
ids = torch.randint(3, len(tok), (4, 128), generator=g)
batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
def step():
    module(batch).backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if threads == "auto":
        retune_threads()  # what training's FreeCoreThreads callback does after every batch
for _ in range(3):
    step()
start, steps = time.perf_counter(), 0
while time.perf_counter() - start < {seconds}:
    step(); steps += 1
print(4 * 128 * steps / (time.perf_counter() - start), torch.get_num_threads())
"""

# name -> (the worker's `threads`, the OpenMP environment it starts with)
SETTINGS = {
    "spin": ("default", {}),
    "passive": ("default", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "one thread": ("1", {}),
    "auto": ("auto", {}),
}
CONDITIONS = {"alone": None, "beside one competing process": 0.0, "a competing process joins after 4 s": 4.0}


def measure(name: str, seconds: float, rival_after: Optional[float]) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    threads, omp = SETTINGS[name]
    env.update(omp)
    code = WORKER.format(bench=str(ROOT / "bench"), threads=threads, seconds=seconds)
    rival = None
    if rival_after == 0.0:
        rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)  # already running when the worker looks
    try:
        worker = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        if rival_after:
            time.sleep(rival_after)
            rival = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        out = worker.communicate()[0].split()
        if worker.returncode:
            raise SystemExit(f"{name}: the worker failed ({worker.returncode})")
    finally:
        if rival:
            rival.kill()
            rival.wait()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    args = parser.parse_args()
    runs: dict[str, list[float]] = {}
    threads: dict[str, int] = {}
    loads = []
    for _ in range(args.repeats):
        for condition, rival_after in CONDITIONS.items():
            for name in args.only:
                loads.append(os.getloadavg()[0])
                tps, n = measure(name, args.seconds, rival_after)
                key = f"{name} | {condition}"
                runs.setdefault(key, []).append(tps)
                threads[key] = n
                print(f"{key:55} {tps:9.0f} tokens/s, {4 * 128 / tps * 1000:6.1f} ms a step ({n} threads at the end)",
                      flush=True)
    result = {
        "command": "python bench/cpu_threads.py " + " ".join(sys.argv[1:]),
        "date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_1min": {"min": min(loads), "max": max(loads)},
        "threads": threads,
        "tokens_per_s_median": {k: statistics.median(v) for k, v in runs.items()},
        "ms_per_step_median": {k: 4 * 128 / statistics.median(v) * 1000 for k, v in runs.items()},
        "of_the_best_median": {k: statistics.median(v) / max(statistics.median(runs[f"{n} | {k.split(' | ')[1]}"])
                                                             for n in args.only) for k, v in runs.items()},
        "tokens_per_s_runs": runs,
    }
    out = ROOT / "bench" / "results" / "cpu_threads.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["tokens_per_s_median"], indent=1))


if __name__ == "__main__":
    main()
