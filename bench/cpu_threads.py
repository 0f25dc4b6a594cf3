"""Benchmark: training tokens per second on a CPU, alone and beside one competing process, by thread count
and OpenMP wait policy.

    python bench/cpu_threads.py [--seconds 20] [--repeats 3]

Each measurement is a fresh process (OpenMP reads its wait policy once, when torch loads it) that trains
the default job's tiny model (LoRA `full`, AdamW) on micro-batches of 4 rows of 128 tokens for `--seconds`
after a warm-up, and prints the tokens it trained per second. The settings compared:

- `before`: what a run got until now: torch's default of one thread per core, libgomp's default wait policy
  (a thread at a barrier spins 300,000 times before it sleeps);
- `after`: the default of conf/cpu/ (`threads: null`, `wait_policy: passive`) applied as a command applies
  it (`llasmol.core.threads.use_cpu_threads`): one thread per usable core, a waiting thread sleeps at once;
- `one thread`: one intra-op thread (no barriers to wait at), for comparison.

"Beside one competing process" runs a second process that keeps one core busy (a Python loop) for the
whole measurement, as another user's job would. The configurations are interleaved, `--repeats` times, and
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
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import os, sys, time
sys.path.insert(0, {bench!r})
from _common import compose_config
from llasmol.core.threads import use_cpu_threads

threads = {threads!r}
if threads == "after":  # as a command does it: before anything loads torch
    use_cpu_threads(compose_config([]).cpu)
import torch
from llasmol.model.base import load_tokenizer
from llasmol.finetune.build import build_model
from llasmol.finetune.module import LoRACausalLM

if threads not in ("after", "default"):
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
for _ in range(3):
    step()
start, steps = time.perf_counter(), 0
while time.perf_counter() - start < {seconds}:
    step(); steps += 1
print(4 * 128 * steps / (time.perf_counter() - start), torch.get_num_threads())
"""

SETTINGS = {"before": "default", "after": "after", "one thread": "1"}  # -> the worker's `threads`


def measure(name: str, seconds: float, compete: bool) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    code = WORKER.format(bench=str(ROOT / "bench"), threads=SETTINGS[name], seconds=seconds)
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if compete else None
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                             cwd=ROOT).stdout.split()
    finally:
        if rival:
            rival.kill()
            rival.wait()
    return float(out[0]), int(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    args = parser.parse_args()
    runs: dict[str, list[float]] = {}
    threads: dict[str, int] = {}
    loads = []
    for _ in range(args.repeats):
        for compete in (False, True):
            for name in args.only:
                loads.append(os.getloadavg()[0])
                tps, n = measure(name, args.seconds, compete)
                key = f"{name} | {'beside one competing process' if compete else 'alone'}"
                runs.setdefault(key, []).append(tps)
                threads[name] = n
                print(f"{key:45} {tps:9.0f} tokens/s ({n} threads)", flush=True)
    result = {
        "command": "python bench/cpu_threads.py " + " ".join(sys.argv[1:]),
        "date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average_1min": {"min": min(loads), "max": max(loads)},
        "threads": threads,
        "tokens_per_s_median": {k: statistics.median(v) for k, v in runs.items()},
        "tokens_per_s_runs": runs,
    }
    out = ROOT / "bench" / "results" / "cpu_threads.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["tokens_per_s_median"], indent=1))


if __name__ == "__main__":
    main()
