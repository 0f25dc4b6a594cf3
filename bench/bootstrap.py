"""Benchmark 10: what 95% bootstrap intervals and a paired comparison cost on a test split of SMolInstruct's
size (issue #17).

Records are benchmark 3's synthetic predictions (`bench/scoring.py`: the bundled sample's golds, a mix of
right, wrong, invalid and untagged answers), 30,000 of them. Timed, in one process:

1. `per_sample_statistics`: every record scored once (RDKit parsing, fingerprints): what `evaluate` pays
   anyway, since the metrics are made from these same statistics;
2. `bootstrap_intervals` with 1,000 resamples: resampling the statistics only;
3. `paired_difference` of two such runs (the second with 10% of its answers replaced), 1,000 resamples.

The baseline is the straightforward bootstrap that re-scores each resample: 1,000 times the cost of
scoring the records again with the parsing caches warm (measured once and multiplied, not run). Peak memory is the process's maximum resident size.

    python bench/bootstrap.py [--records 30000] [--resamples 1000]
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result  # noqa: E402
from scoring import synthesize  # noqa: E402

from llasmol.core.tasks import get_task  # noqa: E402
from llasmol.metrics.intervals import bootstrap_intervals, paired_difference, per_sample_statistics  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()

    records = synthesize(args.records, seed=0)
    rng = random.Random(1)
    other = [dict(r, predictions=rng.choice(records)["predictions"]) if rng.random() < 0.1 else r for r in records]

    start = time.perf_counter()
    samples = per_sample_statistics(records)
    scoring = time.perf_counter() - start
    # A resample re-scored: the same records again, with the parsing caches now warm (the cheapest a
    # bootstrap that re-scores could be).
    start = time.perf_counter()
    per_sample_statistics(records)
    rescoring = time.perf_counter() - start

    start = time.perf_counter()
    intervals = bootstrap_intervals(samples, args.resamples, seed=0)
    bootstrap = time.perf_counter() - start

    headline = {task: get_task(task).headline for task in samples}
    start = time.perf_counter()
    paired = paired_difference(records, other, headline, args.resamples, seed=0)
    pairing = time.perf_counter() - start  # includes scoring both runs' records once

    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    naive = rescoring * args.resamples
    widths = {task: values[headline[task]][1] - values[headline[task]][0]
              for task, values in intervals.items() if values.get(headline[task])}
    result = {
        "command": f"python bench/bootstrap.py --records {args.records} --resamples {args.resamples}",
        "records": args.records, "tasks": len(samples), "resamples": args.resamples,
        "units": {task: int(s.n_units) for task, s in samples.items()},
        "scoring_once_s": round(scoring, 2),
        "rescoring_warm_s": round(rescoring, 2),
        "bootstrap_s": round(bootstrap, 2),
        "paired_s": round(pairing, 2),
        "naive_bootstrap_estimate_s": round(naive, 1),
        "speedup_vs_naive": round(naive / bootstrap, 1),
        "peak_rss_mib": round(peak_mib, 1),
        "headline_interval_widths": {t: round(w, 4) for t, w in widths.items()},
        "paired_excludes_zero": {t: d["excludes_zero"] for t, d in paired.items()},
    }
    for key in ("scoring_once_s", "rescoring_warm_s", "bootstrap_s", "paired_s", "naive_bootstrap_estimate_s", "speedup_vs_naive",
                "peak_rss_mib"):
        print(f"{key}: {result[key]}")
    write_result("bootstrap", result)


if __name__ == "__main__":
    main()
