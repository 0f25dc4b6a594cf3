"""The newcomer's held-out check of issue #40 item 1: how long a command takes to answer, against importing
torch (and transformers) in the same run, quiet and beside one busy process.

    python bench/command_latency.py          # median of 3 fresh processes per row, from a temporary folder

Rows: `import torch`; `import torch, transformers`; a mistyped setting (`train trainer.max_stepz=3`);
`params model=qwen3 lora=full`; the missing-weights line (`train model=mistral lora=full`, offline, nothing
cached); `params --list`. Ratios are against an import measured in the same run, so a slower machine moves
both sides.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

ROWS = {
    "import torch": ["-c", "import torch"],
    "import torch, transformers": ["-c", "import torch, transformers"],
    "mistyped setting": ["-m", "llasmol.train", "trainer.max_stepz=3"],
    "params qwen3 full": ["-m", "llasmol.params", "model=qwen3", "lora=full"],
    "missing weights": ["-m", "llasmol.train", "model=mistral", "lora=full"],
    "params --list": ["-m", "llasmol.params", "--list"],
}


def seconds(args: list[str], cwd: str) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": os.path.join(cwd, "hf")}
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True)
    return time.perf_counter() - start


def measure(cwd: str, runs: int = 3) -> dict[str, float]:
    times = {name: [] for name in ROWS}
    for _ in range(runs):  # interleaved: a slow moment of the machine falls on every row alike
        for name, args in ROWS.items():
            times[name].append(seconds(args, cwd))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    results = {}
    with tempfile.TemporaryDirectory() as cwd:
        results["quiet"] = measure(cwd)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            results["beside one busy process"] = measure(cwd)
        finally:
            busy.kill()
    for case, row in results.items():
        torch_s, transformers_s = row["import torch"], row["import torch, transformers"]
        print(f"{case}:")
        for name, value in row.items():
            against = torch_s if name == "mistyped setting" else transformers_s
            ratio = "" if name.startswith("import") else f"  ({value / against:.2f}x import "
            ratio += "" if name.startswith("import") else ("torch)" if name == "mistyped setting" else "torch, transformers)")
            print(f"  {name:28s} {value:6.2f} s{ratio}")
    write_result("command_latency", results)


if __name__ == "__main__":
    main()
