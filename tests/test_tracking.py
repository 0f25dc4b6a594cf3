"""Offline W&B runs: what they record, the multirun group, and that the API key never lands in files."""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HANG_TIMEOUT
from refusals import refused, refused_cli

from llasmol.train import train

FAKE_KEY = "local-0123456789abcdef0123456789abcdef0123456789ab"
RUN = ["trainer.max_steps=4", "val_every_n_steps=2", "data.max_samples_per_task={validation:6}",
       "generation.max_new_tokens_limit=8", "callbacks.generation_evaluator.samples_per_task=2",
       "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1"]


def wandb_run_files(run_dir: Path) -> list[Path]:
    """The offline runs' record files, once W&B's writer has flushed them: `finish` returns before its
    service has written the last records (the summary: `*_best`), which a run in this process must not read
    half-written. At process exit, as for a user, the service flushes on its own."""
    import wandb

    wandb.teardown()
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def wandb_records(record_file: Path) -> list:
    """The records of one offline run file, in order (`wandb_internal_pb2.Record`). The file is W&B's
    record log: a 7-byte header, then 32 KiB blocks of chunks (crc32, length, type: whole, first, middle,
    last), each record a `Record`."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, records, parts = record_file.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B", record_file
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left in this block for a chunk header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            records.append(record)
    return records


def wandb_history(record_file: Path) -> list[dict]:
    """The history rows (what `wandb.log` was given) of one offline run file, in order."""
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in wandb_records(record_file) if r.WhichOneof("record_type") == "history"]


@pytest.mark.slow
def test_offline_wandb_run_holds_metrics_config_table_and_best(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by our config, not by the environment
    train(cfg_factory("logger=[csv,wandb]", *RUN))
    (record,) = wandb_run_files(tmp_path)
    blob = record.read_bytes()
    for key in (b"train/loss", b"train/lr", b"train/tokens_per_sec", b"val/loss",
                b"val/forward_synthesis/exact_match", b"val/property_prediction-bbbp/accuracy",
                b"val/forward_synthesis/exact_match_best", b"val/forward_synthesis/exact_match_best_n",
                b"val/property_prediction-bbbp/accuracy_best_note", b"val/loss_best", b"trainable", b"lora"):
        assert key in blob, key
    tables = sorted(record.parent.glob("files/media/table/val/predictions_*.table.json"))
    assert len(tables) == 2  # one per validation
    table = json.loads(tables[-1].read_text())
    assert table["columns"] == ["task", "input", "gold", "predictions", "answer", "correct"]
    assert len(table["data"]) == 11 * 2
    # Each validation at the step its files and train.log give it (val-step2, val-step4).
    assert [row["trainer/global_step"] for row in wandb_history(record) if "val/loss" in row] == [2, 4]
    # The API key reaches no file of the run.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_multirun_jobs_share_one_wandb_group(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("WANDB_MODE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "llasmol.train", "--multirun", "lora=lite,attn", f"hydra.sweep.dir={sweep}",
         "logger=[csv,wandb]", *[o for o in RUN if "max_samples" not in o],
         "data.max_samples_per_task={train:8,validation:2}"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    group = f"train-{sweep.name}".encode()
    records = [wandb_run_files(run) for run in sorted(p for p in sweep.iterdir() if p.is_dir())]
    assert [len(r) for r in records] == [1, 1]
    for (record,) in records:
        assert group in record.read_bytes()


@pytest.mark.slow
def test_a_run_resumed_in_its_directory_continues_its_wandb_run(cfg_factory, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    short = ["logger=[csv,wandb]", "val_every_n_steps=100", "callbacks.resume_checkpoint.every_n_train_steps=2",
             "trainer.enable_progress_bar=false", "data.max_samples_per_task={validation:2}"]
    train(cfg_factory("trainer.max_steps=2", *short))
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    train(cfg_factory("trainer.max_steps=4", "ckpt_path=last", *short))
    runs = wandb_run_files(tmp_path)
    assert len(runs) == 2 and all(p.name == f"run-{run_id}.wandb" for p in runs)  # one W&B run, two sessions
    # A fresh run in another directory is another W&B run.
    other = tmp_path / "other"
    train(cfg_factory("trainer.max_steps=2", f"paths.output_dir={other}", *short))
    assert (other / "wandb_run_id").read_text().strip() != run_id


@pytest.mark.slow
def test_a_run_resumed_in_its_directory_keeps_its_csv_rows(cfg_factory, tmp_path):
    import csv

    short = ["val_every_n_steps=100", "callbacks.resume_checkpoint.every_n_train_steps=3", "trainer.log_every_n_steps=1",
             "trainer.enable_progress_bar=false", "data.max_samples_per_task={validation:2}"]
    train(cfg_factory("trainer.max_steps=4", *short))  # last.ckpt at step 4 (the end), rows for steps 1-4

    def steps():
        with (tmp_path / "csv" / "metrics.csv").open() as fh:
            return [int(row["step"]) for row in csv.DictReader(fh) if row.get("train/loss")]

    first = steps()
    assert first and max(first) == 4
    train(cfg_factory("trainer.max_steps=6", "ckpt_path=last", *short))
    both = steps()
    assert both[: len(first)] == first and max(both) == 6  # the first session's rows, then the new ones
    assert len(both) == len(set(both))  # no step twice


@pytest.mark.slow
def test_resuming_from_a_mid_run_checkpoint_rewrites_the_rows_after_it_once(cfg_factory, tmp_path):
    """Rows logged after the checkpoint (before the stop) are dropped, as the resumed run logs them again."""
    import csv

    short = ["val_every_n_steps=3", "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false",
             "callbacks.resume_checkpoint.every_n_train_steps=100", "callbacks.generation_evaluator.samples_per_task=1",
             "generation.max_new_tokens_limit=2", "data.max_samples_per_task={validation:2}",
             "callbacks.model_checkpoint.save_top_k=-1"]  # keep the checkpoint of each validation
    train(cfg_factory("trainer.max_steps=6", *short))
    (mid,) = (tmp_path / "checkpoints").glob("step3-*.ckpt")  # after 3 steps

    def train_rows():
        with (tmp_path / "csv" / "metrics.csv").open() as fh:
            return [int(row["step"]) for row in csv.DictReader(fh) if row.get("train/loss")]

    assert train_rows() == [1, 2, 3, 4, 5, 6]
    train(cfg_factory("trainer.max_steps=6", f"ckpt_path={mid}", *short))
    assert train_rows() == [1, 2, 3, 4, 5, 6]  # steps 4-6 once, from the resumed session


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 1)])
def test_a_run_stopped_by_a_signal_and_resumed_logs_every_step_to_its_wandb_run_once(tmp_path, cfg_factory, capfd,
                                                                                      caplog, sig, code):
    """Stopped between the two micro-batches of the third step (the stop waits for the step's end), then resumed
    in place: one W&B run, its first session closed as preempting (not failed), its history holding steps 1-6,
    each once, and each session saying in a line or two, not W&B's screenful, where its files are."""
    run = ["logger=[csv,wandb]", "trainer.max_steps=6", "data.max_samples_per_task={train:24,validation:2}",
           "data.micro_batch_size=2", "data.effective_batch_size=4", "val_every_n_steps=100",
           "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false"]
    probe = ["+callbacks.signal._target_=resume_probe.SignalAt", f"+callbacks.signal.signal={sig}",
             "+callbacks.signal.step=2", "+callbacks.signal.micro_batch=1"]
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    for name in ("WANDB_QUIET", "WANDB_SILENT"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={tmp_path}", *run, *probe],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG_TIMEOUT)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "interrupted.ckpt").is_file()
    first_output = proc.stdout + proc.stderr
    capfd.readouterr()
    caplog.set_level(logging.INFO, logger="llasmol.train")
    train(cfg_factory(*run, "ckpt_path=last"))
    second_output = "".join(capfd.readouterr())
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    sessions = wandb_run_files(tmp_path)
    assert [p.name for p in sessions] == [f"run-{run_id}.wandb"] * 2  # one W&B run, continued
    steps = [row["trainer/global_step"] for p in sessions for row in wandb_history(p) if "train/loss" in row]
    # Session by session: no gap at the step the stop waited for (3), no step twice. (W&B's own `_step` starts
    # again at 0 in an offline session; the steps are `trainer/global_step`, the x-axis Lightning sets.)
    assert steps == list(range(1, 7)), steps

    # The stop is recorded as W&B's preemption, and neither session's exit code counts as a failure (W&B and
    # `wandb leet` show a non-zero one as "Failed").
    def closing(record_file: Path) -> tuple[list[int], bool]:
        records = wandb_records(record_file)
        exits = [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"]
        return exits, any(r.WhichOneof("record_type") == "preempting" for r in records)

    assert closing(sessions[0]) == ([0], True)
    assert closing(sessions[1]) == ([0], False)
    # What W&B prints stays short: its three start lines (offline, where, `wandb leet`), no closing block of
    # sparklines and summary values; one line of ours says where the session's files are.
    for output in (first_output, second_output):
        # (In a process where an earlier test started W&B, its service is reused, and W&B says so in a line.)
        wandb_lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", output).splitlines()
                       if line.startswith("wandb:") and "existing wandb-core service" not in line]
        assert 1 <= len(wandb_lines) <= 3, wandb_lines  # at least one: W&B's output was captured
    assert f"W&B run {run_id} (stopped: marked preempting, not failed): files in {sessions[0].parent}" in first_output
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("W&B run")] == [
        f"W&B run {run_id}: files in {sessions[1].parent} (upload: wandb sync {sessions[1].parent})"]


def test_a_multirun_jobs_wandb_group_is_its_sweep_folders_name_and_a_single_run_has_none():
    """In-process, as Hydra sets it for each job (the multirun test runs the real thing, slowly)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from llasmol.core.config import CONFIG_DIR

    try:
        for mode, group in [(RunMode.RUN, None), (RunMode.MULTIRUN, "train-2026-12-02_01-02-03")]:
            with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="train"):
                cfg = compose("train", overrides=["hydra.sweep.dir=/x/multirun/2026-12-02_01-02-03"],
                              return_hydra_config=True)
            cfg.hydra.mode = mode
            HydraConfig.instance().set_config(cfg)
            assert cfg.logger.wandb.group == group
    finally:
        HydraConfig.instance().cfg = None


class _RecordingRun:
    """What `finish_wandb_runs` asks of a W&B run, recorded (the slow tests above run W&B itself)."""

    def __init__(self, offline: bool) -> None:
        self.id, self.offline, self.calls = "abc123", offline, []
        self.sync_dir, self.url = "/runs/x/wandb/offline-run-1", "https://wandb.ai/me/llasmol/runs/abc123"

    def mark_preempting(self) -> None:
        self.calls.append("mark_preempting")

    def finish(self, exit_code=None) -> None:
        self.calls.append(("finish", exit_code))


@pytest.mark.parametrize("stopped", [False, True])
@pytest.mark.parametrize("offline", [True, False])
def test_closing_a_wandb_run_marks_a_stopped_one_preempting_exits_0_and_says_where_it_is(stopped, offline, caplog,
                                                                                         tmp_path):
    from types import SimpleNamespace

    from llasmol.finetune.tracking import WandbLogger, finish_wandb_runs

    started, never_started = (WandbLogger(project="p", offline=True, save_dir=str(tmp_path)) for _ in range(2))
    run = started._experiment = _RecordingRun(offline)
    other = SimpleNamespace(log_metrics=None)  # a CSV or TensorBoard logger: not W&B's, left alone
    caplog.set_level(logging.INFO, logger="llasmol.train")
    trainer = SimpleNamespace(loggers=[other, never_started, started])
    if stopped:
        finish_wandb_runs(trainer, stopped=True)
    else:
        finish_wandb_runs(trainer)  # a run that ended by itself: the default
    assert run.calls == (["mark_preempting", ("finish", 0)] if stopped else [("finish", 0)])
    assert never_started._experiment is None  # closing never starts a run
    where = (f"files in {run.sync_dir} (upload: wandb sync {run.sync_dir})" if offline else run.url)
    said = " (stopped: marked preempting, not failed)" if stopped else ""
    assert [r.getMessage() for r in caplog.records] == [f"W&B run abc123{said}: {where}"]


@pytest.mark.parametrize("env, settings, quiet", [({}, None, True), ({"WANDB_QUIET": "false"}, None, None),
                                                  ({"WANDB_SILENT": "true"}, None, None),
                                                  ({}, {"quiet": False}, False)])
def test_wandb_is_quiet_unless_the_user_says_otherwise(env, settings, quiet, monkeypatch, tmp_path):
    from llasmol.finetune.tracking import WandbLogger

    for name in ("WANDB_QUIET", "WANDB_SILENT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    kwargs = {} if settings is None else {"settings": settings}
    logger = WandbLogger(project="p", offline=True, save_dir=str(tmp_path), **kwargs)
    assert (logger._wandb_init.get("settings") or {}).get("quiet") == quiet
    assert "anonymous" not in logger._wandb_init


@pytest.mark.parametrize("fn, step, epoch, expected", [
    ("fit", 12, 2, 2),        # during fit: Lightning's own epoch
    ("fit", 0, 0, 0),
    ("validate", 12, 3, 2),   # after fit Lightning counts the epoch it left as done: the last step's is one lower
    ("validate", 12, 0, 0),   # never below the first epoch
    ("validate", 0, 1, 1),    # nothing trained yet: there is no earlier step to name
])
def test_the_epoch_of_a_row_is_the_epoch_of_its_latest_optimizer_step(fn, step, epoch, expected):
    from types import SimpleNamespace

    from llasmol.finetune.tracking import epoch_of_latest_step

    trainer = SimpleNamespace(state=SimpleNamespace(fn=fn), global_step=step, current_epoch=epoch)
    assert epoch_of_latest_step(trainer) == expected


def test_every_loggers_rows_are_numbered_by_the_optimizer_steps_completed():
    """Lightning hands a logger its own counter (one lower during fit); every logger gets the trainer's step
    instead, and a row's epoch is that step's (a row without an epoch gets none)."""
    from types import SimpleNamespace

    from llasmol.finetune.tracking import number_rows_by_optimizer_step

    rows = {"csv": [], "wandb": []}

    def recorder(name):
        return SimpleNamespace(log_metrics=lambda metrics, step=None: rows[name].append((step, metrics)))

    trainer = SimpleNamespace(loggers=[recorder("csv"), recorder("wandb")], state=SimpleNamespace(fn="validate"),
                              global_step=40, current_epoch=2)
    number_rows_by_optimizer_step(trainer)
    given = {"val/loss": 0.5, "epoch": 2}
    for logger in trainer.loggers:
        logger.log_metrics(given, step=39)
    trainer.loggers[0].log_metrics({"train/loss": 1.0})
    assert rows == {"csv": [(40, {"val/loss": 0.5, "epoch": 1}), (40, {"train/loss": 1.0})],
                    "wandb": [(40, {"val/loss": 0.5, "epoch": 1})]}
    assert given == {"val/loss": 0.5, "epoch": 2}  # the caller's dict is not changed


@pytest.mark.parametrize("logger_cfg, named", [
    ({"wandb": {"_target_": "llasmol.finetune.tracking.WandbLogger", "log_model": "all", "offline": True}},
     ("logger.wandb.log_model=all", "logger.wandb.offline=false", "log_model=false")),
    ({"tb": {"_target_": "lightning.pytorch.loggers.TensorBoardLogger"}},
     ("logger=tb", "pip install tensorboard")),
])
def test_logger_settings_that_would_fail_mid_run_are_one_line_before_it(logger_cfg, named, monkeypatch):
    import importlib.util

    from llasmol.finetune.tracking import check_loggers

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # neither tensorboard nor tensorboardX
    with refused(*named):
        check_loggers(logger_cfg)


def test_logger_settings_that_can_run_pass_the_check(monkeypatch):
    import importlib.util

    from llasmol.finetune.tracking import check_loggers

    wandb = "llasmol.finetune.tracking.WandbLogger"
    check_loggers(None)
    check_loggers({"csv": {"_target_": "llasmol.finetune.tracking.KeepingCSVLogger"}, "off": None})
    for node in ({"_target_": wandb, "log_model": True, "offline": False},  # online: artifacts can upload
                 {"_target_": wandb, "log_model": False, "offline": True},
                 {"_target_": "other.Logger", "log_model": True, "offline": True}):
        check_loggers({"w": node})
    tensorboard = {"tb": {"_target_": "lightning.pytorch.loggers.TensorBoardLogger"}}
    for present in ("tensorboard", "tensorboardX"):  # either package will do
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, present=present: name == present or None)
        check_loggers(tensorboard)


def test_the_progress_bar_leaves_out_the_logger_version(monkeypatch):
    from lightning.pytorch.callbacks import RichProgressBar

    from llasmol.finetune.tracking import ProgressBar

    monkeypatch.setattr(RichProgressBar, "get_metrics", lambda self, trainer, module: {"v_num": 3, "train/loss": 0.5})
    assert ProgressBar().get_metrics(None, None) == {"train/loss": 0.5}
    monkeypatch.setattr(RichProgressBar, "get_metrics", lambda self, trainer, module: {"train/loss": 0.5})
    assert ProgressBar().get_metrics(None, None) == {"train/loss": 0.5}


def _wandb_logger(tmp_path):
    """A W&B logger whose run is a stand-in: its summary is a dict, its tables are recorded."""
    from types import SimpleNamespace

    from llasmol.finetune.tracking import WandbLogger

    logger = WandbLogger(project="p", offline=True, save_dir=str(tmp_path))
    logger._experiment = SimpleNamespace(summary={})
    logger.tables = []
    logger.log_table = lambda **kwargs: logger.tables.append(kwargs)
    return logger


def test_the_predictions_table_has_a_row_per_sample_with_whether_its_answer_is_right(tmp_path):
    from types import SimpleNamespace

    from llasmol.core.tasks import SMOLINSTRUCT
    from llasmol.finetune.tracking import log_predictions_table, wandb_loggers

    logger = _wandb_logger(tmp_path)
    trainer = SimpleNamespace(loggers=[SimpleNamespace(), logger], global_step=12)
    assert wandb_loggers(trainer) == [logger]
    s2f = "name_conversion-s2f"
    records = [
        {"task": s2f, "input": "CCO", "gold": ["C2H6O"], "predictions": ["<MOLFORMULA> C2H6O </MOLFORMULA>"],
         "answers": ["C2H6O"]},
        {"task": s2f, "input": "CCO", "gold": ["C2H6O"], "predictions": ["<MOLFORMULA> CH4 </MOLFORMULA>"],
         "answers": ["CH4"]},
        {"task": "property_prediction-esol", "input": "é", "gold": ["-1.5"], "predictions": ["<NUMBER> -1.0 </NUMBER>"],
         "answers": ["-1.0"]},  # a regression's answer is scored, neither right nor wrong
        {"task": s2f, "input": "CCO", "gold": ["C2H6O"], "predictions": [""], "answers": [], "skipped": True},
    ]
    # A run's own task is judged by the run's table (by SMolInstruct's alone it was "unknown task" and the
    # run died at its first validation under the default loggers).
    records.append({"task": "logs", "input": "CCO", "gold": ["-0.5"], "predictions": ["<NUMBER> -0.7 </NUMBER>"],
                    "answers": ["-0.7"]})
    log_predictions_table(trainer, records, SMOLINSTRUCT.with_declared({"logs": {"family": "number"}}))
    [table] = logger.tables
    assert table["key"] == "val/predictions" and table["step"] == 12
    assert table["columns"] == ["task", "input", "gold", "predictions", "answer", "correct"]
    assert table["data"] == [
        [s2f, "CCO", '["C2H6O"]', '["<MOLFORMULA> C2H6O </MOLFORMULA>"]', "C2H6O", True],
        [s2f, "CCO", '["C2H6O"]', '["<MOLFORMULA> CH4 </MOLFORMULA>"]', "CH4", False],
        ["property_prediction-esol", "é", '["-1.5"]', '["<NUMBER> -1.0 </NUMBER>"]', "-1.0", None],
        [s2f, "CCO", '["C2H6O"]', '[""]', None, False],  # skipped: no answer, not right
        ["logs", "CCO", '["-0.5"]', '["<NUMBER> -0.7 </NUMBER>"]', "-0.7", None],
    ]
    log_predictions_table(SimpleNamespace(loggers=[], global_step=1), records, SMOLINSTRUCT)  # no W&B: nothing
    assert len(logger.tables) == 1


def test_each_metrics_best_is_the_min_of_losses_and_errors_and_the_max_of_scores(tmp_path):
    from types import SimpleNamespace

    from llasmol.finetune.tracking import update_best_summary

    logger = _wandb_logger(tmp_path)
    trainer = SimpleNamespace(loggers=[logger])
    esol = "val/property_prediction-esol"
    update_best_summary(trainer, {"val/loss": 2.0, f"{esol}/rmse": 1.5, "val/t/exact_match": 0.25,
                                  "val/t/num_invalid": 3.0, "val/t/num_samples": 20.0, "val/t/tp": 4.0,
                                  "val/t/accuracy": float("nan")})
    # Counts that are tallies (samples, tp) have no best; a count of failures is best when lowest; NaN never is.
    assert logger.experiment.summary == {"val/loss_best": 2.0, f"{esol}/rmse_best": 1.5,
                                         "val/t/exact_match_best": 0.25, "val/t/num_invalid_best": 3.0}
    update_best_summary(trainer, {"val/loss": 2.5, f"{esol}/rmse": 1.0, "val/t/exact_match": 0.5,
                                  "val/t/num_invalid": 5.0, "val/t/accuracy": 0.75})
    assert logger.experiment.summary == {"val/loss_best": 2.0, f"{esol}/rmse_best": 1.0, "val/t/exact_match_best": 0.5,
                                         "val/t/num_invalid_best": 3.0, "val/t/accuracy_best": 0.75}
    update_best_summary(trainer, {"val/loss": 1.0, "val/t/exact_match": 0.125, "val/t/accuracy": float("nan")})
    assert logger.experiment.summary["val/loss_best"] == 1.0
    assert logger.experiment.summary["val/t/exact_match_best"] == 0.5
    assert logger.experiment.summary["val/t/accuracy_best"] == 0.75
    # With the samples each value stands on: an RMSE on 1 number of 30 is kept with that count and flagged, and
    # a better RMSE on 25 of them replaces both.
    update_best_summary(trainer, {f"{esol}/rmse": 0.5}, {f"{esol}/rmse": (1, "n=1 of 30, too few")})
    assert (logger.experiment.summary[f"{esol}/rmse_best"], logger.experiment.summary[f"{esol}/rmse_best_n"],
            logger.experiment.summary[f"{esol}/rmse_best_note"]) == (0.5, 1, "n=1 of 30, too few")
    update_best_summary(trainer, {f"{esol}/rmse": 0.75}, {f"{esol}/rmse": (30, "")})  # worse: the best stays
    assert logger.experiment.summary[f"{esol}/rmse_best_n"] == 1
    update_best_summary(trainer, {f"{esol}/rmse": 0.25}, {f"{esol}/rmse": (25, "n=25 of 30")})
    assert (logger.experiment.summary[f"{esol}/rmse_best"], logger.experiment.summary[f"{esol}/rmse_best_n"],
            logger.experiment.summary[f"{esol}/rmse_best_note"]) == (0.25, 25, "n=25 of 30")


@pytest.mark.slow
def test_wandb_artifacts_without_an_online_run_end_with_one_line(tmp_path):
    refused_cli(["llasmol.train", "logger.wandb.log_model=true", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                "logger.wandb.log_model=True", "logger.wandb.offline=false")
    assert not (tmp_path / "run" / "wandb").exists()  # refused before a W&B run was started


@pytest.mark.slow
def test_tensorboard_without_its_package_ends_with_one_line(tmp_path):
    import importlib.util

    if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
        pytest.skip("tensorboard is installed here")
    refused_cli(["llasmol.train", "logger=tensorboard", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                "logger=tensorboard", "pip install tensorboard")


@pytest.mark.slow
def test_a_wandb_folder_on_a_full_disk_is_one_line_before_the_logger_starts(tmp_path):
    """W&B's offline run writes from its own process: on a full disk it once ended a run in hundreds of lines
    (asyncio socket warnings, logging tracebacks). Its folder is checked with the run's settings instead."""
    from test_files import _fill, _mounted_tmpfs

    small = tmp_path / "small"
    _mounted_tmpfs(small, "size=200k")
    try:
        _fill(small)
        refused_cli(["llasmol.train", f"hydra.run.dir={tmp_path / 'run'}", "logger=wandb",
                     f"logger.wandb.save_dir={small}", "trainer.max_steps=2", "val_every_n_steps=1000"], tmp_path,
                    f"logger.wandb.save_dir={small}", "no space left", untouched=small)
    finally:
        subprocess.run(["umount", str(small)])


@pytest.mark.parametrize("given, mode", [("online", "online"), ("ONLINE", "online"), (" Offline ", "offline"),
                                         ("disabled", "disabled"), ("onilne", None), ("", None)])
def test_wandb_mode_is_taken_in_any_case_and_a_misspelt_one_is_one_line(given, mode, monkeypatch):
    """W&B takes only its own lower-case spelling (a validation traceback at the first logged value otherwise):
    a known mode is respelt before the logger starts, and sets our offline default the same way."""
    from omegaconf import OmegaConf

    from llasmol.finetune.tracking import check_loggers

    monkeypatch.setenv("WANDB_MODE", given)
    cfg = OmegaConf.create({"wandb": {"_target_": "llasmol.finetune.tracking.WandbLogger",
                                      "offline": "${llasmol_wandb_offline:}", "log_model": False}})
    if mode is None:
        with refused(f"WANDB_MODE={given!r}", "WANDB_MODE=online or offline"):
            check_loggers(cfg)
        return
    check_loggers(cfg)
    assert os.environ["WANDB_MODE"] == mode
    assert cfg.wandb.offline is (mode != "online")
    monkeypatch.setenv("WANDB_MODE", "ONLINE")
    check_loggers({"csv": {"_target_": "llasmol.finetune.tracking.KeepingCSVLogger"}})
    assert os.environ["WANDB_MODE"] == "ONLINE"  # no W&B logger: not ours to touch
