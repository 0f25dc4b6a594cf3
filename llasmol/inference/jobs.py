"""`evaluate`'s two jobs, as one function each: score a predictions file (`score_file`), or answer a split
with a model and score the answers (`generate_and_score`: the checkpoint, the base-model protocol, a stopped
run's partial file continued, Ctrl-C and SIGTERM kept as a "continue with" line). The command
(`llasmol.evaluate`) checks its settings and calls one of them; both go through the evaluation pipeline.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from llasmol.core import run_dir
from llasmol.core.errors import Stopped, UserError
from llasmol.core.files import write_json
from llasmol.core.run_lock import OWN_FOLDER, hold_run_lock
from llasmol.core.tasks import TaskTable
from llasmol.data.formatting import PromptFormatter
from llasmol.data.source import SMolInstructSource
from llasmol.inference.prompting import Protocol, build_queries, protocol_for, read_answers
from llasmol.inference.beam_search import BeamGenerator
from llasmol.inference.loading import load_model, pick_device, resolve_checkpoint
from llasmol.inference.partial import PartialPredictions
from llasmol.inference.pipeline import Evaluation, ModelAnswers, RunFiles, Samples, split_golds
from llasmol.inference.predictions import make_record, predictions_tasks, read_predictions
from llasmol.inference.progress import generation_progress

log = logging.getLogger(__name__)


def score_file(cfg: DictConfig, tasks: TaskTable) -> tuple[dict, Optional[dict], Path, TaskTable]:
    """Score the predictions file `cfg.predictions` (`tasks`: the command's table; a run's predictions add the
    run's own tasks): (metrics, intervals or None, metrics file, the table they were scored by)."""
    tasks = predictions_tasks(cfg.predictions, tasks)
    records = read_predictions(cfg.predictions, tasks=tasks)
    if cfg.pool_golds == "split":
        records = with_split_golds(records, cfg, tasks)
    src = Path(cfg.predictions)
    if cfg.get("name"):  # another system's answers, kept as a row that report and the notebooks read
        return (*_system_row(cfg, records, src, tasks), tasks)
    named = src.resolve() if src.name in ("", "..") else src  # predictions=. names the folder it is
    out = Path(cfg.output) if cfg.output else named.with_name(named.stem + ".metrics.json")
    files = RunFiles(None, out).check_writable()  # the predictions file itself stays as it is
    outcome = Evaluation(files, cfg.intervals, tasks=tasks).finish(records)
    return outcome.metrics, outcome.intervals, out, tasks


def with_split_golds(records: list[dict], cfg: DictConfig, tasks: TaskTable) -> list[dict]:
    """`records` with the golds of every sample of `data.split` that shares an input, for the tasks whose golds
    pool: what the official compute_metrics.py `read_result` reads from the dataset (lines 12-25, 38-43),
    so a file with part of a split gets the golds the whole split gives each of its inputs."""
    source = SMolInstructSource.from_config(OmegaConf.to_container(cfg.data, resolve=True), table=tasks)
    pool = split_golds(source.pooling_split(cfg.data.split))
    for record in records:
        if tasks.task(record["task"]).pooled:
            golds = pool.golds(record, None)
            if not golds:  # the official scorer stops here too (a KeyError)
                core = record.get("raw_input", record["input"])
                raise UserError(f"{record['task']} input {core[:80]!r} of the predictions is not in data.split="
                                f"{cfg.data.split} of {source.root()}: pass the data the predictions were made on "
                                "(data.path=<SMolInstruct copy>), or pool_golds=file")
            record["gold"] = golds + [g for g in record["gold"] if g not in golds]
    return records


def _system_row(cfg: DictConfig, records: list[dict], src: Path, tasks: TaskTable) -> tuple[dict, Optional[dict], Path]:
    folder, split = Path(cfg.paths.output_dir), cfg.data.split
    hold_run_lock(folder, "evaluate")
    outcome = Evaluation(RunFiles.named(folder, split, cfg.output).check_writable(), cfg.intervals,
                         tasks=tasks).finish(records)
    write_json(folder / run_dir.SYSTEM, {"name": str(cfg.name), "predictions": str(src.resolve()), "split": split,
                                         "samples": len(records)})
    return outcome.metrics, outcome.intervals, outcome.files.metrics


class _Terminated(BaseException):
    """SIGTERM, raised wherever the handler finds the main thread: a BaseException, as KeyboardInterrupt is, since
    the scorer's and parsers' `except Exception` (model output never raises) would otherwise swallow it there."""


@contextmanager
def stoppable() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise here, whatever the shell set (a background job starts with SIGINT ignored)."""
    def terminate(signum, frame):
        raise _Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def continue_command(out_dir: Path, cfg: DictConfig) -> str:
    """This command again; with `hydra.run.dir` added when its answers went to this command's own dated folder."""
    args = sys.argv[1:]
    if out_dir.resolve() == Path(cfg.paths.output_dir).resolve() and not any(
            a.startswith(("hydra.run.dir=", "+hydra.run.dir=")) for a in args):
        args = [*args, f"hydra.run.dir={out_dir}"]
    return shlex.join(["python", "-m", "llasmol.evaluate", *args])


@dataclass(frozen=True)
class ModelEvaluation:
    """What `generate_and_score` gives back: the metrics, the intervals (None when not asked for), the metrics
    file, and, for a base model's protocol whose answers went to the command's own folder, what labels that
    folder's row (`protocol`, the model's settings, the folder; `protocol` None otherwise)."""

    metrics: dict
    intervals: Optional[dict]
    metrics_file: Path
    samples: int
    tasks: TaskTable  # the table the answers were scored by: a run's own tasks beside SMolInstruct's
    protocol: Optional[Protocol] = None
    model_cfg: Optional[DictConfig] = None
    folder: Optional[Path] = None


@dataclass(frozen=True)
class EvaluationPlan:
    """What an evaluation will answer, where, under which identity: decided (and refused where it cannot work)
    before the lock, the folder and the model, so that a command that cannot run leaves nothing behind."""

    device: str
    model_cfg: DictConfig
    adapter: Optional[Path]
    tasks: TaskTable  # the command's, with a run directory's own tasks
    protocol: Optional[Protocol]
    source: SMolInstructSource
    samples: Samples
    out_dir: Path
    into_run: bool  # the run's whole split, answered into the run's folder
    identity: dict  # what the answers depend on: a stopped evaluation is continued only under the same


def plan_evaluation(cfg: DictConfig, tasks: TaskTable) -> EvaluationPlan:
    """`cfg.ckpt` on `cfg.data.split`: the model, the samples and the folder, checked; nothing written yet."""
    device = pick_device(cfg.device)  # before the data and the base: a device this machine lacks is one line at once
    model_cfg, adapter, run_data = resolve_checkpoint(cfg.ckpt, cfg)
    if run_data is not None:
        tasks = run_dir.read_tasks(Path(cfg.ckpt), tasks)
    protocol = protocol_for(cfg.get("prompting") or {}, bare=adapter is None)
    data_cfg = run_data if run_data is not None else cfg.data
    if protocol is not None and data_cfg.get("representation") == "selfies":
        raise UserError(f"prompting.style={protocol.style} writes the paper's SMILES queries, but the data are "
                        "SELFIES (data.representation=selfies): use prompting=dataset or SMILES data")
    # A run directory brings the data it was trained on; this command's split, sample cap and tasks apply.
    split_name, asked = cfg.data.split, OmegaConf.to_container(cfg.data, resolve=True)
    caps, chosen = asked.get("max_samples_per_task"), asked.get("tasks")
    data = {**OmegaConf.to_container(data_cfg, resolve=True), **({"tasks": chosen} if chosen else {})}
    source = SMolInstructSource.from_config(data, max_samples_per_task=caps, table=tasks)
    samples = Samples.of(source, split_name, None, cfg.seed)
    if not samples.indices:
        raise UserError(f"data.split={split_name} holds no sample of {', '.join(source.task_names())} in "
                        f"{', '.join(source.places())}: evaluate another split, or give the table rows of this one")
    # A run evaluated on a whole split keeps the results with the run (report shows them beside the paper); a
    # capped split, some of its tasks or another checkpoint writes to this command's folder.
    into_run = run_data is not None and not (source.max_samples_per_task.get(split_name) or chosen)
    settings = {key: OmegaConf.to_container(cfg[key], resolve=True) if cfg.get(key) else None
                for key in ("generation", "prompting", "quantization")}
    identity = {"ckpt": str(cfg.ckpt), "adapter": None if adapter is None else str(adapter), "model": model_cfg.name,
                "prompt_template": model_cfg.prompt_template, "split": split_name, "samples": len(samples.indices),
                "max_samples_per_task": caps, **settings, "merge_adapter": cfg.merge_adapter}
    if protocol is None:
        identity["prompting"] = None
    return EvaluationPlan(device, model_cfg, adapter, tasks, protocol, source, samples,
                          Path(cfg.ckpt) if into_run else Path(cfg.paths.output_dir), into_run, identity)


def generate_and_score(cfg: DictConfig, tasks: TaskTable,
                       log_into: Optional[Callable[[Path], None]] = None) -> ModelEvaluation:
    """Generate with `cfg.ckpt` on `cfg.data.split` (continuing a stopped run's partial file) and score;
    `tasks`: the command's task table (a run directory's adds its own tasks.json); `log_into(folder)` is called
    with the run directory when the answers go there (the command logs there too)."""
    plan = plan_evaluation(cfg, tasks)
    split_name, out_dir, protocol = cfg.data.split, plan.out_dir, plan.protocol
    # A second evaluation (or a training) into this folder: one line. Into a run's folder another hydra.run.dir
    # would not help: the run's whole split is answered there whichever folder the command logs in.
    hold_run_lock(out_dir, "evaluate", OWN_FOLDER if not plan.into_run else
                  "answer a part of it meanwhile (data.tasks=[...] or data.max_samples_per_task), which goes into "
                  "this command's own folder: a run's whole split is answered into the run's folder")
    files = RunFiles.named(out_dir, split_name, cfg.output).check_writable()
    if log_into is not None and out_dir.resolve() != Path(cfg.paths.output_dir).resolve():
        log_into(out_dir)
        log.info("answers of %s on the %s split go into %s (this command's own folder: %s)",
                 "the bare base" if plan.adapter is None else plan.adapter, split_name, out_dir, cfg.paths.output_dir)
    # The model before the partial file: an adapter or base that cannot load leaves no file behind (nor a folder)
    model, tokenizer = load_model(plan.model_cfg, plan.adapter, cfg.get("quantization"), merge=cfg.merge_adapter)
    model.to(plan.device)
    partial = PartialPredictions(files.predictions, plan.identity)
    records, queries = _answer(plan, cfg, model, tokenizer, partial)
    if protocol is not None:
        records = read_answers(protocol, records, queries)
    outcome = Evaluation(files, cfg.intervals, tasks=plan.tasks).finish(records)
    partial.remove()
    labelled = protocol is not None and out_dir == Path(cfg.paths.output_dir)
    return ModelEvaluation(outcome.metrics, outcome.intervals, files.metrics, len(records), plan.tasks,
                           protocol if labelled else None, plan.model_cfg, out_dir)


def _answer(plan: EvaluationPlan, cfg: DictConfig, model, tokenizer, partial: PartialPredictions):
    """Every sample of `plan` answered (those the partial file holds taken from it), each appended as it comes; a
    stop (Ctrl-C, SIGTERM) says how to continue. Returns the records and a protocol's queries."""
    indices, split = plan.samples.indices, plan.samples.split
    done = {i: make_record(i, split[i], plan.samples.golds, responses)
            for i, responses in partial.resume(set(indices)).items()}
    if done:
        log.info("continuing the stopped evaluation in %s: %d of %d samples answered", partial.path, len(done),
                 len(indices))
    # A base model's protocol writes the whole query itself: no chat markup around it.
    formatter = PromptFormatter(tokenizer, "plain" if plan.protocol else plan.model_cfg.prompt_template)
    generator = BeamGenerator(model, tokenizer, formatter, cfg.generation.max_prompt_tokens, cfg.generation.batch_size)
    queries = None
    if plan.protocol is not None:
        generator.strip = False  # the rules read the text as generated
        shots = plan.source.split("train") if plan.protocol.shots else None
        queries = build_queries(plan.protocol, split, indices, shots)
    answers = ModelAnswers(generator, cfg.generation, queries, done, partial.append, plan.tasks)
    try:
        with stoppable(), generation_progress(f"Generating on {cfg.data.split}", len(indices), done=len(done),
                                               log_every_s=cfg.progress_every_s) as advance:
            records = answers.answer(plan.samples, advance)
    except (KeyboardInterrupt, _Terminated) as err:
        term = isinstance(err, _Terminated)
        raise Stopped(f"stopped ({'SIGTERM' if term else 'Ctrl-C'}) with {partial.answered()} of {len(indices)} "
                      f"samples answered, kept in {partial.path}; continue with: {continue_command(plan.out_dir, cfg)}",
                      143 if term else 1) from None
    partial.close()
    return records, queries
