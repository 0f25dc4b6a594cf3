"""What a run directory holds, by name: training writes these, and evaluate, generate, resume and the
analysis read them. (The checkpoint folder and the CSV logger's folder are also named in
`conf/callbacks/default.yaml` and `conf/logger/csv.yaml`, where a user may move them.)"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from llasmol.core.errors import UserError
from llasmol.core.files import read_json, write_json
from llasmol.core.schema import checked_tasks
from llasmol.core.tasks import SMOLINSTRUCT, TaskTable

PARAMS = "params.json"  # trainable/total parameters, model and LoRA variant
RESULT = "result.json"  # final metrics, best checkpoint, global step
HYDRA_CONFIG = ".hydra/config.yaml"  # the resolved config of the run
CHECKPOINTS = "checkpoints"
LAST_CKPT = "last.ckpt"  # rewritten every few optimizer steps and at the end
INTERRUPTED_CKPT = "interrupted.ckpt"  # written when Ctrl-C or SIGTERM stops the run at a step's end
RESUME_CKPTS = (LAST_CKPT, INTERRUPTED_CKPT)
PREDICTIONS = "predictions"  # <validation or split>.jsonl
ROLLOUTS = "rollouts"  # step{S}.jsonl: each completion objective=grpo sampled in optimizer step S, its reward and terms
METRICS = "metrics"  # <validation or split>.json
INTERVALS_SUFFIX = ".intervals"  # metrics/<name>.intervals.json: the bootstrap intervals of metrics/<name>.json
CSV_LOG = "csv/metrics.csv"
WANDB_ID = "wandb_run_id"  # the run's W&B id, continued by an in-place resume
SYSTEM = "system.json"  # evaluate predictions= name=<label>: an outside system's row (its name, its source file)
BASELINE = "baseline.json"  # a baseline's folder: the method, its settings, tasks answered and skipped, time, memory
# The declarations of the tasks of the user's own that the folder's files name (`llasmol.core.tasks`), so that
# a reader knows them as the command that wrote them did: written once (train at start, an evaluation beside
# its files), read by `read_tasks` alone.
DECLARED_TASKS = "tasks.json"
CARD = "card.json"  # what a model card says of the run (`llasmol.model.cards`): written by train at start
EVALUATE_LOG = "evaluate.log"  # every evaluate that wrote into the run, appended (its command's folder has one too)


def intervals_file(metrics_file: Path) -> Path:
    """The bootstrap intervals of a metrics file: beside it, `<name>.intervals.json`."""
    return metrics_file.with_name(metrics_file.stem + INTERVALS_SUFFIX + ".json")


# One numbering everywhere a run names a moment of training (checkpoint files and their adapters, a
# validation's files, train.log, the CSV and W&B step): the optimizer steps completed, as `max_steps` and
# `val_every_n_steps` count them. Names carry no epoch: the step alone is unique and never ambiguous.
VALIDATION_PREFIX = "val-step"
# Runs written before issue #28 named validations val-epoch{E}-step{S} (S the same count); still read.
VALIDATION_STEM = re.compile(r"^val-(?:epoch\d+-)?step(\d+)$")


def validation_name(step: int) -> str:
    """The stem of the predictions and metrics files of the validation after `step` optimizer steps."""
    return f"{VALIDATION_PREFIX}{step}"


def validation_step(stem: str) -> Optional[int]:
    """The step of a validation's file stem (`val-step40`, or an older run's `val-epoch0-step40`); None when
    `stem` names no validation (an evaluated split such as `test`)."""
    match = VALIDATION_STEM.match(stem)
    return int(match.group(1)) if match else None


MAX_DECLARED_BYTES = 1_000_000  # a few hundred bytes a task


def write_tasks(folder: Path, declared: Mapping[str, Mapping]) -> None:
    """Write `declared` (task name -> declaration) as `folder`'s `tasks.json`, with their fingerprint: a later
    edit, which would change how the folder's files are read and scored, is refused by `read_tasks`."""
    declared = {name: dict(decl) for name, decl in declared.items()}
    write_json(Path(folder) / DECLARED_TASKS, {"declared": declared, "sha256": _fingerprint(declared)})


def _fingerprint(declared: Mapping) -> str:
    return hashlib.sha256(json.dumps(declared, sort_keys=True, ensure_ascii=True).encode("ascii")).hexdigest()


def read_tasks(folder: Path, beside: TaskTable = SMOLINSTRUCT) -> TaskTable:
    """`beside` and the tasks of the user's own that a folder written by a command declares (its `tasks.json`),
    checked as a command's own config is; `beside` itself when the folder has none. A run's predictions and
    metrics then read as they were written: a file whose declarations no longer match their fingerprint is
    refused. (Folders written before the fingerprint hold the declarations alone, read as they are.)"""
    path = Path(folder) / DECLARED_TASKS
    fix = "it is written by llasmol's commands beside their files: restore it, or remove the folder's own tasks"
    found = _read_object(path, "task declarations by name", fix)
    if found is None:
        try:  # a run that trained tasks of its own says so in its card: their declarations went missing
            own = list((read_card(Path(folder)) or {}).get("own_tasks") or {})
        except UserError:
            own = []
        if own:
            raise UserError(f"{path} is missing, and the run trained tasks of its own ({', '.join(own)}) that only it "
                            f"declares: {fix}")
        return beside
    if set(found) == {"declared", "sha256"} and isinstance(found["sha256"], str):
        if not isinstance(found["declared"], dict) or _fingerprint(found["declared"]) != found["sha256"]:
            raise UserError(f"{path} was changed after the command that wrote it (its declarations no longer match "
                            "their fingerprint), and the folder's predictions were made and scored with the old "
                            "ones: restore it; to score the predictions another way, copy them out of the folder "
                            "and evaluate predictions=<copy> with your +data.new_tasks")
        found = found["declared"]
    return checked_tasks(found, beside, str(path))


def read_card(folder: Path) -> Optional[dict]:
    """The facts a run saved for its model cards (`card.json`), None for a folder without them (an adapter
    folder, or a run from before runs kept them)."""
    path = Path(folder) / CARD
    found = _read_object(path, "a run's card facts", "train writes it at start: restore it, or remove it to "
                         "export without the training facts")
    missing = [key for key in ("model", "lora", "params", "data", "tasks", "recipe") if found and key not in found]
    if missing:
        raise UserError(f"{path} lacks {missing[0]}: train writes it at start: restore it, or remove it to export "
                        "without the training facts")
    return found


def _read_object(path: Path, what: str, fix: str) -> Optional[dict]:
    """The JSON object in `path` (None when there is none), read as data, whatever the file holds."""
    if not os.path.lexists(path):  # a dangling link or a link loop is a file someone meant: named below
        return None
    return read_json(path, fix, dict, what, MAX_DECLARED_BYTES)
