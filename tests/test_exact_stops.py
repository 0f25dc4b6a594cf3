"""Ctrl-C in a GRPO run as Lightning delivers it (issue #67): a KeyboardInterrupt raised inside `trainer.fit` or
`trainer.validate` reaches `train` as the `SystemExit(1)` Lightning's own handler (`_call_and_handle_interrupt`)
raises from it, never as a bare KeyboardInterrupt. What the product promises then (llasmol/finetune/fit.py): exit
status 1, the W&B runs closed as stopped on purpose, and what is on disk; and while the last step is validated
after the fit, a line saying training is complete and saved. The KeyboardInterrupt is raised where a second
Ctrl-C ("stop at once", `StopAtStepBoundary`) lands: in the middle of the work, not at a step boundary, so no
interrupted.ckpt is written; the first Ctrl-C's own path (a step boundary) is tests/test_grpo_stage.py's."""

from __future__ import annotations

import logging
import signal

import pytest
import torch
from test_grpo_stage import GRPO

from llasmol.train import train


@pytest.fixture
def lightning_stops(monkeypatch):
    """W&B closings recorded; SIGINT's handler put back (Lightning's KeyboardInterrupt handler ignores SIGINT from
    then on, for the rest of the process)."""
    from llasmol.finetune import fit as fit_module

    closed = []
    monkeypatch.setattr(fit_module, "finish_wandb_runs", lambda trainer, stopped=False: closed.append(stopped))
    before = signal.getsignal(signal.SIGINT)
    yield closed
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_a_rollout_is_lightnings_exit_1_and_the_last_checkpoint_stays_the_steps_before(
        cfg_factory, tmp_path, monkeypatch, lightning_stops):
    from llasmol.finetune import rollouts

    sampler, calls = rollouts.sample_group, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # step 2's rollout
            raise KeyboardInterrupt
        return sampler(*args, **kwargs)

    monkeypatch.setattr(rollouts, "sample_group", interrupted)
    with pytest.raises(SystemExit) as stop:
        train(cfg_factory(*GRPO, "trainer.max_steps=3", "checkpoint_every_n_steps=1"))
    assert stop.value.code == 1 and isinstance(stop.value.__context__, KeyboardInterrupt)  # Lightning's sys.exit(1)
    assert lightning_stops == [True]  # closed as stopped, once
    checkpoints = tmp_path / "checkpoints"
    assert not (checkpoints / "interrupted.ckpt").exists()  # not at a step's end: nothing of step 2 is saved
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 1
    assert [p.name for p in sorted((tmp_path / "rollouts").iterdir())] == ["step1.jsonl"]
    assert not (tmp_path / "result.json").exists()


def test_ctrl_c_while_the_last_step_is_validated_says_training_is_saved_and_exits_1(
        cfg_factory, tmp_path, monkeypatch, lightning_stops, caplog):
    """The validation after the fit (val_every_n_steps does not divide max_steps): Lightning's trainer.validate
    turns the KeyboardInterrupt into SystemExit(1); the product says what was kept and exits 1 with W&B closed as
    stopped, and writes no result."""
    from llasmol.finetune import validation

    answered = []

    class Interrupted(validation.ModelAnswers):
        def answer(self, samples, advance=None):
            answered.append(1)
            raise KeyboardInterrupt

    monkeypatch.setattr(validation, "ModelAnswers", Interrupted)
    with caplog.at_level(logging.WARNING, logger="llasmol.train"), pytest.raises(SystemExit) as stop:
        train(cfg_factory(*GRPO, "trainer.max_steps=1"))
    assert stop.value.code == 1 and answered == [1]
    saved = tmp_path / "checkpoints" / "last.ckpt"
    assert (f"stopped (Ctrl-C) while validating the last step (1): training is complete and saved in {saved}; "
            "nothing of this validation was kept") in caplog.text
    assert torch.load(saved, weights_only=True)["global_step"] == 1
    assert lightning_stops == [True]
    assert not (tmp_path / "result.json").exists() and not (tmp_path / "metrics").exists()


def test_a_resumed_generations_progress_rate_counts_only_the_samples_of_this_process(monkeypatch, caplog):
    """A generation continued after a stop starts with 6 of 10 answered: its rate and time left are of the samples
    answered since it started (2 in 4 s of a fake clock), not of the 6 a stopped run kept."""
    from types import SimpleNamespace

    from llasmol.inference import progress

    readings = iter([100.0, 100.0, 102.0, 104.0, 104.0])  # start, first line, two advances, closing line
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: next(readings)))
    with caplog.at_level(logging.INFO, logger="llasmol.inference.progress"):
        with progress.generation_progress("Generating on test", 10, done=6, log_every_s=0) as advance:
            advance()
            advance()
    assert [r.getMessage() for r in caplog.records] == [
        "Generating on test: 6/10 samples (60%)",
        "Generating on test: 7/10 samples (70%), 0.50 samples/s, about 0m06s left",
        "Generating on test: 8/10 samples (80%), 0.50 samples/s, about 0m04s left",
        "Generating on test: 8/10 samples (80%), 0.50 samples/s, about 0m04s left"]


def test_a_real_sigterm_while_the_last_step_is_validated_exits_143_with_training_saved(
        cfg_factory, tmp_path, monkeypatch, lightning_stops, caplog):
    """A cluster's SIGTERM, sent to this process while the last step's validation generates: the product's handler
    turns it into Lightning's SIGTERMException, which Lightning's own `_call_and_handle_interrupt` re-raises; the run
    says training is saved and exits 143 (not Lightning's bare SystemExit, which is success), W&B closed as stopped."""
    import os

    from llasmol.finetune import validation

    before = signal.getsignal(signal.SIGTERM)

    class Terminated(validation.ModelAnswers):
        def answer(self, samples, advance=None):
            os.kill(os.getpid(), signal.SIGTERM)  # delivered here, in the main thread, to the handler then in place
            raise AssertionError("the SIGTERM did not stop the validation")

    monkeypatch.setattr(validation, "ModelAnswers", Terminated)
    with caplog.at_level(logging.WARNING, logger="llasmol.train"), pytest.raises(SystemExit) as stop:
        train(cfg_factory(*GRPO, "trainer.max_steps=1"))
    assert stop.value.code == 143 and signal.getsignal(signal.SIGTERM) == before  # the handler put back
    saved = tmp_path / "checkpoints" / "last.ckpt"
    assert (f"stopped (SIGTERM) while validating the last step (1): training is complete and saved in {saved}; "
            "nothing of this validation was kept") in caplog.text
    assert lightning_stops == [True] and not (tmp_path / "result.json").exists()
