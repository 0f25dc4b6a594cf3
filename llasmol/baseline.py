"""`python -m llasmol.baseline method=<name>`: a non-LLM method answers a split, scored as a model is.

    python -m llasmol.baseline method=rdkit                                  # the bundled sample's test split
    python -m llasmol.baseline method=nearest_neighbor data=smolinstruct data.split=test
    python -m llasmol.baseline --multirun method=rdkit,opsin,fingerprint,nearest_neighbor

Methods (`llasmol.classical.METHODS`): rdkit, opsin, fingerprint, nearest_neighbor. The folder
(outputs/baseline/<date>_<time>/) holds predictions/<split>.jsonl, metrics/<split>.json and baseline.json;
`python -m llasmol.report <folder>` reads it as a run named baseline:<method>.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from llasmol.classical import get_method
from llasmol.core.files import check_target
from llasmol.core.schema import check_config
from llasmol.core.tasks import TaskTable
from llasmol.data.source import SMolInstructSource
from llasmol.frame import command, start


def make_method(cfg: DictConfig, tasks: Optional[TaskTable] = None):
    """The method `cfg.method` with its settings, every setting checked (one `UserError` for a bad one: an
    unknown method, or a setting outside its schema, `llasmol.core.schema.BaselineSchema`); `tasks`: the
    table of the checked config, when the caller has it."""
    cls = get_method(cfg.method)
    tasks = tasks if tasks is not None else check_config(cfg).tasks
    # The method's own settings, with the Morgan fingerprint shared by the methods that use one.
    blocks = [*cls.shared_settings, cls.name]
    settings = {k: v for b in blocks if b in cfg for k, v in OmegaConf.to_container(cfg[b], resolve=True).items()}
    return cls(settings, seed=int(cfg.seed), n_jobs=int(cfg.n_jobs), tasks=tasks)


def check_method(cfg: DictConfig) -> None:
    """For `check_command_line`: each composed config of the command line (each value of a sweep) names a
    method (its settings' types and bounds are the schema's). No method at all is said when the command runs
    (`--help` needs none)."""
    if cfg.get("method") is not None:
        make_method(cfg)


def baseline(cfg: DictConfig) -> dict:
    """Run `cfg.method` on `cfg.data.split`; returns the metrics and where they were written."""
    # lazy: the runner answers through the pipeline, which brings torch (1.5 s); the checks before Hydra need none
    from llasmol.classical.runner import run_baseline

    method = make_method(cfg, start(cfg, torch=False).tasks)
    if cfg.output:
        check_target(cfg.output, "output")  # before any work: a FIFO or device is not replaced at the end
    data = OmegaConf.to_container(cfg.data, resolve=True)
    source = SMolInstructSource.from_config(data, table=method.tasks)
    results, intervals, out = run_baseline(method, source, cfg.data.split, cfg.generation,
                                           Path(cfg.paths.output_dir), Path(cfg.output) if cfg.output else None,
                                           named_tasks=data.get("tasks") is not None, intervals_cfg=cfg.intervals)
    return {"metrics": results, "intervals": intervals, "output": str(out), "folder": str(cfg.paths.output_dir),
            "tasks": method.tasks}


@command("baseline", run_folder=True, check=check_method)
def main(cfg: DictConfig) -> None:
    from llasmol.analysis.tables import metric_lines  # lazy: matplotlib (0.6 s), for the closing lines only

    result = baseline(cfg)
    print(metric_lines(result["metrics"], result["intervals"], cfg.all_metrics, result["tasks"]))
    print(f"metrics written to {result['output']}\n  report: python -m llasmol.report {result['folder']}", flush=True)


if __name__ == "__main__":
    main.from_command_line()
