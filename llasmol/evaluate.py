"""`python -m llasmol.evaluate`: the paper's metrics for a predictions file or a trained model.

    python -m llasmol.evaluate predictions=<file.jsonl>                     # no model needed
    python -m llasmol.evaluate predictions=<folder of .jsonl>               # e.g. LLM4Chem's eval output
    python -m llasmol.evaluate predictions=<file or folder> name=gpt-4      # kept as a report row
    python -m llasmol.evaluate ckpt=<run dir | adapter dir> data.split=test  # generate, then score
    python -m llasmol.evaluate ckpt=none model=mistral                      # the bare base, 1-shot as the paper
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

from omegaconf import DictConfig

from llasmol.core import run_dir
from llasmol.core.errors import Stopped, UserError
from llasmol.core.files import check_target, write_json
from llasmol.core.log_files import log_also_to
from llasmol.frame import command, start

log = logging.getLogger(__name__)


def _protocol_row(cfg: DictConfig, model_cfg: DictConfig, protocol, folder: Path, split: str, samples: int) -> None:
    """Label the folder's row with its protocol (``Mistral (1-shot)``), as report and the notebooks show it."""
    from llasmol.analysis.paper import protocol_row  # lazy: the analysis package brings matplotlib (0.6 s)

    name, paper_row = protocol_row(str(model_cfg.name), cfg.ckpt and str(cfg.ckpt), protocol.style, protocol.shots)
    write_json(folder / run_dir.SYSTEM, {"name": f"{name} ({protocol.setting})", "protocol": asdict(protocol),
                                         "paper_row": paper_row, "model": str(model_cfg.name),
                                         "ckpt": str(cfg.ckpt), "split": split, "samples": samples})


def evaluate(cfg: DictConfig, log_into: Optional[Callable[[Path], None]] = None) -> dict:
    """Score `cfg.predictions`, or generate with `cfg.ckpt` on `cfg.data.split` and score that (`log_into`: told
    the run directory the answers go into, when they go into one)."""
    tasks = start(cfg).tasks
    if cfg.output and Path(cfg.output).is_dir():
        raise UserError(f"output={cfg.output} is a directory: name the metrics file, e.g. "
                        f"output={Path(cfg.output) / 'metrics.json'}")
    if cfg.output:
        check_target(cfg.output, "output")  # before any work: a FIFO or device is not replaced at the end
    # lazy: the jobs bring torch (1.5 s), which the command's checks before Hydra do not need
    from llasmol.inference import jobs

    if cfg.predictions:
        results, intervals, out, tasks = jobs.score_file(cfg, tasks)
    else:
        run = jobs.generate_and_score(cfg, tasks, log_into)
        if run.protocol is not None:
            _protocol_row(cfg, run.model_cfg, run.protocol, run.folder, cfg.data.split, run.samples)
        results, intervals, out, tasks = run.metrics, run.intervals, run.metrics_file, run.tasks
    return {"metrics": results, "intervals": intervals, "output": str(out), "tasks": tasks}


@command("evaluate", run_folder=True)
def main(cfg: DictConfig) -> None:
    try:  # answers written into a run directory: the log goes there too, to the end (an error line included)
        result = evaluate(cfg, lambda folder: log_also_to(folder / run_dir.EVALUATE_LOG, "llasmol.evaluate"))
    except Stopped as stop:  # one line, as training's, instead of a traceback from deep inside generate
        log.warning("%s", stop)
        raise SystemExit(stop.code) from None
    except KeyboardInterrupt:
        log.warning("stopped (Ctrl-C) before the first answer: nothing was kept")
        raise SystemExit(1) from None
    from llasmol.analysis.tables import metric_lines  # lazy: matplotlib (0.6 s), for the closing lines only

    print(metric_lines(result["metrics"], result["intervals"], cfg.all_metrics, result["tasks"]))
    if result["intervals"]:
        print(f"[lo, hi]: {result['intervals']['level']:.0%} bootstrap intervals (tasks with pooled golds resample "
              "inputs), written beside the metrics")
    print(f"metrics written to {result['output']}", flush=True)


if __name__ == "__main__":
    main.from_command_line()
