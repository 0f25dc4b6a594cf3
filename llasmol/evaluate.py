"""`python -m llasmol.evaluate`: the paper's metrics for a predictions file or a trained model.

    python -m llasmol.evaluate predictions=<file.jsonl>                     # no model needed
    python -m llasmol.evaluate predictions=<folder of .jsonl>               # e.g. LLM4Chem's eval output
    python -m llasmol.evaluate predictions=<file or folder> name=gpt-4      # kept as a report row
    python -m llasmol.evaluate ckpt=<run dir | adapter dir> data.split=test  # generate, then score
    python -m llasmol.evaluate ckpt=none model=mistral                      # the bare base, 1-shot as the paper
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Iterator, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from llasmol.core import run_dir
from llasmol.core.config import CONFIG_DIR, check_command_line
from llasmol.core.errors import UserError, report_user_errors
from llasmol.core.files import check_target, write_json
from llasmol.core.quiet import quiet_known_noise
from llasmol.core.schema import check_config
from llasmol.core.tasks import get_task
from llasmol.core.threads import use_cpu_threads
from llasmol.data.formatting import PromptFormatter
from llasmol.data.source import SMolInstructSource
from llasmol.inference.base_protocol import build_queries, protocol_for, read_answers
from llasmol.inference.loading import load_model, pick_device, resolve_checkpoint
from llasmol.inference.partial import PartialPredictions
from llasmol.inference.predictions import read_predictions
from llasmol.inference.progress import generation_progress
from llasmol.metrics.families import use_scoring

log = logging.getLogger(__name__)

def score_file(cfg: DictConfig) -> tuple[dict, Optional[dict], Path]:
    """Score the predictions file `cfg.predictions`: (metrics, intervals or None, metrics file)."""
    # lazy: the pipeline brings torch (1.5 s), which the command's checks before Hydra do not need
    from llasmol.inference.pipeline import Evaluation, RunFiles

    records = read_predictions(cfg.predictions)
    if cfg.pool_golds == "split":
        records = _with_split_golds(records, cfg)
    src = Path(cfg.predictions)
    if cfg.get("name"):  # another system's answers, kept as a row that report and the notebooks read
        return _system_row(cfg, records, src)
    out = Path(cfg.output) if cfg.output else src.with_name(src.stem + ".metrics.json")
    outcome = Evaluation(RunFiles(None, out), cfg.intervals).finish(records)  # the file itself stays as it is
    return outcome.metrics, outcome.intervals, out


def _with_split_golds(records: list[dict], cfg: DictConfig) -> list[dict]:
    """`records` with the golds of every sample of `data.split` that shares an input, for the tasks whose golds
    pool: what the official compute_metrics.py `read_result` reads from the dataset (lines 12-25, 38-43),
    so a file with part of a split gets the golds the whole split gives each of its inputs."""
    # lazy: the pipeline brings torch (1.5 s), which the command's checks before Hydra do not need
    from llasmol.inference.pipeline import split_golds

    source = SMolInstructSource.from_config(OmegaConf.to_container(cfg.data, resolve=True))
    pool = split_golds(source.pooling_split(cfg.data.split))
    for record in records:
        if get_task(record["task"]).pooled:
            golds = pool.golds(record, None)
            if not golds:  # the official scorer stops here too (a KeyError)
                core = record.get("raw_input", record["input"])
                raise UserError(f"{record['task']} input {core[:80]!r} of the predictions is not in data.split="
                                f"{cfg.data.split} of {source.root()}: pass the data the predictions were made on "
                                "(data.path=<SMolInstruct copy>), or pool_golds=file")
            record["gold"] = golds + [g for g in record["gold"] if g not in golds]
    return records


def _system_row(cfg: DictConfig, records: list[dict], src: Path) -> tuple[dict, Optional[dict], Path]:
    # lazy: the pipeline brings torch (1.5 s), which the command's checks before Hydra do not need
    from llasmol.inference.pipeline import Evaluation, RunFiles

    folder, split = Path(cfg.paths.output_dir), cfg.data.split
    outcome = Evaluation(RunFiles.named(folder, split, cfg.output), cfg.intervals).finish(records)
    write_json(folder / run_dir.SYSTEM, {"name": str(cfg.name), "predictions": str(src.resolve()), "split": split,
                                         "samples": len(records)})
    return outcome.metrics, outcome.intervals, outcome.files.metrics


class Stopped(Exception):
    """Ctrl-C or SIGTERM during generation: what was kept, how to continue, and the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _Terminated(Exception):
    pass


@contextmanager
def _stoppable() -> Iterator[None]:
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


def _continue_command(out_dir: Path, cfg: DictConfig) -> str:
    """This command again; with `hydra.run.dir` added when its answers went to this command's own dated folder."""
    args = sys.argv[1:]
    if out_dir.resolve() == Path(cfg.paths.output_dir).resolve() and not any(
            a.startswith(("hydra.run.dir=", "+hydra.run.dir=")) for a in args):
        args = [*args, f"hydra.run.dir={out_dir}"]
    return shlex.join(["python", "-m", "llasmol.evaluate", *args])


def generate_and_score(cfg: DictConfig) -> tuple[dict, Optional[dict], Path]:
    """Generate with `cfg.ckpt` on `cfg.data.split` and score: (metrics, intervals or None, metrics file)."""
    # lazy: the pipeline brings torch (1.5 s), which the command's checks before Hydra do not need
    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.inference.pipeline import Evaluation, ModelAnswers, RunFiles, Samples

    model_cfg, adapter, run_data = resolve_checkpoint(cfg.ckpt, cfg)
    protocol = protocol_for(cfg.get("prompting") or {}, bare=adapter is None)
    data_cfg = run_data if run_data is not None else cfg.data
    if protocol is not None and data_cfg.get("representation") == "selfies":
        raise UserError(f"prompting.style={protocol.style} writes the paper's SMILES queries, but the data are "
                        "SELFIES (data.representation=selfies): use prompting=dataset or SMILES data")
    # A run directory brings the data it was trained on; this command's split and sample cap apply.
    split_name = cfg.data.split
    caps = OmegaConf.to_container(cfg.data, resolve=True).get("max_samples_per_task")
    source = SMolInstructSource.from_config(
        OmegaConf.to_container(run_data if run_data is not None else cfg.data, resolve=True),
        max_samples_per_task=caps,
    )
    samples = Samples.of(source, split_name, None, cfg.seed)
    # A run evaluated on a whole split keeps the results with the run (report shows them beside the paper);
    # a capped split (data.max_samples_per_task) or another checkpoint writes to this command's folder.
    capped = bool(source.max_samples_per_task.get(split_name))
    out_dir = Path(cfg.ckpt) if run_data is not None and not capped else Path(cfg.paths.output_dir)
    files = RunFiles.named(out_dir, split_name, cfg.output)
    indices = samples.indices
    # What the answers depend on: a stopped run is continued only under the same.
    partial = PartialPredictions(files.predictions, {
        "ckpt": str(cfg.ckpt), "adapter": None if adapter is None else str(adapter), "model": model_cfg.name,
        "prompt_template": model_cfg.prompt_template, "split": split_name, "samples": len(indices),
        "max_samples_per_task": caps, "generation": OmegaConf.to_container(cfg.generation, resolve=True),
        "prompting": OmegaConf.to_container(cfg.prompting, resolve=True) if protocol is not None else None,
        "quantization": OmegaConf.to_container(cfg.quantization, resolve=True) if cfg.get("quantization") else None,
        "merge_adapter": cfg.merge_adapter})
    done = partial.resume()
    if done:
        log.info("continuing the stopped evaluation in %s: %d of %d samples answered", partial.path, len(done),
                 len(indices))
    model, tokenizer = load_model(model_cfg, adapter, cfg.get("quantization"), merge=cfg.merge_adapter)
    device = pick_device(cfg.device)
    model.to(device)
    # A base model's protocol writes the whole query itself: no chat markup around it.
    formatter = PromptFormatter(tokenizer, "plain" if protocol else model_cfg.prompt_template)
    generator = BeamGenerator(model, tokenizer, formatter, cfg.generation.max_prompt_tokens, cfg.generation.batch_size)
    queries = None
    if protocol is not None:
        generator.strip = False  # the rules read the text as generated
        queries = build_queries(protocol, samples.split, indices, source.split("train") if protocol.shots else None)
    answers = ModelAnswers(generator, cfg.generation, queries, done, partial.append)
    try:
        with _stoppable(), generation_progress(f"Generating on {split_name}", len(indices), done=len(done),
                                               log_every_s=cfg.progress_every_s) as advance:
            records = answers.answer(samples, advance)
    except (KeyboardInterrupt, _Terminated) as err:
        term = isinstance(err, _Terminated)
        raise Stopped(f"stopped ({'SIGTERM' if term else 'Ctrl-C'}) with {partial.answered()} of {len(indices)} "
                      f"samples answered, kept in {partial.path}; continue with: {_continue_command(out_dir, cfg)}",
                      143 if term else 1) from None
    partial.close()
    if protocol is not None:
        records = read_answers(protocol, records, queries)
    outcome = Evaluation(files, cfg.intervals).finish(records)
    partial.remove()
    if protocol is not None and out_dir == Path(cfg.paths.output_dir):
        _protocol_row(cfg, model_cfg, protocol, out_dir, split_name, len(records))
    return outcome.metrics, outcome.intervals, files.metrics


def _protocol_row(cfg: DictConfig, model_cfg: DictConfig, protocol, folder: Path, split: str, samples: int) -> None:
    """Label the folder's row with its protocol (``Mistral (1-shot)``), as report and the notebooks show it."""
    # lazy: the analysis package brings matplotlib (0.6 s), needed only for a base model's protocol row
    from llasmol.analysis.paper import PAPER_SOURCES

    if protocol.style == "molinst":
        name = "Molinst"
    else:  # the paper's name of the base where it has a base row ("Code Llama"), else the model's name
        name = next((n for n, s in PAPER_SOURCES.items() if s.kind == "base LLM" and s.base == model_cfg.name),
                    str(model_cfg.name))
        if cfg.ckpt and str(cfg.ckpt).lower() != "none":
            name = f"{name} + {Path(str(cfg.ckpt)).name}"
    source = PAPER_SOURCES.get(name)
    # Beside the paper's row only when asked as the paper asked it (Mistral 3-shot has no paper row).
    paper_row = name if source is not None and source.protocol == (protocol.style, protocol.shots) else None
    write_json(folder / run_dir.SYSTEM, {"name": f"{name} ({protocol.setting})", "protocol": asdict(protocol),
                                         "paper_row": paper_row, "model": str(model_cfg.name),
                                         "ckpt": str(cfg.ckpt), "split": split, "samples": samples})


def evaluate(cfg: DictConfig) -> dict:
    """Score `cfg.predictions`, or generate with `cfg.ckpt` on `cfg.data.split` and score that."""
    quiet_known_noise()
    check_config(cfg)
    use_cpu_threads(cfg.get("cpu"))  # before torch loads: OpenMP reads its wait policy once
    use_scoring(cfg.get("scoring"))
    if cfg.output and Path(cfg.output).is_dir():
        raise UserError(f"output={cfg.output} is a directory: name the metrics file, e.g. "
                        f"output={Path(cfg.output) / 'metrics.json'}")
    if cfg.output:
        check_target(cfg.output, "output")  # before any work: a FIFO or device is not replaced at the end
    if cfg.predictions:
        results, intervals, out = score_file(cfg)
    elif cfg.ckpt:
        results, intervals, out = generate_and_score(cfg)
    else:
        raise UserError("nothing to evaluate: pass predictions=<file.jsonl>, ckpt=<run dir | adapter dir> or "
                        "ckpt=none (the bare base model)")
    return {"metrics": results, "intervals": intervals, "output": str(out)}


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="evaluate")
@report_user_errors
def main(cfg: DictConfig) -> None:
    try:
        result = evaluate(cfg)
    except Stopped as stop:  # one line, as training's, instead of a traceback from deep inside generate
        log.warning("%s", stop)
        raise SystemExit(stop.code) from None
    except KeyboardInterrupt:
        log.warning("stopped (Ctrl-C) before the first answer: nothing was kept")
        raise SystemExit(1) from None
    from llasmol.analysis.tables import metric_lines  # lazy: matplotlib (0.6 s), for the closing lines only

    print(metric_lines(result["metrics"], result["intervals"], cfg.all_metrics))
    if result["intervals"]:
        print(f"[lo, hi]: {result['intervals']['level']:.0%} bootstrap intervals (tasks with pooled golds resample "
              "inputs), written beside the metrics")
    print(f"metrics written to {result['output']}", flush=True)


if __name__ == "__main__":
    check_command_line("evaluate", run_folder=True)
    main()
