"""Exact resume: optimizer, scheduler, step and data position continue as if the run had never stopped."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import HANG_TIMEOUT
from refusals import refused, run_cli

from llasmol.data.resumable_loader import ResumableDataLoader
from llasmol.data.sampler import ShardedShuffleSampler
from llasmol.finetune.resume import resolve_resume

TESTS = Path(__file__).resolve().parent


def _loader(n=50, batch=4, world=1, rank=0, lengths=None) -> ResumableDataLoader:
    sampler = ShardedShuffleSampler(n, seed=3, rank=rank, world_size=world, lengths=lengths, batch_size=batch)
    return ResumableDataLoader(list(range(n)), batch_size=batch, sampler=sampler)


class _Crafted:
    """Unpickling this creates a file: what a hostile checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("kind", ["weights_only_dict", "crafted_pickle", "text", "adapter_weights"])
def test_a_checkpoint_llasmol_train_did_not_write_is_named_and_never_run(tmp_path, kind):
    path, marker = tmp_path / "given.ckpt", tmp_path / "ran"
    if kind == "weights_only_dict":
        torch.save({"state_dict": {"w": torch.ones(2)}}, path)
    elif kind == "crafted_pickle":
        torch.save({"global_step": 3, "hook": _Crafted(marker)}, path)
    elif kind == "text":
        path.write_text("not a checkpoint")
    else:
        from safetensors.torch import save_file

        save_file({"w": torch.ones(2)}, str(path))
    with refused(f"ckpt_path={path}", "llasmol.train", *(["nothing in it was run"] if kind == "crafted_pickle" else []),
                 untouched=tmp_path) as seen:
        resolve_resume(str(path), tmp_path / "run", "tiny", "full")
    assert "weights_only=False" not in seen.message and not marker.exists()


@pytest.mark.parametrize("world", [1, 2])
def test_a_restored_loader_serves_the_rest_of_the_epoch_then_whole_epochs(world):
    import numpy as np

    lengths = np.random.default_rng(0).integers(5, 60, size=50)
    for rank in range(world):
        whole = _loader(world=world, rank=rank, lengths=lengths)
        whole.sampler.set_epoch(1)
        reference = [b.tolist() for b in whole]
        first = _loader(world=world, rank=rank, lengths=lengths)
        first.sampler.set_epoch(1)
        it = iter(first)
        seen = [next(it).tolist() for _ in range(3)]
        state = first.state_dict()
        assert state["batches"] == 3 and state["epoch"] == 1
        resumed = _loader(world=world, rank=rank, lengths=lengths)
        resumed.load_state_dict(state)
        resumed.sampler.set_epoch(1)
        assert len(resumed) == len(reference)  # the trainer still counts the whole epoch
        rest = [b.tolist() for b in resumed]
        assert seen + rest == reference
        assert resumed.state_dict()["batches"] == len(reference)
        # the skip applies once: the next epoch is whole and reshuffled
        resumed.sampler.set_epoch(2)
        nxt = [b.tolist() for b in resumed]
        assert len(nxt) == len(reference) and nxt != reference


def test_a_state_for_another_epoch_skips_nothing():
    loader = _loader()
    loader.load_state_dict({**_loader().state_dict(), "epoch": 0, "batches": 5})
    loader.sampler.set_epoch(1)
    assert sum(len(b) for b in loader) == 50


def test_changed_data_or_devices_cannot_resume_at_a_position():
    state = _loader(world=2).state_dict()
    with refused("world_size 2 -> 1"):
        _loader(world=1).load_state_dict(state)
    with refused("num_samples 50 -> 40"):
        _loader(n=40, world=2).load_state_dict(state)


# What check_training_checkpoint asks of a resumable checkpoint, and no more.
_TRAINING_STATE = {"pytorch-lightning_version": "2", "global_step": 3, "state_dict": {}, "optimizer_states": [],
                   "loops": {}}


def _run_dir(root: Path, name: str, model="tiny", lora="full", ckpts=("last.ckpt",)) -> Path:
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "params.json").write_text(json.dumps({"model": model, "lora": lora}))
    for i, c in enumerate(ckpts):
        torch.save(_TRAINING_STATE, run / "checkpoints" / c)
        os.utime(run / "checkpoints" / c, ns=(10**18 + i, 10**18 + i))
    return run


def test_ckpt_path_last_finds_this_run_then_the_newest_run_of_the_same_variant(tmp_path):
    older = _run_dir(tmp_path, "a")
    newer = _run_dir(tmp_path, "b", ckpts=("last.ckpt", "interrupted.ckpt"))
    other_variant = _run_dir(tmp_path, "c", lora="lite")
    os.utime(other_variant / "checkpoints" / "last.ckpt", ns=(2 * 10**18, 2 * 10**18))
    os.utime(older / "checkpoints" / "last.ckpt", ns=(10**17, 10**17))
    current = tmp_path / "now"
    current.mkdir()
    assert resolve_resume("last", current, "tiny", "full") == str(newer / "checkpoints" / "interrupted.ckpt")
    assert resolve_resume("last", older, "tiny", "full") == str(older / "checkpoints" / "last.ckpt")
    assert resolve_resume(str(older), current, "tiny", "full") == str(older / "checkpoints" / "last.ckpt")
    assert resolve_resume(None, current, "tiny", "full") is None
    assert resolve_resume("auto", current, "tiny", "full") is None  # nothing here yet: start fresh
    assert resolve_resume("auto", older, "tiny", "full") == str(older / "checkpoints" / "last.ckpt")
    with refused("ckpt_path=last", "checkpoints/last.ckpt", current, "tiny+attn"):
        resolve_resume("last", current, "tiny", "attn")
    with refused("ckpt_path=/nope/x.ckpt"):
        resolve_resume("/nope/x.ckpt", current, "tiny", "full")
    with refused(f"ckpt_path={current}", "checkpoints/last.ckpt"):
        resolve_resume(str(current), current, "tiny", "full")


def test_ckpt_path_last_passes_over_an_empty_or_truncated_checkpoint(tmp_path):
    """A zero-byte interrupted.ckpt dated in the future (a kill while the disk was full, a clock set wrong) next
    to a good last.ckpt: the good one is resumed, not a torch error; only broken ones is one line naming one."""
    run = _run_dir(tmp_path, "run", ckpts=("last.ckpt", "interrupted.ckpt"))
    good, broken = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "interrupted.ckpt"
    broken.write_bytes(b"")
    os.utime(broken, ns=(4 * 10**18, 4 * 10**18))
    for ckpt_path in ("last", "auto", str(run)):
        assert resolve_resume(ckpt_path, run, "tiny", "full") == str(good)
    other = tmp_path / "new"
    other.mkdir()
    assert resolve_resume("last", other, "tiny", "full") == str(good)  # from a sibling run too
    good.write_bytes(good.read_bytes()[:40])  # truncated
    for ckpt_path in ("last", "auto"):
        with refused(f"ckpt_path={good}", "llasmol.train", "torch.save"):
            resolve_resume(ckpt_path, run, "tiny", "full")
    with refused("ckpt_path=last", "checkpoints/last.ckpt", other):
        resolve_resume("last", other, "tiny", "full")  # a sibling's broken files are passed over


def test_the_resume_checkpoint_is_the_one_of_the_latest_step_whatever_the_files_dates(tmp_path):
    """A copied or rsynced run folder, or a clock set wrong, redates its files: an old-dated last.ckpt of step
    6 beside an interrupted.ckpt of step 4 written "later" is still the one resumed; at one step the stop's
    own interrupted.ckpt is (it knows whether a validation was due); a checkpoint whose step is no step is
    refused."""
    run = _run_dir(tmp_path, "run", ckpts=("last.ckpt", "interrupted.ckpt"))
    last, interrupted = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "interrupted.ckpt"
    torch.save({**_TRAINING_STATE, "global_step": 6}, last)
    torch.save({**_TRAINING_STATE, "global_step": 4}, interrupted)
    os.utime(last, ns=(10**17, 10**17))  # dated long before the other
    os.utime(interrupted, ns=(3 * 10**18, 3 * 10**18))
    for ckpt_path in ("last", "auto", str(run)):
        assert resolve_resume(ckpt_path, run, "tiny", "full") == str(last)
    torch.save({**_TRAINING_STATE, "global_step": 6}, interrupted)
    os.utime(interrupted, ns=(10**16, 10**16))
    assert resolve_resume("last", run, "tiny", "full") == str(interrupted)
    torch.save({**_TRAINING_STATE, "global_step": "6"}, last)
    with refused(f"ckpt_path={last}", "global_step"):
        resolve_resume(str(last), run, "tiny", "full")


def test_a_run_continued_in_place_from_another_checkpoint_drops_its_abandoned_interrupted_ckpt(tmp_path, caplog):
    """Resumed by hand from last.ckpt (step 4) while interrupted.ckpt holds step 6, the run abandons step 6:
    it is removed when the fit starts, so a later ckpt_path=last cannot go back to it; resumed from
    interrupted.ckpt itself, or from another folder, nothing is removed."""
    from types import SimpleNamespace

    from llasmol.finetune.resume import Resume

    run = _run_dir(tmp_path, "run", ckpts=("last.ckpt", "interrupted.ckpt"))
    last, interrupted = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "interrupted.ckpt"
    torch.save({**_TRAINING_STATE, "global_step": 6}, interrupted)
    (run / "checkpoints" / "interrupted.adapter").mkdir()
    rank0, rank1 = SimpleNamespace(is_global_zero=True), SimpleNamespace(is_global_zero=False)
    Resume(str(interrupted), run).on_fit_start(rank0, None)
    Resume(str(last), tmp_path / "elsewhere").on_fit_start(rank0, None)
    Resume(str(last), run).on_fit_start(rank1, None)
    assert interrupted.is_file()
    with caplog.at_level("WARNING", logger="llasmol.finetune.resume"):
        Resume(str(last), run).on_fit_start(rank0, None)
    assert not interrupted.exists() and not (run / "checkpoints" / "interrupted.adapter").exists()
    assert resolve_resume("last", run, "tiny", "full") == str(last)
    assert f"removed {interrupted}" in caplog.text


def test_a_lost_process_is_one_line_on_several_processes_and_any_other_error_is_raised(tmp_path, capsys):
    """`fit` on a survivor of a killed process: gloo's words or any torch.distributed error become one line with
    the step, the rank and the continuing command (from last.ckpt when there is one); on one process, or for
    another error, the error itself is raised."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from llasmol.finetune.fit import fit, peer_lost

    gloo = RuntimeError("[/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:30099. This is "
                        "typically caused by a remote worker crashing.")
    assert peer_lost(gloo) == "torch.distributed: Connection closed by peer"
    assert peer_lost(dist.DistBackendError("NCCL communicator was aborted on rank 1.\nmore")) == (
        "torch.distributed: NCCL communicator was aborted on rank 1.")
    assert peer_lost(RuntimeError("CUDA out of memory")) is None and peer_lost(ValueError("")) is None

    def trainer(error, world_size=2):
        def fails(*args, **kwargs):
            raise error
        return SimpleNamespace(fit=fails, world_size=world_size, global_step=4, global_rank=1,
                               default_root_dir=str(tmp_path), interrupted=False)

    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    with pytest.raises(SystemExit) as stop:
        fit(trainer(gloo), None, None, None)
    assert stop.value.code == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line.startswith("error: another of this run's 2 processes ended at step 4 (")
    assert "rank 1 cannot go on" in line and "continue from last.ckpt with: python -m llasmol.train" in line
    assert line.endswith(f"hydra.run.dir={tmp_path} ckpt_path=last")
    for error, world_size in ((gloo, 1), (RuntimeError("CUDA out of memory"), 2)):
        with pytest.raises(RuntimeError) as raised:
            fit(trainer(error, world_size), None, None, None)
        assert raised.value is error


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 1, "Ctrl-C")])
def test_a_signal_during_the_last_steps_validation_stops_it_at_once(tmp_path, caplog, monkeypatch, signum, code,
                                                                     said):
    """After the fit no step is left to finish: SIGTERM or Ctrl-C while the last step is validated stops at once
    (a validation generating for minutes went on after a SIGTERM), with its exit status, a line saying training is
    complete and saved, W&B closed as stopped, and the signal handlers as they were."""
    from types import SimpleNamespace

    from llasmol.finetune import fit as fit_module

    closed = []
    monkeypatch.setattr(fit_module, "finish_wandb_runs", lambda trainer, stopped=False: closed.append(stopped))
    generated = []

    def validate(module, datamodule=None, verbose=None):
        os.kill(os.getpid(), signum)
        for _ in range(300):  # a long generation: 30 s unless stopped
            generated.append(1)
            time.sleep(0.1)

    trainer = SimpleNamespace(validate=validate, global_step=5, default_root_dir=str(tmp_path), loggers=[])
    module = SimpleNamespace(last_validated_step=4)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with caplog.at_level("WARNING", logger="llasmol.train"), pytest.raises(SystemExit) as stop:
        fit_module.validate_last_step(trainer, module, None, 4)
    assert stop.value.code == code and len(generated) <= 2 and closed == [True]
    assert f"stopped ({said}) while validating the last step (5): training is complete and saved in" in caplog.text
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_checkpoint_resumes_only_on_the_number_of_processes_and_the_kind_of_trainer_it_was_saved_from(tmp_path):
    from llasmol.finetune.resume import check_same_launch, checkpoint_launch

    path = tmp_path / "last.ckpt"
    torch.save({**_TRAINING_STATE, "SMolInstructDataModule": {"train_position": {"world_size": 4, "batches": 3}},
                "llasmol_fsdp2": True}, path)
    assert checkpoint_launch(str(path)) == (4, True)
    check_same_launch(str(path), 4, sharded=True)
    with refused(f"ckpt_path={path}", "4 process(es)", "has 2"):
        check_same_launch(str(path), 2, sharded=True)
    with refused(f"ckpt_path={path}", "saved under trainer=fsdp", "resume with the trainer=fsdp"):
        check_same_launch(str(path), 4, sharded=False)  # trainer=fsdp keys its optimizer state otherwise than DDP
    torch.save(_TRAINING_STATE, path)  # saved before the first batch, by an earlier version: nothing to continue
    assert checkpoint_launch(str(path)) == (None, False)
    check_same_launch(str(path), 2, sharded=False)
    with refused(f"ckpt_path={path}", "run is under trainer=fsdp"):
        check_same_launch(str(path), 2, sharded=True)


def test_the_resume_plan_meets_the_trainer_in_one_seam(tmp_path):
    """`Resume.trainer` is the one place a plan reaches the trainer: the W&B settings are in the logger config
    before the trainer is made, the plan is among its callbacks, the CSV logger keeps the rows up to the
    checkpoint's step, and after the fit (rank 0 only) the stale interrupted.ckpt goes with its adapter."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from llasmol.core import run_dir as layout
    from llasmol.finetune.resume import Resume
    from llasmol.finetune.tracking import KeepingCSVLogger

    run = _run_dir(tmp_path, "run", ckpts=("last.ckpt", "interrupted.ckpt"))
    (run / "checkpoints" / "interrupted.adapter").mkdir()
    (run / layout.WANDB_ID).write_text("abc123\n")
    logger_cfg = OmegaConf.create({"wandb": {"_target_": "llasmol.finetune.tracking.WandbLogger"},
                                   "csv": {"_target_": "llasmol.finetune.tracking.KeepingCSVLogger"},
                                   "off": None})  # a logger switched off on the command line (logger.x=null)
    seen = {}

    def make(callbacks):
        seen.update(callbacks=callbacks, wandb=OmegaConf.to_container(logger_cfg.wandb),
                    csv=OmegaConf.to_container(logger_cfg.csv))
        return SimpleNamespace(loggers=[KeepingCSVLogger(str(run))], is_global_zero=True, world_size=1)

    plan = Resume.plan("last", run, "tiny", "full")
    trainer = plan.trainer(make, logger_cfg)
    assert seen["callbacks"] == [plan] and seen["wandb"]["id"] == "abc123" and seen["wandb"]["resume"] == "allow"
    assert seen["csv"] == {"_target_": "llasmol.finetune.tracking.KeepingCSVLogger"}  # W&B's settings stay W&B's
    assert trainer.loggers[0].keep_until_step == _TRAINING_STATE["global_step"]
    plan.on_fit_end(SimpleNamespace(is_global_zero=False), None)
    assert (run / "checkpoints" / "interrupted.ckpt").is_file()  # other ranks leave the files to rank 0
    plan.on_fit_end(trainer, None)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    torch.save(_TRAINING_STATE, run / "checkpoints" / "interrupted.ckpt")  # one without its adapter goes too
    plan.on_fit_end(trainer, None)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]

    fresh = Resume.plan(str(run), tmp_path / "elsewhere", "tiny", "full")  # resumed from another directory
    other_cfg = OmegaConf.create({"wandb": {"_target_": "llasmol.finetune.tracking.WandbLogger"}})
    trainer = fresh.trainer(lambda callbacks: SimpleNamespace(loggers=[KeepingCSVLogger(str(tmp_path))],
                                                              is_global_zero=True, world_size=1), other_cfg)
    assert "id" not in other_cfg.wandb and trainer.loggers[0].keep_until_step is None


def test_only_the_resume_seam_sets_what_a_resumed_run_continues():
    """Nothing but `llasmol/finetune/resume.py` sets the CSV logger's kept step or names the W&B id file."""
    import ast

    package = TESTS.parent / "llasmol"
    for path in package.rglob("*.py"):
        if path.name == "resume.py" or path.parent.name == "core":
            continue
        tree = ast.parse(path.read_text())
        stores = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "keep_until_step"
                  and isinstance(n.ctx, ast.Store)]
        names = [n for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute, ast.alias))
                 and "WANDB_ID" in (getattr(n, "id", None), getattr(n, "attr", None), getattr(n, "name", None))]
        assert not stores and not names, path


# Two tasks × 48 training samples, micro-batch 4, accumulation 2: 12 optimizer steps an epoch, 2 epochs;
# the resume checkpoint every 3 steps; validation (no generation) once, mid-run.
RUN = ["data.tasks=[name_conversion-s2f,property_prediction-esol]", "data.max_samples_per_task={train:48}",
       "data.micro_batch_size=4", "data.effective_batch_size=8", "trainer.max_epochs=2",
       "scheduler.num_warmup_steps=4", "checkpoint_every_n_steps=3", "val_every_n_steps=10",
       "callbacks.generation_evaluator.samples_per_task=0", "trainer.log_every_n_steps=1",
       "trainer.enable_progress_bar=false", "logger=csv", "+callbacks.recorder._target_=resume_probe.StepRecorder"]


def _records(path: Path, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in Path(f"{path}.{rank}").read_text().splitlines()]


def _start(run: Path, args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # A session of its own, so the kill takes every process of the run (DDP starts one per device).
    return subprocess.Popen([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={run}", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _kill_after(proc: subprocess.Popen, log: Path, records: int) -> None:
    """SIGKILL the whole run once rank 0 has logged `records` micro-batches."""
    deadline = time.time() + HANG_TIMEOUT
    rank0 = Path(f"{log}.0")
    while time.time() < deadline and proc.poll() is None:
        if rank0.is_file() and len(rank0.read_text().splitlines()) >= records:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _logged_steps(run: Path) -> list[tuple[int, float]]:
    """(step, train/loss) of every training row of the run's csv/metrics.csv, in file order."""
    with (run / "csv" / "metrics.csv").open(newline="") as fh:
        return [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(fh) if r.get("train/loss")]


def _assert_same_training(combined: dict[int, list[dict]], expected: dict[int, list[dict]], per_epoch: int) -> None:
    for rank, records in expected.items():
        got = combined[rank]
        assert [(r["step"], r["batch_idx"]) for r in got] == [(r["step"], r["batch_idx"]) for r in records]
        assert [r["lr"] for r in got] == pytest.approx([r["lr"] for r in records], rel=1e-12)
        for epoch in (0, 1):
            seen = [i for r in got if r["epoch"] == epoch for i in r["indices"]]
            assert sorted(seen) == sorted(i for r in records if r["epoch"] == epoch for i in r["indices"])
            assert len(seen) == len(set(seen)) == per_epoch  # every sample of the share once, none twice
        # Same adapters, optimizer state and dropout draws: the losses after the restart are those of the
        # uninterrupted run.
        assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in records], rel=1e-5)


def _reference_run(root: Path, run: list[str], steps: int) -> Path:
    """An uninterrupted run (its result and step records in `root`) that interrupted ones are compared with."""
    from conftest import compose_config

    from llasmol.train import train

    result = train(compose_config([*run, f"paths.output_dir={root / 'run'}",
                                   f"+callbacks.recorder.path={root / 'reference.jsonl'}"]))
    assert result["global_step"] == steps
    (root / "result.json").write_text(json.dumps(result))
    return root


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run every interrupted one is compared with, step by step."""
    return _reference_run(tmp_path_factory.mktemp("reference"), RUN, 24)


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_exactly(tmp_path, cfg_factory, reference):
    from llasmol.train import train

    run, killed_log = tmp_path / "run", tmp_path / "killed.jsonl"
    # Killed (no chance to clean up) in the first epoch, some micro-batches after a resume checkpoint.
    _kill_after(_start(run, [*RUN, f"+callbacks.recorder.path={killed_log}"], tmp_path), killed_log, 15)
    killed = _records(killed_log)
    saved_step = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 3 <= saved_step < 12 and saved_step % 3 == 0
    assert killed[-1]["step"] > saved_step  # work after the checkpoint was lost and must be redone
    assert not (run / "checkpoints" / "interrupted.ckpt").exists()  # a kill leaves no chance to write one

    # Restart in place: `ckpt_path=last` finds the run's own last.ckpt.
    resumed_log = tmp_path / "resumed.jsonl"
    resumed = train(cfg_factory(*RUN, f"paths.output_dir={run}", "ckpt_path=last",
                                f"+callbacks.recorder.path={resumed_log}"))
    assert resumed["resumed_from"] == str(run / "checkpoints" / "last.ckpt")
    expected = json.loads((reference / "result.json").read_text())
    assert resumed["global_step"] == expected["global_step"]
    combined = [r for r in killed if r["step"] < saved_step] + _records(resumed_log)
    _assert_same_training({0: combined}, {0: _records(reference / "reference.jsonl")}, per_epoch=96)
    assert resumed["metrics"]["val/loss"] == pytest.approx(expected["metrics"]["val/loss"], rel=1e-5)
    # The CSV keeps the killed run's rows up to the checkpoint's step (numbered by steps completed: the row of
    # step saved_step is the checkpoint's own work) and drops the ones the resumed run redid.
    assert [s for s, _ in _logged_steps(run)] == [s for s, _ in _logged_steps(reference / "run")] == list(range(1, 25))


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 1), (signal.SIGTERM, 143)])
def test_a_run_stopped_by_ctrl_c_or_sigterm_resumes_exactly_from_interrupted_ckpt(
        tmp_path, cfg_factory, reference, sig, code):
    """The stop waits for the end of the optimizer step in progress, so interrupted.ckpt continues every loss
    and learning rate of the uninterrupted run (stopped mid-accumulation, the schedule fell a step behind)."""
    from llasmol.train import train

    run, stopped_log = tmp_path / "run", tmp_path / "stopped.jsonl"
    proc = _start(run, [*RUN, f"+callbacks.recorder.path={stopped_log}"], tmp_path)
    deadline = time.time() + HANG_TIMEOUT
    rank0 = Path(f"{stopped_log}.0")
    while time.time() < deadline and proc.poll() is None and not (
            rank0.is_file() and len(rank0.read_text().splitlines()) >= 7):
        time.sleep(0.02)
    proc.send_signal(sig)  # odd micro-batch count: most likely mid-step (accumulation 2)
    _, err = proc.communicate(timeout=HANG_TIMEOUT)
    assert proc.returncode == code, err[-2000:]
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    saved_step = state["global_step"]
    stopped = _records(stopped_log)
    assert 1 <= saved_step < 12
    assert [r["step"] for r in stopped][-1] == saved_step - 1  # nothing after the checkpoint to redo
    said = (run / "train.log").read_text()
    assert "stopping at the end of this optimizer step" in said
    assert f"hydra.run.dir={run} ckpt_path=last" in said  # how to continue, with the run's own overrides
    assert "+callbacks.recorder.path=" in said

    resumed_log = tmp_path / "resumed.jsonl"
    resumed = train(cfg_factory(*RUN, f"paths.output_dir={run}", "ckpt_path=last",
                                f"+callbacks.recorder.path={resumed_log}"))
    assert resumed["resumed_from"] == str(ckpt)  # the newest checkpoint
    _assert_same_training({0: stopped + _records(resumed_log)}, {0: _records(reference / "reference.jsonl")},
                          per_epoch=96)
    expected = json.loads((reference / "result.json").read_text())
    assert resumed["metrics"]["val/loss"] == pytest.approx(expected["metrics"]["val/loss"], rel=1e-5)
    assert [s for s, _ in _logged_steps(run)] == list(range(1, 25))  # every step's row once
    # Finished, the run's interrupted.ckpt is stale: a later ckpt_path=last must not go back to it.
    assert not ckpt.exists() and not ckpt.with_suffix(".adapter").exists()


# The same data with accumulation 4 (micro-batch 4, effective batch 16): 6 optimizer steps an epoch.
RUN_ACC4 = [*[o for o in RUN if not o.startswith("data.effective_batch_size=")], "data.effective_batch_size=16"]


@pytest.fixture(scope="module")
def reference_acc4(tmp_path_factory) -> Path:
    return _reference_run(tmp_path_factory.mktemp("reference_acc4"), RUN_ACC4, 12)


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [("SIGINT", 1), ("SIGTERM", 143)])
def test_a_signal_between_micro_batches_stops_at_the_step_boundary_and_resumes_exactly(
        tmp_path, cfg_factory, reference_acc4, sig, code):
    """Ctrl-C or SIGTERM after the first of step 5's four micro-batches: the run still does the other three
    and the optimizer step, then stops, and the resumed run is the uninterrupted one."""
    from llasmol.train import train

    run, stopped_log = tmp_path / "run", tmp_path / "stopped.jsonl"
    probe = ["+callbacks.signal._target_=resume_probe.SignalAt", f"+callbacks.signal.signal={sig}",
             "+callbacks.signal.step=4", "+callbacks.signal.micro_batch=1"]
    proc = _start(run, [*RUN_ACC4, f"+callbacks.recorder.path={stopped_log}", *probe], tmp_path)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == code, err[-2000:]
    state = torch.load(run / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=False)
    stopped = _records(stopped_log)
    # Steps 0-4 complete, 4 micro-batches each: none half done, none begun after.
    assert state["global_step"] == 5
    assert [(r["step"], r["batch_idx"]) for r in stopped] == [(i // 4, i) for i in range(20)]

    resumed_log = tmp_path / "resumed.jsonl"
    resumed = train(cfg_factory(*RUN_ACC4, f"paths.output_dir={run}", "ckpt_path=last",
                                f"+callbacks.recorder.path={resumed_log}"))
    assert _records(resumed_log)[0]["batch_idx"] == 20  # the epoch continues at the next micro-batch
    _assert_same_training({0: stopped + _records(resumed_log)},
                          {0: _records(reference_acc4 / "reference.jsonl")}, per_epoch=96)
    expected = json.loads((reference_acc4 / "result.json").read_text())
    assert resumed["global_step"] == 12
    # Every step's row once, the one of the step the stop waited for included (it was lost, #27).
    logged, reference_logged = _logged_steps(run), _logged_steps(reference_acc4 / "run")
    assert [s for s, _ in logged] == [s for s, _ in reference_logged] == list(range(1, 13))
    assert [loss for _, loss in logged] == pytest.approx([loss for _, loss in reference_logged], rel=1e-5)
    assert resumed["metrics"]["val/loss"] == pytest.approx(expected["metrics"]["val/loss"], rel=1e-5)


@pytest.mark.slow
def test_a_two_process_ddp_run_killed_mid_epoch_resumes_exactly(tmp_path):
    """Both ranks continue at their own place in their own share of the epoch."""
    # 192 samples: 12 steps an epoch of micro-batch 4 × accumulation 2 × 2 processes.
    ddp = [a.replace("{train:48}", "{train:96}") for a in RUN] + [
        "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.effective_batch_size=16"]

    def run_to_end(run: Path, log: Path, *extra: str) -> None:
        proc = _start(run, [*ddp, f"+callbacks.recorder.path={log}", *extra], tmp_path)
        assert proc.wait(timeout=HANG_TIMEOUT) == 0, proc.stderr.read()[-3000:]

    run_to_end(tmp_path / "reference", tmp_path / "reference.jsonl")
    run, killed_log = tmp_path / "run", tmp_path / "killed.jsonl"
    _kill_after(_start(run, [*ddp, f"+callbacks.recorder.path={killed_log}"], tmp_path), killed_log, 2 * 8)
    saved_step = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 3 <= saved_step < 12 and saved_step % 3 == 0
    run_to_end(run, tmp_path / "resumed.jsonl", "ckpt_path=last")

    expected = {rank: _records(tmp_path / "reference.jsonl", rank) for rank in (0, 1)}
    assert expected[0][-1]["step"] == 23
    combined = {rank: [r for r in _records(killed_log, rank) if r["step"] < saved_step]
                + _records(tmp_path / "resumed.jsonl", rank) for rank in (0, 1)}
    _assert_same_training(combined, expected, per_epoch=96)
    shares = [{i for r in expected[rank] if r["epoch"] == 0 for i in r["indices"]} for rank in (0, 1)]
    assert not shares[0] & shares[1]  # the ranks' shares are disjoint


@pytest.mark.slow
def test_resuming_another_lora_variant_stops_in_one_line(tmp_path, cfg_factory):
    from llasmol.train import train

    quick = ["trainer.max_steps=2", "val_every_n_steps=100", "callbacks.generation_evaluator.samples_per_task=0",
             "trainer.enable_progress_bar=false", "data.max_samples_per_task={train:16}"]
    train(cfg_factory(*quick, f"paths.output_dir={tmp_path / 'full'}"))
    ckpt = tmp_path / "full" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    with refused("adapters", "model=", "lora="):
        train(cfg_factory(*quick, "lora=lite", f"ckpt_path={ckpt}", f"paths.output_dir={tmp_path / 'lite'}"))


@pytest.mark.filterwarnings("ignore:Experiment logs directory")  # Lightning's, for the fresh start's old file
@pytest.mark.parametrize("keep_until", [None, 4])
def test_a_run_resumed_in_place_keeps_its_csv_rows_up_to_the_checkpoints_step(tmp_path, keep_until):
    """Rows are numbered by the optimizer steps completed: those up to the checkpoint's step (its loss, its
    validation) stay, later ones are dropped, as they are redone; a fresh start begins a new file."""
    from llasmol.finetune.tracking import KeepingCSVLogger

    logger = KeepingCSVLogger(str(tmp_path), name="csv", version="")
    logger.keep_until_step = keep_until
    path = Path(logger.log_dir) / "metrics.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("epoch,step,train/loss,val/loss\n0,3,2.5,\n0,4,2.25,\n0,4,,2.0\n0,5,2.0,\n,,,\n")
    logger.log_metrics({"train/loss": 1.5, "epoch": 0}, step=5)
    logger.save()
    rows = list(csv.DictReader(path.open()))
    kept = [] if keep_until is None else [("3", "2.5", ""), ("4", "2.25", ""), ("4", "", "2.0")]
    assert [(r["step"], r["train/loss"], r.get("val/loss", "")) for r in rows] == [*kept, ("5", "1.5", "")]
    if keep_until is not None:
        assert list(rows[0]) == ["epoch", "step", "train/loss", "val/loss"]  # the earlier columns, in order


def _stopping_trainer(raised: BaseException, interrupted: bool):
    from types import SimpleNamespace

    calls = []

    def fit(module, datamodule=None, ckpt_path=None, weights_only=None):
        calls.append({"ckpt_path": ckpt_path, "weights_only": weights_only})
        raise raised

    return SimpleNamespace(fit=fit, interrupted=interrupted, loggers=[], world_size=1), calls


def _keyboard_exit() -> SystemExit:
    """What Lightning raises for Ctrl-C: sys.exit(1) inside its KeyboardInterrupt handler."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemExit(1)
    except SystemExit as stop:
        return stop


@pytest.mark.parametrize("case", ["sigterm", "ctrl_c", "other_exit", "error"])
def test_a_fit_stopped_on_purpose_exits_with_its_status_and_closes_wandb_as_stopped(case, monkeypatch):
    """SIGTERM: exit status 143 (Lightning's own is a SystemExit without a code, i.e. success); Ctrl-C: 1. Both
    close W&B as stopped; any other end of the fit passes through untouched, W&B left to the caller."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.finetune import fit as fit_module

    closed = []
    monkeypatch.setattr(fit_module, "finish_wandb_runs", lambda trainer, stopped=False: closed.append(stopped))
    raised = {"sigterm": SIGTERMException(), "ctrl_c": _keyboard_exit(), "other_exit": SystemExit(3),
              "error": RuntimeError("out of memory")}[case]
    # (an exit during a fit Lightning marks interrupted is Ctrl-C's only with the KeyboardInterrupt behind it)
    trainer, calls = _stopping_trainer(raised, interrupted=case in ("ctrl_c", "other_exit"))
    with pytest.raises(BaseException) as stop:
        fit_module.fit(trainer, object(), object(), "/runs/x/checkpoints/last.ckpt")
    assert calls == [{"ckpt_path": "/runs/x/checkpoints/last.ckpt", "weights_only": True}]
    expected = {"sigterm": (SystemExit, 143), "ctrl_c": (SystemExit, 1), "other_exit": (SystemExit, 3),
                "error": (RuntimeError, None)}[case]
    assert type(stop.value) is expected[0] and getattr(stop.value, "code", None) == expected[1]
    assert closed == ([True] if case in ("sigterm", "ctrl_c") else [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_between_micro_batches_waits_for_the_optimizer_step_and_a_second_one_stops_at_once(
        signum, monkeypatch):
    """The stop rides on the optimizer step: a micro-batch after which the step count has not moved (gradient
    accumulation under way) goes on; the first batch that completes a step raises, marked as a stop at a step
    boundary, after logging that step's row. A second signal stops at once. Either way the handlers before the
    run are back. (The slow tests interrupt real runs and compare the resumed one with an uninterrupted one.)"""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.finetune import resume

    logged = []
    monkeypatch.setattr(resume, "log_step_row_now", lambda trainer, *args: logged.append(trainer.global_step))
    before = {sig: signal.getsignal(sig) for sig in resume.StopAtStepBoundary.SIGNALS}
    stopper = resume.StopAtStepBoundary()
    trainer = SimpleNamespace(global_step=6, world_size=1, fit_loop=SimpleNamespace(_data_fetcher=None))
    expected = KeyboardInterrupt if signum == signal.SIGINT else SIGTERMException
    stopper.on_train_start(trainer, None)
    try:
        assert signal.getsignal(signum) == stopper._handle
        stopper.on_train_batch_start(trainer, None, None, 12)
        signal.raise_signal(signum)  # while micro-batch 12 of step 7 runs
        stopper.on_train_batch_end(trainer, None, None, None, 12)  # no optimizer step yet: training goes on
        stopper.on_train_batch_start(trainer, None, None, 13)
        trainer.global_step = 7  # micro-batch 13 completes step 7
        with pytest.raises(expected) as stop:
            stopper.on_train_batch_end(trainer, None, None, None, 13)
        assert stop.value.at_step_boundary is True and logged == [7]
        assert {sig: signal.getsignal(sig) for sig in before} == before
        # A second signal before the step ends: at once, without a step-boundary checkpoint.
        stopper = resume.StopAtStepBoundary()
        stopper.on_train_start(trainer, None)
        signal.raise_signal(signum)
        with pytest.raises(expected) as stop:
            signal.raise_signal(signum)
        assert not getattr(stop.value, "at_step_boundary", False)
        assert {sig: signal.getsignal(sig) for sig in before} == before
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_only_a_single_process_fits_validation_stops_at_a_signal_and_only_while_it_runs():
    """The stop at once holds from the start to the end of a validation of the fit: after it, during the sanity
    check, in `trainer.validate`, or under DDP (a rank stopping alone would strand the others in the gathers), a
    signal waits for the step's end."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.finetune import resume

    def trainer(fn="fit", sanity=False, world=1):
        return SimpleNamespace(global_step=4, world_size=world, sanity_checking=sanity, state=SimpleNamespace(fn=fn))

    before = {sig: signal.getsignal(sig) for sig in resume.StopAtStepBoundary.SIGNALS}
    try:
        for waits in (trainer(sanity=True), trainer(fn="validate"), trainer(world=2)):
            stopper = resume.StopAtStepBoundary()
            stopper.on_train_start(waits, None)
            stopper.on_validation_start(waits, None)
            signal.raise_signal(signal.SIGTERM)  # noted, not raised
            assert stopper._requested == signal.SIGTERM and stopper._validation_due is False
            stopper._restore()
        stopper = resume.StopAtStepBoundary()
        stopper.on_train_start(trainer(), None)
        stopper.on_validation_start(trainer(), None)
        stopper.on_validation_end(trainer(), None)
        signal.raise_signal(signal.SIGTERM)  # after the validation: the next step's end
        assert stopper._requested == signal.SIGTERM
        stopper._restore()
        stopper = resume.StopAtStepBoundary()
        stopper.on_train_start(trainer(), None)
        stopper.on_validation_start(trainer(), None)
        with pytest.raises(SIGTERMException) as stop:
            signal.raise_signal(signal.SIGTERM)
        assert stop.value.at_step_boundary is True and stopper.state_dict() == {"validation_due": True}
        assert {sig: signal.getsignal(sig) for sig in before} == before
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_the_resume_command_repeats_the_runs_settings_but_its_folder_and_checkpoint(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from llasmol.core.config import CONFIG_DIR
    from llasmol.finetune.resume import resume_command

    run = tmp_path / "a run"
    assert resume_command(run) == f"python -m llasmol.train 'hydra.run.dir={run}' ckpt_path=last"  # no Hydra
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="train"):
            cfg = compose("train", overrides=["lora=attn", "ckpt_path=auto", "paths.output_dir=/x",
                                              "data.max_samples_per_task={train:8}"], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        assert resume_command(run) == (f"python -m llasmol.train lora=attn 'data.max_samples_per_task={{train:8}}' "
                                       f"'hydra.run.dir={run}' ckpt_path=last")
    finally:
        HydraConfig.instance().cfg = None


def test_a_ckpt_file_given_is_resumed_as_it_is_and_a_run_without_params_is_no_sibling(tmp_path):
    run = _run_dir(tmp_path, "run")
    ckpt = run / "checkpoints" / "last.ckpt"
    here = tmp_path / "here"
    here.mkdir()
    assert resolve_resume(str(ckpt), here, "tiny", "full") == str(ckpt)
    # A sibling that recorded no params.json (or an unreadable one) cannot be told to be of this variant.
    for params in (None, "{not json"):
        if params is None:
            (run / "params.json").unlink()
        else:
            (run / "params.json").write_text(params)
        with refused("ckpt_path=last", "checkpoints/last.ckpt", here):
            resolve_resume("last", here, "tiny", "full")


def test_a_run_remembers_its_wandb_id_on_rank_0_for_a_later_resume_in_place(tmp_path):
    from types import SimpleNamespace

    from llasmol.core import run_dir as layout
    from llasmol.finetune.resume import Resume
    from llasmol.finetune.tracking import WandbLogger

    wandb = WandbLogger(project="p", offline=True, save_dir=str(tmp_path))
    wandb._experiment = SimpleNamespace(id="run42")
    plan = Resume(None, tmp_path)
    plan.trainer(lambda callbacks: SimpleNamespace(loggers=[wandb], is_global_zero=False), None)
    assert not (tmp_path / layout.WANDB_ID).exists()  # other ranks write nothing
    plan.trainer(lambda callbacks: SimpleNamespace(loggers=[wandb], is_global_zero=True), None)
    assert (tmp_path / layout.WANDB_ID).read_text() == "run42\n"


def test_random_draws_are_a_function_of_seed_epoch_batch_and_rank_only():
    from types import SimpleNamespace

    from llasmol.finetune.resume import StepSeeding

    def draw(seed=1, epoch=0, batch=2, rank=0):
        torch.manual_seed(999)  # whatever the run drew before
        StepSeeding(seed).on_train_batch_start(SimpleNamespace(current_epoch=epoch, global_rank=rank), None, None, batch)
        return torch.rand(3).tolist()

    assert draw() == draw()  # a resumed run draws what the uninterrupted one did
    assert len({tuple(draw(**change)) for change in ({}, {"seed": 2}, {"epoch": 1}, {"batch": 3}, {"rank": 1})}) == 5


def test_under_ddp_any_ranks_signal_stops_every_rank_and_an_exception_restores_the_handlers(monkeypatch):
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.finetune import resume

    monkeypatch.setattr(resume, "log_step_row_now", lambda *args: None)
    asked = []

    def trainer(others_asked: float):
        def reduce(flag, reduce_op):
            asked.append((float(flag), reduce_op))
            return torch.tensor(max(float(flag), others_asked))
        return SimpleNamespace(global_step=4, world_size=2, strategy=SimpleNamespace(reduce=reduce),
                               fit_loop=SimpleNamespace(_data_fetcher=None))

    module = SimpleNamespace(device="cpu")
    stopper = resume.StopAtStepBoundary()
    stopper.on_train_batch_start(trainer(0.0), module, None, 0)
    stopper.on_train_batch_end(SimpleNamespace(**{**vars(trainer(0.0)), "global_step": 5}), module, None, None, 0)
    assert asked == [(0.0, "max")]  # nobody asked: on
    with pytest.raises(SIGTERMException) as stop:  # rank 1 got SIGTERM (15), this one nothing
        stopper.on_train_batch_end(SimpleNamespace(**{**vars(trainer(15.0)), "global_step": 6}), module, None, None, 0)
    assert stop.value.at_step_boundary is True

    before = {sig: signal.getsignal(sig) for sig in resume.StopAtStepBoundary.SIGNALS}
    stopper = resume.StopAtStepBoundary()
    try:
        stopper.on_train_start(None, None)
        assert signal.getsignal(signal.SIGTERM) == stopper._handle
        stopper.on_exception(None, None, RuntimeError("boom"))
        assert {sig: signal.getsignal(sig) for sig in before} == before
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 1), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_saves_a_checkpoint_that_resumes(tmp_path, cfg_factory, sig, code):
    """Ctrl-C, or SIGTERM as a cluster sends before it preempts a job: a resumable checkpoint and a
    failing exit status (Lightning's own SIGTERM exit is 0, which a scheduler reads as done). Stopped in the
    first job of a multirun, the command also says how to run the jobs that had not started (#28 item 8)."""
    sweep = tmp_path / "sweep"
    run = sweep / "0_tiny_full"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llasmol.train", "--multirun", "lora=full,lite,attn", f"hydra.sweep.dir={sweep}",
         "trainer.max_steps=100000", "val_every_n_steps=1000", "logger=csv", "trainer.enable_progress_bar=false",
         "trainer.log_every_n_steps=1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    metrics = run / "csv" / "metrics.csv"
    deadline = time.time() + HANG_TIMEOUT
    while time.time() < deadline and (not metrics.is_file() or len(metrics.read_text().splitlines()) < 4):
        time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=HANG_TIMEOUT)
    assert proc.returncode == code, err[-2000:]
    ckpt = run / "checkpoints" / "interrupted.ckpt"
    assert ckpt.is_file(), err[-2000:]
    given = "trainer.max_steps=100000 val_every_n_steps=1000 logger=csv trainer.enable_progress_bar=false " \
            "trainer.log_every_n_steps=1"
    assert err.rstrip().splitlines()[-3:] == [  # the jobs' own lines go to their train.log only
        "multirun stopped in job 0",
        f"  continue it with: python -m llasmol.train lora=full {given} hydra.run.dir={run} ckpt_path=last",
        "  the jobs that had not started run into the same folder with: python -m llasmol.train --multirun "
        f"lora=lite,attn {given} hydra.sweep.dir={sweep.resolve()} first_job=1"], err[-2000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0_tiny_full"]  # nothing else started
    assert (run / "checkpoints" / "interrupted.adapter" / "adapter_model.safetensors").is_file()
    step = torch.load(ckpt, map_location="cpu", weights_only=False)["global_step"]
    assert step >= 1
    from llasmol.train import train

    resumed = train(cfg_factory(f"ckpt_path={ckpt}", f"trainer.max_steps={step + 2}", "val_every_n_steps=1000",
                                "trainer.enable_progress_bar=false"))
    assert resumed["global_step"] == step + 2


def test_training_checkpoints_go_through_the_atomic_writer(cfg_factory, monkeypatch, caplog):
    from llasmol.finetune.checkpointing import AtomicCheckpointIO
    from llasmol.train import train

    caplog.set_level(logging.INFO)
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)  # an earlier run in this process set it: this one must
    written = []
    original = AtomicCheckpointIO.save_checkpoint
    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint",
                        lambda self, ckpt, path, storage_options=None: (written.append(Path(path).name),
                                                                         original(self, ckpt, path))[1])
    result = train(cfg_factory("trainer.max_steps=3", "val_every_n_steps=3", "trainer.enable_progress_bar=false",
                               "checkpoint_every_n_steps=2",
                               "callbacks.generation_evaluator.samples_per_task=1", "generation.max_new_tokens_limit=2",
                               "data.max_samples_per_task={validation:2}"))
    # last.ckpt every checkpoint_every_n_steps (2) and at the last step (3), the best checkpoint once (its validation).
    assert written.count("last.ckpt") == 2 and len([name for name in written if name.startswith("step")]) == 1, written
    # What train.log says of the run's shape: the threads and how they wait, the batch arithmetic.
    said = [r.getMessage() for r in caplog.records]
    # Seeded as the config says, dataloader workers included, without Lightning's own "Seed set to" line.
    assert os.environ.get("PL_SEED_WORKERS") == "1" and not any(m.startswith("Seed set to") for m in said), said
    assert any(m.startswith("CPU: ") and "intra-op thread(s), OpenMP threads wait auto (OMP_WAIT_POLICY=PASSIVE from the environment)"
               in m for m in said), said  # the suite's own policy (tests/conftest.py) left in force
    assert any(m.startswith("effective batch ") and m.endswith("× 1 process(es)") for m in said), said
    # The run ended by max_steps in its first epoch: last.ckpt is saved at the end of that step, with the
    # epoch still open, so a resume to a higher max_steps trains on through the rest of the epoch's data (saved
    # once Lightning has ended fit, it would count the epoch as done and skip the rest).
    ckpt = torch.load(Path(result["output_dir"]) / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3
    assert ckpt["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0
    # Each adapter's model card says how it was made; a validation's numbers only on the checkpoint saved after
    # that validation (the best one), not on last.adapter, saved at the step's end before it.
    checkpoints = Path(result["output_dir"]) / "checkpoints"
    last_card = (checkpoints / "last.adapter" / "README.md").read_text()
    assert "# tiny + LoRA `full` on SMolInstruct" in last_card and "optimizer step 3" in last_card
    assert "- recipe: AdamW lr 0.003, cosine schedule" in last_card  # the demo recipe's optimizer, by its class name
    assert "Validation at this step" not in last_card
    best_card = (next(checkpoints.glob("step3-*.adapter")) / "README.md").read_text()
    assert "optimizer step 3" in best_card and "| val/loss |" in best_card


def test_an_adapter_save_stopped_between_its_renames_leaves_the_previous_one_readable(tmp_path, monkeypatch):
    from conftest import compose_config
    from transformers import AutoModelForCausalLM

    from llasmol.model.adapters import readable_adapter, save_adapter_atomically
    from llasmol.model.base import arch_config
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    model = apply_lora(AutoModelForCausalLM.from_config(arch_config(cfg.model.arch, vocab_size=64)), cfg.model, cfg.lora)
    target = tmp_path / "checkpoints" / "last.adapter"
    save_adapter_atomically(model, target)
    first = (target / "adapter_model.safetensors").read_bytes()

    real_rename = Path.rename

    def stop_before_the_new_one_is_in(self, dest):
        if self.name.startswith(".last.adapter.") and not self.name.endswith(".old"):
            raise KeyboardInterrupt  # the old adapter has stepped aside, the new one is not in place
        return real_rename(self, dest)

    monkeypatch.setattr(Path, "rename", stop_before_the_new_one_is_in)
    with pytest.raises(KeyboardInterrupt):
        save_adapter_atomically(model, target)
    monkeypatch.undo()
    assert not target.exists()
    found = readable_adapter(target)
    assert (found / "adapter_model.safetensors").read_bytes() == first  # the previous adapter, whole
    save_adapter_atomically(model, target)  # the next save puts things right
    assert readable_adapter(target) == target
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.adapter"]


STALLING_TRAIN = """
import os, runpy, signal, sys, time
import llasmol.core.files as files

real, saves = files._atomic_write, []


def atomic_write(path, write, binary=False):
    if path.name == "last.ckpt":
        saves.append(path)
        if len(saves) == 2:  # the second last.ckpt: stall half-way through, to be killed (or stopped) there
            def stalled(fh):
                fh.write(b"half a checkpoint")
                (path.parents[1] / "stalled").write_text("")
                if os.environ.get("STALL") == "sigstop":  # as `kill -STOP` would; SIGCONT carries on
                    os.kill(os.getpid(), signal.SIGSTOP)
                    fh.seek(0)
                    fh.truncate()
                    return write(fh)
                time.sleep(600)
            return real(path, stalled, binary)
    return real(path, write, binary)


files._atomic_write = atomic_write
sys.argv = ["llasmol.train", *sys.argv[1:]]
runpy.run_module("llasmol.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_a_kill_during_a_checkpoint_write_keeps_adapter_and_checkpoint_of_one_step(tmp_path):
    """SIGKILL while last.ckpt is being written (no handler runs): last.adapter and last.ckpt stay a pair of
    one step, and the next start in the folder removes what the killed writes left."""
    from llasmol.finetune.resume import checkpoint_step
    from llasmol.model.adapters import adapter_step

    run = tmp_path / "run"
    args = [f"hydra.run.dir={run}", "logger=csv", "trainer.enable_progress_bar=false", "checkpoint_every_n_steps=2",
            "val_every_n_steps=1000", "trainer.max_steps=6"]
    proc = subprocess.Popen([sys.executable, "-c", STALLING_TRAIN, *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.time() + HANG_TIMEOUT
        while time.time() < deadline and proc.poll() is None and not (run / "stalled").exists():
            time.sleep(0.1)
        assert (run / "stalled").exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timeout"
    finally:
        proc.kill()
        proc.wait()
    checkpoints = run / "checkpoints"
    last, adapter = checkpoints / "last.ckpt", checkpoints / "last.adapter"
    assert checkpoint_step(str(last)) == adapter_step(adapter) == 2  # the step-4 pair was never half-installed
    left = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("."))
    assert [n for n in left if n.startswith(".last.ckpt.") and n.endswith(".tmp")], left  # the killed writes'
    assert [n for n in left if n.startswith(".last.adapter.")], left

    resumed = run_cli(["llasmol.train", *args, "ckpt_path=last"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert re.search(r"removed 2 temporary file\(s\) left by writes a stop interrupted", (run / "train.log").read_text())
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]
    assert checkpoint_step(str(last)) == adapter_step(adapter) == 6


@pytest.mark.slow
def test_a_run_paused_by_sigstop_mid_checkpoint_write_shows_the_previous_pair_then_carries_on(tmp_path):
    """`kill -STOP` half-way through writing last.ckpt (a job suspended by its scheduler, Ctrl-Z): while it is
    paused, the run folder holds the previous step's last.ckpt and adapter, whole; SIGCONT and the run ends
    as it would have, with the final pair and no temporary file left."""
    from llasmol.finetune.resume import checkpoint_step
    from llasmol.model.adapters import adapter_step

    run = tmp_path / "run"
    args = [f"hydra.run.dir={run}", "logger=csv", "trainer.enable_progress_bar=false", "checkpoint_every_n_steps=2",
            "val_every_n_steps=1000", "trainer.max_steps=6"]
    proc = subprocess.Popen([sys.executable, "-c", STALLING_TRAIN, *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "STALL": "sigstop"})
    try:
        deadline = time.time() + HANG_TIMEOUT
        stopped = lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"  # noqa: E731
        while time.time() < deadline and proc.poll() is None and not ((run / "stalled").exists() and stopped()):
            time.sleep(0.1)
        assert proc.poll() is None and stopped(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timeout"
        checkpoints = run / "checkpoints"
        last, adapter = checkpoints / "last.ckpt", checkpoints / "last.adapter"
        assert checkpoint_step(str(last)) == adapter_step(adapter) == 2  # paused: the step-2 pair, whole
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=HANG_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert checkpoint_step(str(last)) == adapter_step(adapter) == 6
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]


def test_the_next_start_brings_back_a_stepped_aside_adapter_and_names_a_split_pair(tmp_path):
    from llasmol.core.files import write_torch
    from llasmol.finetune.checkpointing import tidy_run_dir

    checkpoints = tmp_path / "checkpoints"
    (checkpoints / ".last.adapter.old").mkdir(parents=True)  # stopped between the two renames of a save
    (checkpoints / ".last.adapter.old" / "adapter_config.json").write_text("{}")
    (checkpoints / ".last.adapter.old" / "trainer_state.json").write_text('{"global_step": 4}')
    write_torch(checkpoints / "last.ckpt", {"global_step": 4})
    (checkpoints / "best.adapter").mkdir()
    (checkpoints / "best.adapter" / "trainer_state.json").write_text('{"global_step": 9}')
    write_torch(checkpoints / "best.ckpt", {"global_step": 8})

    notes = tidy_run_dir(tmp_path)
    assert notes == ["restored last.adapter (its replacement was stopped between two renames)",
                     "best.adapter holds step 9 but best.ckpt step 8 (a stop between their final renames); "
                     "the next save under this name writes both again"]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.adapter", "best.ckpt", "last.adapter", "last.ckpt"]
    assert tidy_run_dir(tmp_path) == [notes[1]]  # in order now, but for the pair that only a new save mends


def test_an_adapter_stepped_aside_is_dropped_when_its_place_is_taken_or_it_is_incomplete(tmp_path):
    """Only a whole adapter (its adapter_config.json there) whose place is empty comes back; any other
    `.X.adapter.old` is a leftover and goes, without a note."""
    from llasmol.finetune.checkpointing import tidy_run_dir

    checkpoints = tmp_path / "checkpoints"
    for name in ("last", "best"):
        (checkpoints / f".{name}.adapter.old").mkdir(parents=True)
    (checkpoints / ".last.adapter.old" / "adapter_config.json").write_text("{}")
    (checkpoints / "last.adapter").mkdir()  # the replacement made it in
    (checkpoints / "last.adapter" / "adapter_config.json").write_text('{"new": 1}')
    assert tidy_run_dir(tmp_path) == []  # best's has no adapter_config.json: not an adapter to bring back
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last.adapter"]
    assert (checkpoints / "last.adapter" / "adapter_config.json").read_text() == '{"new": 1}'
    assert tidy_run_dir(tmp_path / "elsewhere") == []  # no checkpoints folder: nothing to put in order
    # Pairs it cannot compare are not named: an adapter of an earlier version (no step recorded), a checkpoint
    # that is a folder (a distributed checkpoint, which llasmol does not write), a damaged one (named where it is used).
    from llasmol.core.files import write_torch

    write_torch(checkpoints / "early.ckpt", {"global_step": 3})
    (checkpoints / "early.adapter").mkdir()
    for name in ("sharded", "damaged"):
        (checkpoints / f"{name}.adapter").mkdir()
        (checkpoints / f"{name}.adapter" / "trainer_state.json").write_text('{"global_step": 2}')
    (checkpoints / "sharded.ckpt").mkdir()
    (checkpoints / "damaged.ckpt").write_bytes(b"not a checkpoint")
    assert tidy_run_dir(tmp_path) == []


def test_a_stop_at_a_step_boundary_saves_interrupted_ckpt_and_says_how_to_continue(tmp_path, monkeypatch, caplog):
    """Ctrl-C or SIGTERM raised by `StopAtStepBoundary` (marked `at_step_boundary`) saves interrupted.ckpt on the
    resume checkpoint only; any other exception, or a stop elsewhere, saves nothing (last.ckpt resumes)."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    def stop(kind, at_boundary=True):
        exc = kind()
        if at_boundary is not None:
            exc.at_step_boundary = at_boundary
        return exc

    def saves(callback, exception, rank_zero=True):
        saved = []
        monkeypatch.setattr(callback, "save_now", lambda trainer, path: saved.append(path))
        trainer = SimpleNamespace(is_global_zero=rank_zero, global_step=5, default_root_dir=str(tmp_path))
        callback.on_exception(trainer, None, exception)
        return saved

    resume = AdapterModelCheckpoint(dirpath=str(tmp_path / "checkpoints"), resume=True)
    interrupted = str(tmp_path / "checkpoints" / "interrupted.ckpt")
    with caplog.at_level("WARNING", logger="llasmol.finetune.checkpointing"):
        assert saves(resume, stop(KeyboardInterrupt)) == [interrupted]
    assert caplog.messages == [f"interrupted at step 5, saved {interrupted}; continue with:\n  "
                               f"python -m llasmol.train hydra.run.dir={tmp_path} ckpt_path=last"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="llasmol.finetune.checkpointing"):
        assert saves(resume, stop(SIGTERMException)) == [interrupted]
        assert saves(resume, stop(KeyboardInterrupt), rank_zero=False) == [interrupted]  # every rank saves
    assert len(caplog.messages) == 1  # rank 0 alone says so
    assert saves(resume, stop(KeyboardInterrupt, at_boundary=False)) == []  # the second Ctrl-C: at once
    assert saves(resume, stop(KeyboardInterrupt, at_boundary=None)) == []  # Lightning's own handling
    assert saves(resume, stop(ValueError)) == []  # a failure is no stop on purpose
    assert AdapterModelCheckpoint().resume is False  # the best-checkpoint instance by default
    assert saves(AdapterModelCheckpoint(dirpath=str(tmp_path)), stop(KeyboardInterrupt)) == []
    assert saves(AdapterModelCheckpoint(resume=True), stop(KeyboardInterrupt)) == []  # no folder to save into


def test_the_resume_checkpoint_saves_the_step_reaching_max_steps_and_the_end_of_training(monkeypatch):
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    monkeypatch.setattr(ModelCheckpoint, "on_train_batch_end", lambda self, *args: None)
    monkeypatch.setattr(ModelCheckpoint, "on_train_end", lambda self, *args: None)

    def saved_at_batch_end(resume, max_steps, step):
        callback = AdapterModelCheckpoint(resume=resume)
        saved = []
        monkeypatch.setattr(callback, "save_last_unless_saved", lambda trainer: saved.append(trainer.global_step))
        callback.on_train_batch_end(SimpleNamespace(max_steps=max_steps, global_step=step), None, None, None, 0)
        return saved == [step]

    assert saved_at_batch_end(True, 3, 3) and saved_at_batch_end(True, 3, 4) and saved_at_batch_end(True, 1, 1)
    assert not saved_at_batch_end(True, 3, 2)  # before max_steps: the periodic saves only
    assert not saved_at_batch_end(True, -1, 5) and not saved_at_batch_end(True, 0, 5)  # no step limit
    assert not saved_at_batch_end(False, 3, 3)  # the best-checkpoint instance never writes last.ckpt
    for resume in (True, False):
        callback = AdapterModelCheckpoint(resume=resume)
        saved = []
        monkeypatch.setattr(callback, "save_last_unless_saved", lambda trainer: saved.append(trainer))
        callback.on_train_end("trainer", None)
        assert saved == (["trainer"] if resume else [])


def test_an_adapter_is_committed_with_its_checkpoint_dropped_without_it_and_removed_with_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from llasmol.finetune import checkpointing
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    committed = []
    monkeypatch.setattr(checkpointing, "commit_adapter", lambda staged, target: committed.append((staged, target)))
    callback = AdapterModelCheckpoint(dirpath=str(tmp_path))
    staged = {}
    for name in ("a", "b"):
        staged[name] = tmp_path / f".{name}.adapter.staged"
        staged[name].mkdir()
        callback._staged[str(tmp_path / f"{name}.ckpt")] = staged[name]
    callback.after_save(None, str(tmp_path / "a.ckpt"), saved=True)
    assert committed == [(staged["a"], tmp_path / "a.adapter")]
    callback.after_save(None, str(tmp_path / "b.ckpt"), saved=False)  # the .ckpt write failed
    assert not staged["b"].exists() and len(committed) == 1
    callback.after_save(None, str(tmp_path / "c.ckpt"), saved=True)  # nothing staged (not rank 0): nothing to do
    assert len(committed) == 1 and callback._staged == {}

    (tmp_path / "old.adapter").mkdir()
    callback.after_remove(SimpleNamespace(is_global_zero=False), str(tmp_path / "old.ckpt"))
    assert (tmp_path / "old.adapter").is_dir()  # rank 0 alone removes
    callback.after_remove(SimpleNamespace(is_global_zero=True), str(tmp_path / "old.ckpt"))
    assert not (tmp_path / "old.adapter").exists()
    callback.after_remove(SimpleNamespace(is_global_zero=True), str(tmp_path / "old.ckpt"))  # no adapter: no error
    callback._staged[str(tmp_path / "d.ckpt")] = tmp_path / "gone"
    callback.after_save(None, str(tmp_path / "d.ckpt"), saved=False)  # nothing left to drop: no error either


def test_an_adapters_card_holds_a_validation_only_at_the_step_it_was_made(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from llasmol.finetune import checkpointing
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    cards, staged = [], []
    monkeypatch.setattr(checkpointing, "adapter_card", lambda facts, metrics, step: cards.append((facts, metrics, step))
                        or "CARD")
    monkeypatch.setattr(checkpointing, "stage_adapter",
                        lambda model, target, state, card, step: staged.append((model, target, state, card, step))
                        or tmp_path / "staged")
    module = SimpleNamespace(model="peft", last_validated_step=4,
                             adapter_state_dict=lambda state: {k[len("model."):]: v for k, v in state.items()
                                                               if k == "model.w"})

    def save(step, rank_zero=True, facts=None):
        callback = AdapterModelCheckpoint(dirpath=str(tmp_path))
        callback.card_facts = facts
        strategy = SimpleNamespace(lightning_module_state_dict=lambda: {"model.w": 1, "model.frozen": 2})
        trainer = SimpleNamespace(lightning_module=module, strategy=strategy, is_global_zero=rank_zero, global_step=step,
                                  callback_metrics={"val/loss": torch.tensor(0.5), "train/loss": torch.tensor(1.0)})
        callback.before_save(trainer, str(tmp_path / "x.ckpt"))
        return callback._staged

    assert save(4, facts={"base": "b"}) == {str(tmp_path / "x.ckpt"): tmp_path / "staged"}
    assert cards == [({"base": "b"}, {"val/loss": 0.5}, 4)]  # val/ numbers only, as floats
    assert staged == [("peft", tmp_path / "x.adapter", {"w": 1}, "CARD", 4)]
    save(5, facts={"base": "b"})  # saved at step 5's end, before any validation of step 5
    assert cards[-1] == ({"base": "b"}, {}, 5)
    save(6)  # no facts (not trained by `train`): no card
    assert staged[-1][3] is None and len(cards) == 2
    assert save(4, rank_zero=False, facts={"base": "b"}) == {} and len(staged) == 3  # rank 0 alone writes


class SignalAtStep:
    """A callback that sends this process `signum` while optimizer step `step` trains (a test's Ctrl-C)."""

    def __new__(cls, step: int, signum: int = 2):
        from lightning.pytorch.callbacks import Callback

        class _Send(Callback):
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                if trainer.global_step == step - 1:
                    os.kill(os.getpid(), signum)

        return _Send()


@pytest.mark.slow
def test_a_stop_at_a_step_due_for_validation_validates_that_step_on_resume(cfg_factory, tmp_path):
    """Ctrl-C at the end of step 2, where val_every_n_steps=2 asks for a validation: the stop comes before it, so
    the resumed run validates step 2 first, once, and trains on; the curve has every validation of an unstopped run."""
    from llasmol.train import train

    run = tmp_path / "run"
    args = [f"paths.output_dir={run}", "val_every_n_steps=2", "callbacks.generation_evaluator.samples_per_task=1",
            "generation.max_new_tokens_limit=2", "data.max_samples_per_task={validation:2}",
            "trainer.enable_progress_bar=false", "logger=csv"]
    with pytest.raises(SystemExit):
        train(cfg_factory(*args, "trainer.max_steps=4", "+callbacks.signal={_target_:test_resume.SignalAtStep,step:2}"))
    assert (run / "checkpoints" / "interrupted.ckpt").is_file()
    train(cfg_factory(*args, "trainer.max_steps=4", "ckpt_path=last"))
    straight = tmp_path / "straight"
    train(cfg_factory(*[a.replace(str(run), str(straight)) for a in args], "trainer.max_steps=4"))

    def rows(folder, key):
        with (folder / "csv" / "metrics.csv").open(newline="") as fh:
            return [(int(r["step"]), round(float(r[key]), 5)) for r in csv.DictReader(fh) if r.get(key)]

    assert [step for step, _ in rows(run, "val/loss")] == [2, 4]
    # As if it had never stopped: the same validations and the same training steps, to the loss.
    assert rows(run, "val/loss") == rows(straight, "val/loss")
    assert rows(run, "train/loss") == rows(straight, "train/loss")


class SignalDuringValidation:
    """A callback that sends this process `signum` while the validation of optimizer step `step` runs."""

    def __new__(cls, step: int, signum: int = 15):
        from lightning.pytorch.callbacks import Callback

        class _Send(Callback):
            def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
                if trainer.global_step == step and not trainer.sanity_checking and batch_idx == 0:
                    os.kill(os.getpid(), signum)

        return _Send()


@pytest.mark.slow
def test_a_stop_during_a_validation_stops_it_at_once_and_the_resumed_run_validates_that_step(cfg_factory, tmp_path):
    """SIGTERM while step 2 is validated (a preemption's grace period can be shorter than a validation that
    generates for minutes): the validation stops at once, no step 3 is trained, interrupted.ckpt holds step 2,
    and the resumed run validates step 2 first and trains on as an unstopped run does."""
    from llasmol.train import train

    run = tmp_path / "run"
    args = [f"paths.output_dir={run}", "val_every_n_steps=2", "callbacks.generation_evaluator.samples_per_task=1",
            "generation.max_new_tokens_limit=2", "data.max_samples_per_task={validation:2}",
            "trainer.enable_progress_bar=false", "logger=csv"]
    with pytest.raises(SystemExit) as stopped:
        train(cfg_factory(*args, "trainer.max_steps=4",
                          "+callbacks.signal={_target_:test_resume.SignalDuringValidation,step:2}"))
    assert stopped.value.code == 143
    # Stopped in the validation, not at the end of a step more.
    assert torch.load(run / "checkpoints" / "interrupted.ckpt", weights_only=False)["global_step"] == 2

    def rows(folder, key):
        with (folder / "csv" / "metrics.csv").open(newline="") as fh:
            return [(int(r["step"]), round(float(r[key]), 5)) for r in csv.DictReader(fh) if r.get(key)]

    train(cfg_factory(*args, "trainer.max_steps=4", "ckpt_path=last"))
    straight = tmp_path / "straight"
    train(cfg_factory(*[a.replace(str(run), str(straight)) for a in args], "trainer.max_steps=4"))
    assert [step for step, _ in rows(run, "val/loss")] == [2, 4]
    assert rows(run, "val/loss") == rows(straight, "val/loss")
    assert rows(run, "train/loss") == rows(straight, "train/loss")


def test_checkpoints_and_run_folders_reached_through_links_resume_as_given(tmp_path):
    """A .ckpt or run folder given through a symbolic link is resumed by the name given; a last.ckpt that is a
    link to a checkpoint kept elsewhere counts as the run's; a link to nothing is one line naming it."""
    run = _run_dir(tmp_path, "run")
    here = tmp_path / "here"
    here.mkdir()
    links = tmp_path.parent / f"{tmp_path.name}-links"  # beside the runs' folder, not among them
    links.mkdir()
    (links / "ckpt-link").symlink_to(run / "checkpoints" / "last.ckpt")
    assert resolve_resume(str(links / "ckpt-link"), here, "tiny", "full") == str(links / "ckpt-link")
    (links / "run-link").symlink_to(run, target_is_directory=True)
    assert resolve_resume(str(links / "run-link"), here, "tiny", "full") == str(
        links / "run-link" / "checkpoints" / "last.ckpt")
    kept = tmp_path / "kept.ckpt"
    (run / "checkpoints" / "last.ckpt").rename(kept)
    (run / "checkpoints" / "last.ckpt").symlink_to(kept)
    assert resolve_resume("last", here, "tiny", "full") == str(run / "checkpoints" / "last.ckpt")  # a sibling run
    kept.unlink()
    with refused("ckpt_path=last", "checkpoints/last.ckpt"):  # the sibling's only checkpoint points nowhere
        resolve_resume("last", here, "tiny", "full")
    with refused(f"ckpt_path={links / 'ckpt-link'}", "last, auto, a run directory or a .ckpt file"):
        resolve_resume(str(links / "ckpt-link"), here, "tiny", "full")
