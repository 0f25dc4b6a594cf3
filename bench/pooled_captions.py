"""Benchmark 17: scoring captions that pool their golds grows linearly with the lines of one input (issue #39).

Molecule captioning pools golds over the records that share an input (the official scorer's reading), so a
file of N lines of one molecule gives each of its N answers N golds: a quadratic count of (answer, gold)
pairs if each pair were scored on its own. Timed: `evaluate predictions=<file>` in process (reading, pooling,
the text metrics, the files written) on files of N, 2N and 4N such lines, each answer and gold a distinct
caption. The ratio that matters is the time per line at 4N over that at N (1.0: linear).

    python bench/pooled_captions.py [--lines 1500]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import compose_config, write_result  # noqa: E402

WORDS = ("molecule", "acid", "ester", "ring", "group", "natural", "product", "metabolite", "derived", "agent")


def caption(k: int) -> str:
    """A distinct caption of ~30 words: k written out in the words above."""
    digits = [WORDS[int(d)] for d in str(k).zfill(6)]
    return "The molecule is a " + " ".join(digits * 4) + " found in plants."


def timed(lines: int, folder: Path) -> float:
    from llasmol.evaluate import evaluate

    path = folder / f"captions-{lines}.jsonl"
    with path.open("w") as fh:
        for k in range(lines):
            fh.write(json.dumps({"task": "molecule_captioning", "input": "CCO", "gold": caption(k),
                                 "predictions": [caption(k + 1)]}) + "\n")
    cfg = compose_config([f"predictions={path}", f"paths.output_dir={folder / 'run'}", "intervals.resamples=0"], "evaluate")
    started = time.perf_counter()
    evaluate(cfg)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1500)
    args = parser.parse_args()
    sizes = [args.lines, 2 * args.lines, 4 * args.lines]
    with tempfile.TemporaryDirectory() as tmp:
        timed(50, Path(tmp))  # imports and the metrics' first-call set-up, not timed
        seconds = {n: timed(n, Path(tmp)) for n in sizes}
    for n, s in seconds.items():
        print(f"{n:6d} lines of one input: {s:7.1f} s ({1000 * s / n:.1f} ms a line)")
    ratio = (seconds[sizes[-1]] / sizes[-1]) / (seconds[sizes[0]] / sizes[0])
    print(f"time per line at {sizes[-1]} over at {sizes[0]}: {ratio:.2f} (1.0: linear; 4.0: quadratic)")
    write_result("pooled_captions", {"lines": sizes, "seconds": [round(seconds[n], 2) for n in sizes],
                                     "per_line_ratio": round(ratio, 3)})


if __name__ == "__main__":
    main()
