"""Reading run directories (single runs and multiruns) written by `python -m llasmol.train`, and the folders
of `python -m llasmol.baseline`, read the same way.

A run directory holds ``params.json``, ``metrics/val-step{S}.json`` (one per validation, after S optimizer
steps; runs written before issue #28 named them ``val-epoch{E}-step{S}``, read the same),
``predictions/val-step{S}.jsonl`` and ``csv/metrics.csv``, and ``metrics/<split>.json`` with
``predictions/<split>.jsonl`` for a whole split evaluated at once; a baseline's folder holds the latter and
``baseline.json`` (its method). A multirun directory holds one run directory per job, named
``<n>_<model>_<lora>`` (``<n>_<method>`` for baselines).  Everything here only reads files: nothing is
imported from torch or Lightning.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from llasmol.core import run_dir as layout
from llasmol.core.errors import UserError
from llasmol.core.files import read_json
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable
from llasmol.inference.predictions import read_predictions
from llasmol.metrics.support import with_support

_VARIANT_NAME = re.compile(r"^(\d+)_")

PathLike = Union[str, Path]

# Why a run has nothing to report yet, and what to do.
NO_VALIDATION = ("has no validation yet (no metrics/val-step*.json): a run validates every "
                 "val_every_n_steps optimizer steps and at its last step; wait for one, or score it with "
                 "python -m llasmol.evaluate ckpt=<run dir>")


def _finite_or_none(value):
    """JSON numbers as floats; NaN/inf (older files, result.json) and non-numbers become None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _task_metrics(data: dict, tasks: TaskTable) -> dict[str, dict[str, Optional[float]]]:
    """A metrics file's ``{task: {metric: value}}``, each value with how many samples it stands on
    (`llasmol.metrics.support`: tables print ``0.630 (n=1 of 30, too few)``)."""
    return {task: with_support(task, {name: _finite_or_none(v) for name, v in values.items()}, tasks)
            for task, values in data.items() if isinstance(values, dict)}


def _read_json(path: Path):
    return read_json(path, "restore or remove it", kind=None)


@dataclass
class Validation:
    """One validation of a run, or a whole split scored at once (`split`: `evaluate ckpt=<run>`, a baseline):
    its metrics and (read on demand) its predictions."""

    step: Optional[int]
    metrics_path: Path
    predictions_path: Optional[Path]
    metrics: dict[str, dict[str, Optional[float]]]
    _records: Optional[list[dict]] = field(default=None, repr=False)
    split: Optional[str] = None
    table: TaskTable = SMOLINSTRUCT  # the run's tasks: SMolInstruct's and its own (its tasks.json)

    @property
    def name(self) -> str:
        return self.split or self.metrics_path.stem  # val-step{S} (an older run's val-epoch{E}-step{S})

    @property
    def tasks(self) -> list[str]:
        return list(self.metrics)

    def predictions(self) -> list[dict]:
        """The prediction records (one per sample), or ``[]`` when the file is missing."""
        if self._records is None:
            self._records = (read_predictions(self.predictions_path, allow_empty=True, tasks=self.table)
                             if self.predictions_path else [])
        return self._records


@dataclass
class Run:
    """A run directory: parameter counts, validations in order (oldest first), the CSV log."""

    path: Path
    params: dict
    validations: list[Validation]
    # Metrics of whole splits the run was evaluated on (`evaluate ckpt=<run> data.split=test`), by split.
    evaluations: dict[str, dict[str, dict[str, Optional[float]]]] = field(default_factory=dict)
    # A baseline's folder: its baseline.json (method, settings, tasks, time); None for a trained run.
    baseline: Optional[dict] = None
    # Another system's answers scored by `evaluate predictions=... name=...`: its system.json.
    system: Optional[dict] = None
    table: TaskTable = SMOLINSTRUCT  # the run's tasks: SMolInstruct's and its own (its tasks.json)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def label(self) -> str:
        """What tables call it: ``baseline:<method>`` for a baseline, the system's name for outside answers
        (`evaluate predictions=... name=...`), else the folder name."""
        if self.baseline is not None:
            return f"baseline:{self.baseline.get('method')}"
        if self.system is not None and isinstance(self.system.get("name"), str):
            return self.system["name"]
        return self.name

    @property
    def lora(self) -> Optional[str]:
        if self.baseline is not None:
            return None
        return self.params.get("lora") or _name_part(self.path.name, "lora")

    @property
    def model(self) -> Optional[str]:
        if self.baseline is not None:
            return None
        return self.params.get("model") or _name_part(self.path.name, "model")

    @property
    def latest(self) -> Optional[Validation]:
        return self.validations[-1] if self.validations else None

    def evaluation(self, split: str) -> Validation:
        """The whole split `split` as scored (metrics and predictions), read like a validation."""
        if split not in self.evaluations:
            have = ", ".join(sorted(self.evaluations)) or "none"
            raise UserError(f"{self.path} has no {split} results (has: {have})")
        predictions = self.path / layout.PREDICTIONS / f"{split}.jsonl"
        return Validation(step=None, metrics_path=self.path / layout.METRICS / f"{split}.json",
                          predictions_path=predictions if predictions.is_file() else None,
                          metrics=self.evaluations[split], split=split, table=self.table)

    def validation(self, which: Union[None, int, str] = None) -> Validation:
        """The latest validation (``None``), the one at a list position (``-1``, ``0``) or by name
        (``"val-step2"``, or its step as a string ``"step2"``), or an evaluated split by name
        (``"test"``). A folder with no validation but evaluated splits (a baseline's) gives its ``test``
        split (else its first) for ``None``."""
        if isinstance(which, str) and which in self.evaluations:
            return self.evaluation(which)
        if not self.validations and self.evaluations and which is None:
            return self.evaluation("test" if "test" in self.evaluations else sorted(self.evaluations)[0])
        if not self.validations:
            raise UserError(f"{self.path} {NO_VALIDATION}")
        if which is None:
            return self.validations[-1]
        if isinstance(which, int):
            try:
                return self.validations[which]
            except IndexError:
                raise UserError(f"{self.path} has {len(self.validations)} validations; no index {which}") from None
        for val in self.validations:
            if which in (val.name, f"step{val.step}", val.metrics_path.name):
                return val
        names = ", ".join(v.name for v in self.validations)
        raise UserError(f"{self.path} has no validation {which!r}; it has: {names}")

    @property
    def val_loss(self) -> Optional[float]:
        """The validation loss of the latest validation (from the CSV log), or None."""
        losses = [row["val/loss"] for row in self.csv_log() if row.get("val/loss") is not None]
        return losses[-1] if losses else None

    @property
    def train_loss(self) -> Optional[float]:
        """The last logged training loss (from the CSV log), or None."""
        losses = [row["train/loss"] for row in self.csv_log() if row.get("train/loss") is not None]
        return losses[-1] if losses else None

    @property
    def seconds(self) -> Optional[float]:
        """The training command's wall time (its result.json; a resumed run: the last process only)."""
        result = self.path / layout.RESULT
        data = _read_json(result) if result.is_file() else None
        return _finite_or_none(data.get("seconds")) if isinstance(data, dict) else None

    def loss_curves(self) -> dict[str, list[tuple[int, float]]]:
        """``train/loss`` and ``val/loss`` against the optimizer step, from the CSV log."""
        curves: dict[str, list[tuple[int, float]]] = {"train/loss": [], "val/loss": []}
        for row in self.csv_log():
            for name, points in curves.items():
                if row.get(name) is not None and row.get("step") is not None:
                    points.append((int(row["step"]), row[name]))
        return curves

    def reward_curves(self) -> dict[str, list[tuple[int, float]]]:
        """A GRPO run's ``train/reward`` and each task's ``train/reward/<task>`` against the optimizer step, from the
        CSV log (empty for a run of the SFT objective)."""
        curves: dict[str, list[tuple[int, float]]] = {}
        for row in self.csv_log():
            for name, value in row.items():
                if value is not None and row.get("step") is not None and (
                        name == "train/reward" or (name.startswith("train/reward/") and name.count("/") == 2)):
                    curves.setdefault(name, []).append((int(row["step"]), value))
        return curves

    def csv_log(self) -> list[dict[str, Optional[float]]]:
        """Rows of ``csv/metrics.csv`` with numbers as floats and empty cells as None."""
        return read_csv_log(self.path / layout.CSV_LOG)


def _name_part(name: str, part: str) -> Optional[str]:
    """The model or LoRA variant of a multirun job's folder, `{job}_{model}_{lora}` (conf/hydra/default.yaml's
    subdir), for a run without params.json. Model names may hold underscores (mistral_v03), LoRA names do not."""
    parts = name.split("_")
    if len(parts) < 3 or not _VARIANT_NAME.match(name):
        return None
    return parts[-1] if part == "lora" else "_".join(parts[1:-1])


def read_csv_log(path: PathLike) -> list[dict[str, Optional[float]]]:
    """A Lightning CSVLogger file as rows of floats (empty, 'nan' or non-numeric cells -> None).

    Returns ``[]`` when the file does not exist.
    """
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            parsed = {}
            for key, text in row.items():
                try:
                    parsed[key] = _finite_or_none(float(text)) if text not in (None, "") else None
                except ValueError:
                    parsed[key] = None
            rows.append(parsed)
    return rows


def _load_validations(path: Path, tasks: TaskTable) -> list[Validation]:
    out = []
    metrics_dir = path / layout.METRICS
    if not metrics_dir.is_dir():
        return out
    for file in metrics_dir.glob("val-*.json"):
        step = layout.validation_step(file.stem)
        if step is None:
            continue
        data = _read_json(file)
        if not isinstance(data, dict):
            raise UserError(f"{file} is not a {{task: {{metric: value}}}} object")
        metrics = _task_metrics(data, tasks)
        predictions = path / layout.PREDICTIONS / f"{file.stem}.jsonl"
        out.append(
            Validation(
                step=step,
                metrics_path=file,
                predictions_path=predictions if predictions.is_file() else None,
                metrics=metrics,
                table=tasks,
            )
        )
    out.sort(key=lambda v: v.step)
    return out


def _load_evaluations(path: Path, tasks: TaskTable) -> dict[str, dict[str, dict[str, Optional[float]]]]:
    out = {}
    for file in sorted((path / layout.METRICS).glob("*.json")) if (path / layout.METRICS).is_dir() else []:
        if layout.validation_step(file.stem) is not None or file.stem.endswith(layout.INTERVALS_SUFFIX):
            continue
        data = _read_json(file)
        if isinstance(data, dict):
            out[file.stem] = _task_metrics(data, tasks)
    return out


def is_run_dir(path: PathLike) -> bool:
    """Whether `path` looks like a training run directory."""
    path = Path(path)
    return path.is_dir() and any(
        (path / name).exists() for name in (layout.PARAMS, layout.METRICS, layout.PREDICTIONS, layout.RESULT, layout.CSV_LOG)
    )


def variant_dirs(path: PathLike) -> list[Path]:
    """The job folders of a multirun directory, in job order: run directories directly inside
    `path` named as Hydra numbers jobs (``<n>_...``, e.g. ``0_tiny_lite``)."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = [p for p in path.iterdir() if p.is_dir() and _VARIANT_NAME.match(p.name) and is_run_dir(p)]
    return sorted(found, key=lambda p: (int(_VARIANT_NAME.match(p.name).group(1)), p.name))


def is_multirun_dir(path: PathLike) -> bool:
    """Whether `path` holds run directories (and is not itself a run directory)."""
    return Path(path).is_dir() and not is_run_dir(path) and bool(variant_dirs(path))


def load_run(path: PathLike, require_validation: bool = False) -> Run:
    """Read a run directory; a `UserError` when it is not one (or, if required, has neither a validation
    nor an evaluated split to report)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory")
    if not is_run_dir(path):
        raise UserError(
            f"{path} is not a run directory (no params.json, metrics/, predictions/ or csv/metrics.csv)"
        )
    tasks = layout.read_tasks(path)  # the run's own tasks, before its files name them
    params_file = path / layout.PARAMS
    params = _read_json(params_file) if params_file.is_file() else {}
    if not isinstance(params, dict):
        params = {}
    baseline_file = path / layout.BASELINE
    baseline = _read_json(baseline_file) if baseline_file.is_file() else None
    system = _read_json(path / layout.SYSTEM) if (path / layout.SYSTEM).is_file() else None
    run = Run(path=path, params=params, validations=_load_validations(path, tasks),
              evaluations=_load_evaluations(path, tasks),
              baseline=baseline if isinstance(baseline, dict) else None,
              system=system if isinstance(system, dict) else None, table=tasks)
    if require_validation and not (run.validations or run.evaluations):
        raise UserError(f"{path} {NO_VALIDATION} (nor an evaluated split: metrics/<split>.json)")
    return run


def newest(root: PathLike, multirun: bool = False) -> Path:
    """The newest run directory under `root` (e.g. outputs/train), or with `multirun` the newest sweep
    (under `root`/multirun): what the notebooks open when not told which."""
    root = Path(root)
    base = root / "multirun" if multirun else root
    found = [p for p in base.iterdir() if (is_multirun_dir(p) if multirun else is_run_dir(p))] if base.is_dir() else []
    if not found:
        kind = "multirun" if multirun else "run"
        raise UserError(f"no {kind} directory under {base}: train one first (python -m llasmol.train"
                        f"{' --multirun lora=lite,full' if multirun else ''}), or name one")
    return max(found, key=lambda p: p.stat().st_mtime)


def load_sweep(path: PathLike) -> list[Run]:
    """Every run of a multirun directory, in job order; a `UserError` when there is none."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory")
    dirs = variant_dirs(path)
    if not dirs:
        raise UserError(f"{path} is not a multirun directory (no run directories named <n>_... inside)")
    return [load_run(p) for p in dirs]
