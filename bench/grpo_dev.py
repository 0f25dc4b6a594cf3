"""Does the GRPO stage raise what it is rewarded for on held-out prompts? Its run against the SFT run it started
from, both evaluated on the dev split of the tasks it trained (`evaluate ... data.split=validation`, beam search,
the paper's metrics), sample by sample.

    python bench/grpo_dev.py --sft outputs/train/<sft run> --grpo outputs/train/<grpo run>

For every dev sample of the GRPO run's tasks: the exact-match statistic (the top answer is a gold) and, for SMILES
tasks, the similarity one (Morgan Tanimoto of a valid top answer to its closest gold, 0 otherwise), of each run;
then the mean over all samples of each, the GRPO run minus the SFT run, with a paired 95% bootstrap interval (10,000
resamples of the samples, the same draws for both runs). Also each task's headline metric, the validity of SMILES
answers and the share of answers that end (beams that reached their bound without an end are counted from the
predictions' `ended`). Written to bench/results/grpo_dev.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from _common import ROOT, write_result

RESAMPLES = 10_000


def _evaluated(run: Path, tasks: list[str]) -> Path:
    out = run / f"bench_dev_{'+'.join(sorted(tasks))}"  # one evaluation per task set: a cached one may hold others
    predictions = out / "predictions" / "validation.jsonl"
    if not predictions.is_file():
        subprocess.run([sys.executable, "-m", "llasmol.evaluate", f"ckpt={run}", "data.split=validation",
                        f"data.tasks=[{','.join(tasks)}]", f"hydra.run.dir={out}"], check=True, cwd=ROOT)
    return predictions


def per_sample(predictions: Path) -> dict[tuple, dict]:
    from llasmol.core.tasks import SMOLINSTRUCT
    from llasmol.inference.predictions import read_predictions
    from llasmol.metrics.scoring import record_golds, sample_stats

    records = read_predictions(predictions)
    out, seen = {}, {}
    for record, golds in zip(records, record_golds(records)):
        number = seen[record["task"]] = seen.get(record["task"], -1) + 1  # its place in its task: `index` counts all
        stats = sample_stats(record["task"], record["predictions"] or [], golds, skipped=record["skipped"])
        smiles = SMOLINSTRUCT.task(record["task"]).family == "smiles"
        out[(record["task"], number)] = {
            "exact": stats["hit_top1"], "similarity": stats["fts_morgan_sum"] if smiles else None,
            "valid": stats.get("num_valid") if smiles else None,
            "ended": bool((record.get("ended") or [True])[0])}
    return out


def paired(a: np.ndarray, b: np.ndarray) -> dict:
    draws = np.random.default_rng(0).integers(0, len(a), size=(RESAMPLES, len(a)))
    gaps = a[draws].mean(axis=1) - b[draws].mean(axis=1)
    low, high = np.percentile(gaps, [2.5, 97.5])
    return {"grpo": float(a.mean()), "sft": float(b.mean()), "difference": float(a.mean() - b.mean()),
            "interval": [float(low), float(high)], "samples": int(len(a)), "above_zero": bool(low > 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", type=Path, required=True)
    parser.add_argument("--grpo", type=Path, required=True)
    args = parser.parse_args()
    tasks = json.loads((args.grpo / "card.json").read_text())["tasks"]
    grpo, sft = per_sample(_evaluated(args.grpo, tasks)), per_sample(_evaluated(args.sft, tasks))
    keys = sorted(set(grpo) & set(sft))
    result = {"tasks": tasks}
    for term in ("exact", "similarity", "valid", "ended"):
        shared = [k for k in keys if grpo[k][term] is not None and sft[k][term] is not None]
        if shared:
            result[term] = paired(np.array([float(grpo[k][term]) for k in shared]),
                                  np.array([float(sft[k][term]) for k in shared]))
            r = result[term]
            print(f"{term}: GRPO {r['grpo']:.3f} vs SFT {r['sft']:.3f} over {r['samples']} dev samples: "
                  f"{r['difference']:+.3f} [{r['interval'][0]:+.3f}, {r['interval'][1]:+.3f}]")
    for task in tasks:
        mine = [k for k in keys if k[0] == task]
        result.setdefault("by_task", {})[task] = {
            run: {"exact": float(np.mean([d[k]["exact"] for k in mine])), "samples": len(mine)}
            for run, d in (("grpo", grpo), ("sft", sft))}
    write_result("grpo_dev", {"sft": str(args.sft), "grpo": str(args.grpo), "resamples": RESAMPLES, **result})


if __name__ == "__main__":
    main()
