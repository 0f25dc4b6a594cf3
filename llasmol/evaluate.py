"""`python -m llasmol.evaluate`: the paper's metrics for a predictions file or a trained model.

    python -m llasmol.evaluate predictions=<file.jsonl>                     # no model needed
    python -m llasmol.evaluate predictions=<folder of .jsonl>               # e.g. LLM4Chem's eval output
    python -m llasmol.evaluate predictions=<file or folder> name=gpt-4      # kept as a report row
    python -m llasmol.evaluate ckpt=<run dir | adapter dir> data.split=test  # generate, then score
    python -m llasmol.evaluate ckpt=none model=mistral                      # the bare base, zero-shot
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from llasmol.core.config import CONFIG_DIR, check_command_line
from llasmol.core.errors import UserError, report_user_errors
from llasmol.core.quiet import quiet_known_noise
from llasmol.core.settings import check_settings

log = logging.getLogger(__name__)

def score_file(cfg: DictConfig) -> tuple[dict, Optional[dict], Path]:
    from llasmol.inference.predictions import read_predictions
    from llasmol.inference.records import score_and_write

    records = read_predictions(cfg.predictions)
    src = Path(cfg.predictions)
    if cfg.get("name"):  # another system's answers, kept as a row that report and the notebooks read
        return _system_row(cfg, records, src)
    out = Path(cfg.output) if cfg.output else src.with_name(src.stem + ".metrics.json")
    results, intervals = score_and_write(records, out, cfg.intervals)
    return results, intervals, out


def _system_row(cfg: DictConfig, records: list[dict], src: Path) -> tuple[dict, Optional[dict], Path]:
    from llasmol.core import run_dir
    from llasmol.core.files import write_json
    from llasmol.inference.records import write_and_score

    folder, split = Path(cfg.paths.output_dir), cfg.data.split
    out = Path(cfg.output) if cfg.output else folder / run_dir.METRICS / f"{split}.json"
    results, intervals = write_and_score(records, folder / run_dir.PREDICTIONS / f"{split}.jsonl", out, cfg.intervals)
    write_json(folder / run_dir.SYSTEM, {"name": str(cfg.name), "predictions": str(src.resolve()), "split": split,
                                         "samples": len(records)})
    return results, intervals, out


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
    from llasmol.core import run_dir
    from llasmol.data.formatting import PromptFormatter
    from llasmol.data.source import SMolInstructSource
    from llasmol.inference.beam_search import BeamGenerator
    from llasmol.inference.loading import load_model, pick_device, resolve_checkpoint
    from llasmol.inference.partial import PartialPredictions
    from llasmol.inference.progress import generation_progress
    from llasmol.inference.records import balanced_subset, generate_records, split_golds, write_and_score

    model_cfg, adapter, run_data = resolve_checkpoint(cfg.ckpt, cfg)
    # A run directory brings the data it was trained on; this command's split and sample cap apply.
    split_name = cfg.data.split
    caps = OmegaConf.to_container(cfg.data, resolve=True).get("max_samples_per_task")
    source = SMolInstructSource.from_config(
        OmegaConf.to_container(run_data if run_data is not None else cfg.data, resolve=True),
        max_samples_per_task=caps,
    )
    split = source.split(split_name)
    # A run evaluated on a whole split keeps the results with the run (report shows them beside the paper);
    # a capped split (data.max_samples_per_task) or another checkpoint writes to this command's folder.
    capped = bool(source.max_samples_per_task.get(split_name))
    out_dir = Path(cfg.ckpt) if run_data is not None and not capped else Path(cfg.paths.output_dir)
    predictions_file = out_dir / run_dir.PREDICTIONS / f"{split_name}.jsonl"
    indices = balanced_subset(split, None, cfg.seed)
    # What the answers depend on: a stopped run is continued only under the same.
    partial = PartialPredictions(predictions_file, {
        "ckpt": str(cfg.ckpt), "adapter": None if adapter is None else str(adapter), "model": model_cfg.name,
        "prompt_template": model_cfg.prompt_template, "split": split_name, "samples": len(indices),
        "max_samples_per_task": caps, "generation": OmegaConf.to_container(cfg.generation, resolve=True)})
    done = partial.resume()
    if done:
        log.info("continuing the stopped evaluation in %s: %d of %d samples answered", partial.path, len(done),
                 len(indices))
    model, tokenizer = load_model(model_cfg, adapter, cfg.get("quantization"))
    device = pick_device(cfg.device)
    model.to(device)
    formatter = PromptFormatter(tokenizer, model_cfg.prompt_template)
    generator = BeamGenerator(model, tokenizer, formatter, cfg.generation.max_prompt_tokens, cfg.generation.batch_size)
    golds = split_golds(source.pooling_split(split_name))
    try:
        with _stoppable(), generation_progress(f"Generating on {split_name}", len(indices), done=len(done),
                                               log_every_s=cfg.progress_every_s) as advance:
            records = generate_records(generator, split, indices, golds, cfg.generation, advance, done, partial.append)
    except (KeyboardInterrupt, _Terminated) as err:
        term = isinstance(err, _Terminated)
        raise Stopped(f"stopped ({'SIGTERM' if term else 'Ctrl-C'}) with {partial.answered()} of {len(indices)} "
                      f"samples answered, kept in {partial.path}; continue with: {_continue_command(out_dir, cfg)}",
                      143 if term else 1) from None
    partial.close()
    out = Path(cfg.output) if cfg.output else out_dir / run_dir.METRICS / f"{split_name}.json"
    results, intervals = write_and_score(records, predictions_file, out, cfg.intervals)
    partial.remove()
    return results, intervals, out


def evaluate(cfg: DictConfig) -> dict:
    """Score `cfg.predictions`, or generate with `cfg.ckpt` on `cfg.data.split` and score that."""
    quiet_known_noise()
    check_settings(cfg)
    if cfg.output and Path(cfg.output).is_dir():
        raise UserError(f"output={cfg.output} is a directory: name the metrics file, e.g. "
                        f"output={Path(cfg.output) / 'metrics.json'}")
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
    from llasmol.analysis.tables import metric_lines

    print(metric_lines(result["metrics"], result["intervals"]))
    if result["intervals"]:
        print(f"[lo, hi]: {result['intervals']['level']:.0%} bootstrap intervals (tasks with pooled golds resample "
              "inputs), written beside the metrics")
    print(f"metrics written to {result['output']}", flush=True)


if __name__ == "__main__":
    check_command_line("evaluate", run_folder=True)
    main()
