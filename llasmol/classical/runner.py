"""One baseline over one split, written as an evaluated run: ``predictions/<split>.jsonl`` (the records every
predictions file has, `llasmol.inference.records.make_record`), ``metrics/<split>.json`` (scored as
`evaluate` scores a model, `write_and_score`) and ``baseline.json`` (the method, its settings, the tasks it
answered and skipped, its time and peak memory), which `llasmol.analysis` reads as the row ``baseline:<name>``.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import sys
import time
from pathlib import Path
from typing import Optional

from llasmol.classical.common import Baseline, Examples
from llasmol.core import run_dir
from llasmol.core.errors import UserError
from llasmol.core.files import write_json
from llasmol.core.tasks import get_task
from llasmol.data.source import SMolInstructSource
from llasmol.inference.beam_search import task_settings
from llasmol.inference.records import make_record, split_golds, write_and_score
from llasmol.metrics.extract import wrap_answer

log = logging.getLogger(__name__)


def choose_tasks(method: Baseline, source: SMolInstructSource, named: bool) -> tuple[list[str], dict[str, str]]:
    """(tasks to answer, {task skipped: why}). A task the user named in data.tasks that the method cannot
    answer is an error; of the tasks a copy has (data.tasks null) those are skipped, each said in the log."""
    answered, skipped = [], {}
    for task in source.task_names():
        why = method.why_not(get_task(task))
        if why is None:
            answered.append(task)
        elif named:
            raise UserError(f"method={method.name} cannot answer {task} ({why}): it answers "
                            f"{', '.join(method.answerable())}; drop {task} from data.tasks")
        else:
            skipped[task] = why
    for why in dict.fromkeys(skipped.values()):  # one line per reason, not per task
        log.info("method=%s skips %s: %s", method.name, ", ".join(t for t, w in skipped.items() if w == why), why)
    if not answered:
        raise UserError(f"method={method.name} answers none of the tasks in {source.root()}: it answers "
                        + ", ".join(method.answerable()))
    return answered, skipped


def _peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def _examples(split, task: str) -> Examples:
    examples = Examples()
    for core_in, core_out, target in split.core_samples(task):
        examples.add(core_in, core_out, target)
    return examples


def run_baseline(method: Baseline, source: SMolInstructSource, split_name: str, gen_cfg, out_dir: Path,
                 metrics_path: Optional[Path] = None, named_tasks: bool = False,
                 intervals_cfg=None) -> tuple[dict, Optional[dict], Path]:
    """Answer split `split_name` of `source` with `method`, write the predictions, metrics (with their
    bootstrap intervals, as evaluate writes them) and baseline.json into `out_dir`; returns (metrics,
    intervals or None, metrics file). `gen_cfg` (the generation group) says how many answers each task
    scores; `intervals_cfg` the intervals group (None: no intervals); `named_tasks`: the user listed
    data.tasks."""
    import torch

    torch.set_num_threads(method.n_jobs)  # scoring and the similarity search: bounded like the rest
    if source.representation != "smiles":
        raise UserError(f"baselines read and write SMILES: data.representation={source.representation} is not "
                        "supported; leave it at smiles")
    started = time.perf_counter()
    tasks, skipped = choose_tasks(method, source, named_tasks)
    source = dataclasses.replace(source, path=source.root(), tasks=tasks)
    seconds = {"train": 0.0, "answer": 0.0} if method.needs_training else {"answer": 0.0}
    train_sizes: dict[str, int] = {}
    train = source.split("train") if method.needs_training else None
    split = source.split(split_name)
    samples = [split[i] for i in range(len(split))]
    golds = split_golds(source.pooling_split(split_name))
    records = []
    # Task by task, and each task's model dropped once it has answered: memory holds one task's training data.
    for task in tasks:
        if train is not None:
            tick = time.perf_counter()
            examples = _examples(train, task)
            train_sizes[task] = len(examples)
            method.fit(task, examples)
            del examples
            seconds["train"] += time.perf_counter() - tick
        tick = time.perf_counter()
        rows = [i for i, s in enumerate(samples) if s["task"] == task]
        test = Examples([samples[i]["raw_input"] for i in rows], [], [samples[i]["target"] for i in rows])
        answers = method.predict(task, test, task_settings(gen_cfg, task).num_return_sequences)
        for i, core in zip(rows, answers):
            # No answer is an empty response, as a model that said nothing: scored as no answer.
            records.append(make_record(i, samples[i], golds, [wrap_answer(task, a) for a in core] or [""]))
        method.forget(task)
        seconds["answer"] += time.perf_counter() - tick
        log.info("method=%s answered %d samples of %s", method.name, len(rows), task)

    tick = time.perf_counter()
    metrics_path = metrics_path or out_dir / run_dir.METRICS / f"{split_name}.json"
    results, intervals = write_and_score(records, out_dir / run_dir.PREDICTIONS / f"{split_name}.jsonl", metrics_path,
                                         intervals_cfg)
    seconds["score"] = time.perf_counter() - tick
    seconds["total"] = time.perf_counter() - started
    write_json(out_dir / run_dir.BASELINE, {
        "method": method.name, "split": split_name, "data": source.root(), "tasks": tasks, "skipped": skipped,
        "train_samples": train_sizes, "test_samples": split.counts(), "settings": method.settings,
        "seed": method.seed, "n_jobs": method.n_jobs, "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "peak_rss_mib": round(_peak_rss_mib(), 1),
    })
    return results, intervals, metrics_path
