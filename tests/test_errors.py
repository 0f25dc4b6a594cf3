"""`llasmol.core.errors`: a mistake is one `error:` line and exit 2, wherever it was raised (a DataLoader
worker, Hydra's instantiate), and a command stopped by one leaves no empty run folder behind."""

from __future__ import annotations

import logging
import os

import pytest
from refusals import refused_cli


def test_a_user_error_inside_a_dataloader_worker_is_still_one_line(capsys):
    """Worker processes re-raise with the worker's traceback in the message; only the cause is shown."""
    from torch._utils import ExceptionWrapper

    from llasmol.core.errors import UserError, report_user_errors

    try:
        raise UserError("raw/train/x.jsonl line 3 is not valid JSON: fix the line")
    except UserError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 1")

    @report_user_errors
    def job():
        wrapped.reraise()

    with pytest.raises(SystemExit) as exit_info:
        job()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: raw/train/x.jsonl line 3 is not valid JSON: fix the line\n"


@pytest.mark.slow
def test_a_command_stopped_by_a_mistake_leaves_no_empty_run_folder(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    for args in (["llasmol.train", "data.micro_batch_size=3", "logger=csv"],
                 ["llasmol.evaluate", f"predictions={tmp_path / 'nope.jsonl'}"]):
        refused_cli(args, tmp_path, args[1].split("/")[-1])
    leftovers = [p for p in (tmp_path / "outputs").rglob("*") if p.is_file()] if (tmp_path / "outputs").exists() else []
    assert leftovers == []
    # The log that said why went with the folder; the console still says it.
    refused_cli(["llasmol.train", "data.micro_batch_size=3", "logger=csv"], tmp_path, "data.effective_batch_size=6")


def test_the_user_error_wrapper_passes_results_and_bugs_through_and_finds_a_wrapped_user_error(
        tmp_path, capsys, monkeypatch):
    import io
    import logging

    from llasmol.core.errors import (
        UserError,
        _cause_line,
        _find_user_error,
        report_user_errors,
    )

    @report_user_errors
    def add(x, y=1):
        """Adds."""
        return x + y

    assert add(2, y=3) == 5 and add.__name__ == "add" and add.__doc__ == "Adds."

    @report_user_errors
    def bug():
        raise ValueError("a bug: its traceback is wanted")

    with pytest.raises(ValueError):
        bug()

    @report_user_errors
    def wrapped():  # as Hydra's instantiate wraps what a constructor raises
        try:
            raise UserError("lora.r=0 must be at least 1: set lora.r=8")
        except UserError as err:
            raise RuntimeError("Error in call to target") from err

    @report_user_errors
    def during():  # raised while handling it: found through __context__
        try:
            raise UserError("data.path=/x does not exist: point it at SMolInstruct")
        except UserError:
            raise KeyError("cleanup failed")

    # The run's log file gets the line too; the console has it once, on stderr.
    log_file, console = tmp_path / "train.log", io.StringIO()
    handlers = [logging.FileHandler(log_file), logging.StreamHandler(console)]
    root = logging.getLogger()
    for handler in handlers:
        root.addHandler(handler)
    try:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
        for fn, line in [(wrapped, "lora.r=0 must be at least 1: set lora.r=8"),
                         (during, "data.path=/x does not exist: point it at SMolInstruct")]:
            with pytest.raises(SystemExit) as stop:
                fn()
            assert stop.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"
        monkeypatch.setenv("HYDRA_FULL_ERROR", "0")
        with pytest.raises(SystemExit):
            wrapped()
        monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # the traceback, as Hydra keeps its own
        with pytest.raises(RuntimeError):
            wrapped()
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
    assert log_file.read_text().splitlines() == ["error: lora.r=0 must be at least 1: set lora.r=8",
                                                 "error: data.path=/x does not exist: point it at SMolInstruct",
                                                 "error: lora.r=0 must be at least 1: set lora.r=8"]
    assert console.getvalue() == ""
    # A worker's folded traceback without a UserError in its last line: that last line.
    assert _cause_line("Traceback (most recent call last):\n  File x\nValueError: bad\n") == "ValueError: bad"
    assert _cause_line("one line, no traceback") == "one line, no traceback"
    a, b = ValueError("a"), ValueError("b")  # a cycle of contexts ends the search
    a.__context__, b.__context__ = b, a
    assert _find_user_error(a) is None


def _as_hydra_run(folder, overrides=()):
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hydra = OmegaConf.structured(HydraConf)
    hydra.runtime.output_dir, hydra.job.name, hydra.overrides.hydra = str(folder), "train", list(overrides)
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))


@pytest.mark.parametrize("named", [False, True])
def test_a_mistake_removes_the_run_folder_only_when_it_holds_nothing_but_hydras_files(tmp_path, capsys, monkeypatch,
                                                                                       named):
    from hydra.core.hydra_config import HydraConfig

    from llasmol.core.errors import UserError, report_user_errors

    @report_user_errors
    def job():
        raise UserError("model=x is not a choice")

    empty, kept = tmp_path / "2026-12-02" / "07-00-00", tmp_path / "2026-12-02" / "07-00-01"
    for folder in (empty, kept):
        (folder / ".hydra").mkdir(parents=True)
        (folder / "train.log").write_text("")
        (folder / ".lock").write_text("")
    for folder, answer in ((empty, ""), (kept, '{"output": "CCO"}\n')):  # a file opened, or one with an answer
        (folder / "predictions").mkdir()
        (folder / "predictions" / "dev.jsonl").write_text(answer)
    monkeypatch.chdir(tmp_path)
    # Hydra's log handler of the run folder, and another's: only the folder's is closed with it
    own, other = logging.FileHandler(empty / "train.log", delay=False), logging.FileHandler(tmp_path / "other.log")
    root = logging.getLogger()
    root.addHandler(own)
    root.addHandler(other)
    try:
        for folder in (empty, kept):
            _as_hydra_run(folder, [f"hydra.run.dir={folder}"] if named else [])
            with pytest.raises(SystemExit):
                job()
            for handler in (own, other):  # the command has ended: its handlers go with it
                root.removeHandler(handler)
        _as_hydra_run(tmp_path)  # generate runs in place: the working folder is never removed
        with pytest.raises(SystemExit):
            job()
    finally:
        HydraConfig.instance().cfg = None
        for handler in (own, other):
            root.removeHandler(handler)
    assert empty.exists() == named  # a folder the user named keeps its log
    assert kept.exists() and tmp_path.exists()
    assert (own.stream is None) == (not named) and other.stream is not None  # closed only with its folder
    other.close()
    own.close()
