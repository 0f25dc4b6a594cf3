"""Write an analysis report of a run (or a multirun) into its `report/` folder.

    python -m llasmol.report <run_dir>        # metrics, failures, trends, top-k, worst examples
    python -m llasmol.report <baseline dir>   # the same for a baseline's split (python -m llasmol.baseline)
    python -m llasmol.report <multirun_dir>   # the variants beside the paper + the ablation chart
    python -m llasmol.report <run A> <run B>  # A - B per task, with paired bootstrap intervals
    python -m llasmol.report <run_dir> --validation val-step200 --worst 8

A run's report (of its latest validation unless ``--validation`` picks one):
``<split>.md``/``.csv`` for each evaluated whole split (beside the paper's numbers for its base, with a line
saying why any paper cell is empty),
``metrics.md``/``.csv`` (per task; for the tiny demo model, with why its exact matches are 0),
``trivial.md``/``.csv`` (the best constant answer on the same samples), ``intervals.md``/``.csv`` (each
metric's 95% bootstrap interval),
``topk.csv``, ``failures.md``/``.csv``, ``worst.md``, ``trends.csv``, ``topk.png``, ``failures.png``,
``trends.png`` and ``worst_<task>.png`` for SMILES tasks with gold molecules.  A multirun's:
``comparison.md``/``.csv``, ``ablation.png`` (with intervals) and ``pairs.md``/``.csv`` (every pair of
variants). Two runs: ``pairs.md``/``.csv`` in ``<run A>/report/vs_<run B>/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence

from llasmol.analysis.report_folder import report_paths
from llasmol.core.errors import report_user_errors
from llasmol.core.files import WRITE_ELSEWHERE, raise_if_unwritable


def main(argv: Optional[Sequence[str]] = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m llasmol.report", description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="+", help="a run directory or a multirun directory; or two run "
                        "directories to compare")
    parser.add_argument("--validation", help="a run's validation to report, e.g. val-step200, or an evaluated "
                        "split, e.g. test (default: the latest validation; a baseline: its test split)")
    parser.add_argument("--worst", type=int, default=5, help="worst examples per task (default 5)")
    parser.add_argument("--all-metrics", action="store_true", help="every metric of every task in metrics.md "
                        "(default: each task's headline metric; metrics.csv always has them all)")
    parser.add_argument("--out", help="folder to write into (default: <path>/report)")
    args = parser.parse_args(argv)
    return _run(args)


@report_user_errors
def _run(args) -> list[Path]:
    token = WRITE_ELSEWHERE.set("write the report elsewhere with --out <folder>")
    try:
        written = report_paths(args.path, args.out, args.validation, args.worst, args.all_metrics)
    except OSError as err:  # a chart's file on a full disk or in a read-only folder: one line naming it
        raise_if_unwritable(err, Path(err.filename or args.out or args.path[0]))
        raise
    finally:
        WRITE_ELSEWHERE.reset(token)
    for file in written:
        print(f"wrote {file}")
    return written


if __name__ == "__main__":
    main()
