"""One baseline over one split, written as an evaluated run: ``predictions/<split>.jsonl`` (the records every
predictions file has, `llasmol.inference.predictions.make_record`), ``metrics/<split>.json`` (scored as
`evaluate` scores a model: the method is one more answerer of `llasmol.inference.pipeline`) and ``baseline.json`` (the method, its settings, the tasks it
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
from llasmol.data.source import SMolInstructSource
from llasmol.inference.beam_search import task_settings
from llasmol.inference.pipeline import Evaluation, RunFiles, Samples
from llasmol.inference.progress import generation_progress
from llasmol.inference.predictions import make_record
from llasmol.metrics.extract import wrap_answer

log = logging.getLogger(__name__)


def choose_tasks(method: Baseline, source: SMolInstructSource, named: bool) -> tuple[list[str], dict[str, str]]:
    """(tasks to answer, {task skipped: why}). A task the user named in data.tasks that the method cannot
    answer is an error; of the tasks a copy has (data.tasks null) those are skipped, each said in the log."""
    answered, skipped = [], {}
    for task in source.task_names():
        why = method.why_not(source.table.task(task))
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


class MethodAnswers:
    """A baseline's answers (`llasmol.inference.pipeline.Answerer`), task by task: each task's model is fitted
    on the training split's samples of that task (`train`; None for a method that needs no training), asked
    for the task's top-k (`gen_cfg`), and dropped once it has answered, so memory holds one task's training
    data. `seconds` and `train_sizes` take the time spent and the training samples of each task."""

    def __init__(self, method: Baseline, tasks: list[str], train, gen_cfg) -> None:
        self.method, self.tasks, self.train, self.gen_cfg = method, tasks, train, gen_cfg
        self.seconds = {"train": 0.0, "answer": 0.0} if train is not None else {"answer": 0.0}
        self.train_sizes: dict[str, int] = {}

    def answer(self, samples: Samples, advance=None) -> list[dict]:
        method, records = self.method, []
        split = {i: samples.split[i] for i in samples.indices}
        for task in self.tasks:
            if self.train is not None:
                tick = time.perf_counter()
                examples = _examples(self.train, task)
                self.train_sizes[task] = len(examples)
                method.fit(task, examples)
                del examples
                self.seconds["train"] += time.perf_counter() - tick
            tick = time.perf_counter()
            rows = [i for i, s in split.items() if s["task"] == task]
            test = Examples([split[i]["raw_input"] for i in rows], [], [split[i]["target"] for i in rows])
            answers = method.predict(task, test, task_settings(self.gen_cfg, task, method.tasks).num_return_sequences)
            for i, core in zip(rows, answers):
                # No answer is an empty response, as a model that said nothing: scored as no answer.
                records.append(make_record(i, split[i], samples.golds, [wrap_answer(task, a, method.tasks) for a in core] or [""]))
            method.forget(task)
            self.seconds["answer"] += time.perf_counter() - tick
            if advance is not None:
                advance(len(rows))
            log.info("method=%s answered %d samples of %s", method.name, len(rows), task)
        return records


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
    answerer = MethodAnswers(method, tasks, source.split("train") if method.needs_training else None, gen_cfg)
    samples = Samples.of(source, split_name)
    try:  # a bar on a terminal; off one, the line per task answered (MethodAnswers) tells the progress
        with generation_progress(f"method={method.name} on {split_name}", len(samples.indices)) as advance:
            records = answerer.answer(samples, advance)
    finally:  # the splits' raw files (read while answering) are not needed again
        source.close()

    tick = time.perf_counter()
    outcome = Evaluation(RunFiles.named(out_dir, split_name, metrics_path), intervals_cfg,
                         tasks=source.table).finish(records)
    seconds = answerer.seconds
    seconds["score"] = time.perf_counter() - tick
    seconds["total"] = time.perf_counter() - started
    write_json(out_dir / run_dir.BASELINE, {
        "method": method.name, "split": split_name, "data": source.root(), "tasks": tasks, "skipped": skipped,
        "train_samples": answerer.train_sizes, "test_samples": samples.split.counts(), "settings": method.settings,
        "seed": method.seed, "n_jobs": method.n_jobs, "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "peak_rss_mib": round(_peak_rss_mib(), 1),
    })
    return outcome.metrics, outcome.intervals, outcome.files.metrics
