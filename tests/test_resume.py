"""Exact resume: optimizer, scheduler, step and data position continue as if the run had never stopped."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import HANG_TIMEOUT
from llasmol.data.resumable_loader import ResumableDataLoader
from llasmol.data.sampler import ShardedShuffleSampler
from llasmol.core.errors import UserError
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
    with pytest.raises(UserError) as err:
        resolve_resume(str(path), tmp_path / "run", "tiny", "full")
    message = str(err.value)
    assert message.startswith(f"ckpt_path={path} is not a checkpoint of llasmol.train: ")
    assert "weights_only=False" not in message and not marker.exists()
    if kind == "crafted_pickle":
        assert "nothing in it was run" in message


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
    with pytest.raises(UserError, match="world_size 2 -> 1"):
        _loader(world=1).load_state_dict(state)
    with pytest.raises(UserError, match="num_samples 50 -> 40"):
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
    with pytest.raises(UserError, match="ckpt_path=last: no checkpoints/last.ckpt .* tiny\\+attn"):
        resolve_resume("last", current, "tiny", "attn")
    with pytest.raises(UserError, match="ckpt_path=/nope/x.ckpt does not exist"):
        resolve_resume("/nope/x.ckpt", current, "tiny", "full")
    with pytest.raises(UserError, match="is a folder without"):
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
        with pytest.raises(UserError, match=rf"ckpt_path={broken} is not a checkpoint of llasmol.train: it is not a "
                                            "file torch.save wrote"):
            resolve_resume(ckpt_path, run, "tiny", "full")
    with pytest.raises(UserError, match="ckpt_path=last: no checkpoints/last.ckpt"):
        resolve_resume("last", other, "tiny", "full")  # a sibling's broken files are passed over


def test_a_checkpoint_resumes_only_on_the_number_of_processes_and_the_kind_of_trainer_it_was_saved_from(tmp_path):
    from llasmol.core.errors import UserError
    from llasmol.finetune.resume import check_same_launch, checkpoint_launch

    path = tmp_path / "last.ckpt"
    torch.save({**_TRAINING_STATE, "SMolInstructDataModule": {"train_position": {"world_size": 4, "batches": 3}},
                "llasmol_fsdp2": True}, path)
    assert checkpoint_launch(str(path)) == (4, True)
    check_same_launch(str(path), 4, sharded=True)
    with pytest.raises(UserError) as err:
        check_same_launch(str(path), 2, sharded=True)
    assert str(err.value).startswith(f"ckpt_path={path} was saved by a run of 4 process(es) and this one has 2 ")
    with pytest.raises(UserError) as err:  # trainer=fsdp keys its optimizer state otherwise than DDP
        check_same_launch(str(path), 4, sharded=False)
    assert str(err.value).startswith(f"ckpt_path={path} was saved under trainer=fsdp and this run is under another "
                                     "trainer: their optimizer states are laid out differently; resume with the "
                                     "trainer=fsdp it was saved with")
    torch.save(_TRAINING_STATE, path)  # saved before the first batch, by an earlier version: nothing to continue
    assert checkpoint_launch(str(path)) == (None, False)
    check_same_launch(str(path), 2, sharded=False)
    with pytest.raises(UserError, match="was saved under another trainer and this run is under trainer=fsdp"):
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
    with pytest.raises(UserError, match="adapters do not match this model .* model= and lora="):
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

    return SimpleNamespace(fit=fit, interrupted=interrupted, loggers=[]), calls


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
    stopper, trainer = resume.StopAtStepBoundary(), SimpleNamespace(global_step=6, world_size=1)
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
        with pytest.raises(UserError, match="ckpt_path=last: no checkpoints/last.ckpt"):
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
        return SimpleNamespace(global_step=4, world_size=2, strategy=SimpleNamespace(reduce=reduce))

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
