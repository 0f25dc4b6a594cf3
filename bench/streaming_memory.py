"""Benchmark 4: peak resident memory of the DataModule over 10,000 vs 1,000,000 synthetic samples.

Synthetic SMolInstruct copies in the official layout (raw/<split>/<task>.jsonl,
sample/instruction_tuning/<split>/<task>.json, template/instruction_tuning/<task>.json,
core_tag/<task>.json; the format of tests/smolinstruct_fixture.py) are written to a temporary folder,
split evenly over 5 tasks of the train split. Each size then runs in a fresh subprocess: setup (the
index) and the first --batches micro-batches of the shuffled train loader with the tiny tokenizer
(a full epoch of 1,000,000 samples through tokenization does not fit the time budget), and reports its
peak RSS (ru_maxrss) and where it stood after setup.

    python bench/streaming_memory.py [--small 10000] [--large 1000000] [--batches 250]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402

from llasmol.core.tasks import get_task  # noqa: E402

TASKS = ("forward_synthesis", "name_conversion-s2f", "property_prediction-esol", "property_prediction-bbbp",
         "name_conversion-s2i")
TEMPLATES = [{"input": "Question about <INPUT> ?", "output": "The answer is <OUTPUT> ."},
             {"input": "Tell me: <INPUT>", "output": "<OUTPUT>"}]
SMILES = ["CCO", "CC(=O)O", "c1ccccc1", "CCN(CC)CC", "O=C(O)c1ccccc1O", "CC(C)O", "CCCCCC", "c1ccncc1",
          "CC(=O)Nc1ccc(O)cc1", "ClCCl", "CCOC(C)=O", "OCC(O)CO", "C1CCOC1", "CS(C)=O", "N#Cc1ccccc1"]


def write_copy(root: Path, total: int) -> None:
    per_task = total // len(TASKS)
    for task in TASKS:
        (root / "core_tag").mkdir(parents=True, exist_ok=True)
        (root / "core_tag" / f"{task}.json").write_text(json.dumps(get_task(task).core_tags()))
        (root / "template" / "instruction_tuning").mkdir(parents=True, exist_ok=True)
        (root / "template" / "instruction_tuning" / f"{task}.json").write_text(json.dumps(TEMPLATES))
        for split, n in (("train", per_task), ("dev", 10), ("test", 10)):
            raw = root / "raw" / split
            raw.mkdir(parents=True, exist_ok=True)
            with (raw / f"{task}.jsonl").open("w") as fh:
                for k in range(n):
                    smi = SMILES[k % len(SMILES)] + "C" * (k % 7)
                    fh.write(json.dumps({"input": smi, "output": f"{smi}.O", "task": task, "split": split}) + "\n")
            sdir = root / "sample" / "instruction_tuning" / split
            sdir.mkdir(parents=True, exist_ok=True)
            with (sdir / f"{task}.json").open("w") as fh:  # written in pieces: the large list is big
                fh.write(json.dumps({"task": task, "split": split, "template_name": "instruction_tuning"})[:-1])
                fh.write(', "samples": [')
                fh.write(", ".join(json.dumps({"idx": k, "template_id": k % 2, "target": None}) for k in range(n)))
                fh.write("]}")


CHILD = r"""
import json, os, resource, sys, time
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import torch
torch.set_num_threads(1)
sys.path.insert(0, {bench!r})
from _common import compose_config
from llasmol.model.base import load_tokenizer
import hydra
cfg = compose_config(["data.path={root}", "data.tasks={tasks}", "data.micro_batch_size=8",
                      "data.effective_batch_size=8"])
tok = load_tokenizer(cfg.model)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before = rss()
t0 = time.perf_counter()
dm = hydra.utils.instantiate(cfg.data, tokenizer=tok, _convert_="all")
dm.setup("fit")
setup_s = time.perf_counter() - t0
after_setup = rss()
n = 0
t0 = time.perf_counter()
for b, batch in enumerate(dm.train_dataloader()):
    n += batch["input_ids"].shape[0]
    if b + 1 >= {batches}:
        break
print(json.dumps({{"samples": len(dm.split("train")), "iterated": n, "setup_s": setup_s,
                  "iterate_s": time.perf_counter() - t0, "rss_before_setup_mib": before,
                  "rss_after_setup_mib": after_setup, "peak_rss_mib": rss()}}))
"""


def run_child(root: Path, batches: int) -> dict:
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), root=str(root), tasks=list(TASKS), batches=batches)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--batches", type=int, default=250)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llasmol-stream-") as tmp:
        results = {}
        for name, size in (("small", args.small), ("large", args.large)):
            root = Path(tmp) / name
            t0 = time.perf_counter()
            write_copy(root, size)
            print(f"wrote {size} samples in {time.perf_counter() - t0:.1f}s", flush=True)
        for name in ("small", "large"):
            results[name] = run_child(Path(tmp) / name, args.batches)
            r = results[name]
            print(f"{name}: {r['samples']} samples  setup {r['setup_s']:.1f}s  RSS before setup {r['rss_before_setup_mib']:.0f} MiB, "
                  f"after setup {r['rss_after_setup_mib']:.0f} MiB, peak after {r['iterated']} samples {r['peak_rss_mib']:.0f} MiB", flush=True)
    base, ours = results["small"]["peak_rss_mib"], results["large"]["peak_rss_mib"]
    growth = ours / base - 1
    print(f"baseline ({args.small} samples): peak {base:.0f} MiB")
    print(f"ours ({args.large} samples): peak {ours:.0f} MiB")
    print(f"ratio: {ours / base:.3f} (growth {growth * 100:+.1f}%, target within 10%)")
    write_result("streaming_memory", {
        "baseline": {"what": f"{args.small} samples", **results["small"]},
        "ours": {"what": f"{args.large} samples", **results["large"]},
        "ratio": ours / base, "growth": growth, "target": "within 10%", "met": abs(growth) <= 0.10,
        "note": f"setup + the first {args.batches} micro-batches of 8 (not a full epoch)",
    })


if __name__ == "__main__":
    main()
