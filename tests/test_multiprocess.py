"""Training on two CPU processes over gloo, as a user scales out: FSDP2 (`trainer=fsdp`) against DDP step by
step, a sharded run stopped by SIGTERM and continued, its adapter on the unsharded base, and DDP over two
"nodes" on loopback started the way SLURM starts them."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import HANG_TIMEOUT, compose_config, free_port
from refusals import refused
from test_resume import TESTS, _records

# Three tasks, 48 training samples each; micro-batch 4 × accumulation 2 × 2 processes = 16 a step, 6 steps, the
# gradient norm clipped at 1 (the paper's recipe); LoRA `plus` (the head trains too, in the root unit).
# Validation at step 4 and, after the fit, at the last step 6: 3 samples a task (9: shares of 5 and 4, so
# batches of 4 give one rank a batch more, which the other pads), each task's answers on both ranks, and
# generation one prompt a batch (5 batches on rank 0, 4 on rank 1, which idles a call to keep in step).
RUN = ["data.tasks=[name_conversion-s2f,property_prediction-esol,forward_synthesis]",
       "data.max_samples_per_task={train:48,validation:3}", "data.micro_batch_size=4", "data.effective_batch_size=16",
       "trainer.max_steps=6", "val_every_n_steps=4", "checkpoint_every_n_steps=2", "scheduler.num_warmup_steps=2",
       "trainer.gradient_clip_val=1.0", "lora=plus", "callbacks.generation_evaluator.samples_per_task=3",
       "generation.batch_size=1", "generation.max_new_tokens_limit=6",
       "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "logger=csv", "trainer.accelerator=cpu",
       "trainer.devices=2", "+callbacks.recorder._target_=resume_probe.StepRecorder",
       "model.random_init=true"]  # sharding under test, not chemistry: the random base, whose tolerances were measured
FSDP = ["trainer=fsdp", "gradient_checkpointing=true"]  # activation recomputation inside each block's unit
MICRO_BATCHES = 12  # per rank: 6 steps × accumulation 2


def _env(**extra: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _train(run: Path, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llasmol.train", f"hydra.run.dir={run}", *args], cwd=cwd,
                          env=_env(**env), capture_output=True, text=True, timeout=HANG_TIMEOUT)


def _finished(run: Path, args: list[str], cwd: Path) -> Path:
    probes = [f"+callbacks.recorder.path={run}.steps", "+callbacks.logits._target_=resume_probe.LogitsProbe",
              f"+callbacks.logits.path={run}.logits.pt"]
    proc = _train(run, [*args, *probes], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("run directory:") == 1  # rank 0 alone says it
    # ... and its start-up lines, once: the other process keeps warnings and errors only; one line says how the
    # processes hold the model
    said = proc.stdout + proc.stderr
    assert said.count("training tiny + LoRA") == 1 and said.count("trainable of") == 1
    held = "DDP: each process holds the whole model" if "trainer=ddp" in args else "FSDP2: each process holds 1/2"
    assert said.count(held) == 1
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same run under DDP and under FSDP2, each to its end."""
    root = tmp_path_factory.mktemp("scale")
    return {"ddp": _finished(root / "ddp", [*RUN, "trainer=ddp"], root),
            "fsdp": _finished(root / "fsdp", [*RUN, *FSDP], root)}


def _steps(run: Path) -> dict[int, list[dict]]:
    return {rank: _records(Path(f"{run}.steps"), rank) for rank in (0, 1)}


def _val_losses(run: Path) -> list[float]:
    with (run / "csv" / "metrics.csv").open() as fh:
        return [float(r["val/loss"]) for r in csv.DictReader(fh) if r["val/loss"]]


@pytest.mark.slow
def test_fsdp2_trains_as_ddp_does_on_the_same_global_batch(runs):
    """Every micro-batch's loss on each rank equals DDP's to within float32 rounding (rel 1e-5; on torch 2.13
    they are bit-equal), and so do the validations: loss, each answer and the metrics."""
    ddp, fsdp = _steps(runs["ddp"]), _steps(runs["fsdp"])
    for rank in (0, 1):
        assert [(r["step"], r["indices"]) for r in fsdp[rank]] == [(r["step"], r["indices"]) for r in ddp[rank]]
        assert len(fsdp[rank]) == MICRO_BATCHES
        assert [r["loss"] for r in fsdp[rank]] == pytest.approx([r["loss"] for r in ddp[rank]], rel=1e-5)
        assert [r["lr"] for r in fsdp[rank]] == pytest.approx([r["lr"] for r in ddp[rank]], rel=1e-12)
    assert not set(fsdp[0][0]["indices"]) & set(fsdp[1][0]["indices"])  # each rank its own share
    assert len(_val_losses(runs["fsdp"])) == 2
    assert _val_losses(runs["fsdp"]) == pytest.approx(_val_losses(runs["ddp"]), rel=1e-5)
    for step in (4, 6):
        records = {k: [json.loads(x) for x in (run / "predictions" / f"val-step{step}.jsonl").read_text().splitlines()]
                   for k, run in runs.items()}
        assert len(records["fsdp"]) == 9 and {r["task"] for r in records["fsdp"]} == {
            "name_conversion-s2f", "property_prediction-esol", "forward_synthesis"}
        assert [r["predictions"] for r in records["fsdp"]] == [r["predictions"] for r in records["ddp"]]
        metrics = {k: json.loads((run / "metrics" / f"val-step{step}.json").read_text()) for k, run in runs.items()}
        assert metrics["fsdp"] == metrics["ddp"]
    # What each run saved: the same adapters, a .ckpt file each (not a folder of shards) written on rank 0.
    saved = {k: torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
             for k, run in runs.items()}
    assert saved["fsdp"]["state_dict"].keys() == saved["ddp"]["state_dict"].keys()
    # lora=plus: A and B of 7 projections in 2 blocks, and the head's trained copy
    assert len(saved["fsdp"]["state_dict"]) == 2 * 2 * 7 + 1
    assert (saved["fsdp"]["llasmol_fsdp2"], saved["ddp"]["llasmol_fsdp2"]) == (True, False)
    for key, tensor in saved["ddp"]["state_dict"].items():
        # reduce-scatter and all-reduce sum in different orders: 1 element in 4,096 once differed by 2.6e-7
        torch.testing.assert_close(saved["fsdp"]["state_dict"][key], tensor, rtol=1e-4, atol=1e-6)
    said = (runs["fsdp"] / "train.log").read_text()
    assert "accumulation 2 × 2 process(es)" in said and "validating the last step (6)" in said


@pytest.mark.slow
def test_fsdp2_reads_a_pretrained_base_shard_by_shard_and_trains_as_ddp_on_it(runs, tmp_path):
    """A base with files (the tiny base, saved as a user's download is): each process builds it on the meta
    device, so no process ever holds it whole, and reads its own rows once FSDP2 has sharded it. Its first
    3 steps are DDP's on the very same base, micro-batch by micro-batch."""
    from safetensors.torch import load_file

    from llasmol.model.base import load_base_model, load_tokenizer

    cfg = compose_config(["model.random_init=true"], "train")  # the runs' base (RUN), saved as a download is
    tok = load_tokenizer(cfg.model)
    load_base_model(cfg.model, tok).save_pretrained(tmp_path / "base")
    run = tmp_path / "run"
    args = [*RUN, "trainer=fsdp", "trainer.max_steps=3", "model.random_init=false", f"model.path={tmp_path / 'base'}",
            f"+callbacks.recorder.path={run}.steps", "+callbacks.shards._target_=resume_probe.ShardProbe",
            f"+callbacks.shards.path={run}.shards"]
    proc = _train(run, args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("each process reads its own shards of") == 1
    ddp = _steps(runs["ddp"])
    for rank, records in _steps(run).items():  # steps 1-3: the schedule's warm-up, the same under max_steps=6
        assert [(r["step"], r["indices"]) for r in records] == [(r["step"], r["indices"]) for r in ddp[rank][:6]]
        assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in ddp[rank][:6]], rel=1e-5)
    files = load_file(str(tmp_path / "base" / "model.safetensors"))
    probes = [json.loads(Path(f"{run}.shards.{rank}").read_text()) for rank in (0, 1)]
    for name, where in probes[0]["before"].items():  # before sharding: the base on the meta device, on each rank
        assert where == ("cpu" if "lora_" in name else "meta"), name
        assert probes[1]["before"][name] == where
    # Each block's weights gathered for its own forward and backward only: no other block's are at the same time
    assert [p["other_blocks_gathered"] for p in probes] == [0, 0]
    for name, mine in probes[0]["after"].items():
        other = probes[1]["after"][name]
        assert mine["rows"] == -(-mine["of"] // 2) and mine["rows"] + other["rows"] == mine["of"], name
        if "lora_" not in name:  # each rank's rows of the file's tensor, the two halves summing to the whole
            key = name.replace("base_model.model.", "").replace(".base_layer", "").replace(
                ".modules_to_save.default", "").replace(".original_module", "")
            whole = files[key].double()
            assert mine["sum"] == pytest.approx(float(whole[:mine["rows"]].sum()), rel=1e-9, abs=1e-9), name
            assert other["sum"] == pytest.approx(float(whole[mine["rows"]:].sum()), rel=1e-9, abs=1e-9), name


def test_ddps_two_ranks_score_as_one_process_scores_their_answers(runs):
    """The metric sums are reduced over the ranks: one process scoring the gathered predictions agrees."""
    from llasmol.inference.predictions import read_predictions
    from llasmol.metrics.scoring import score_records

    run = runs["ddp"]
    metrics = json.loads((run / "metrics" / "val-step6.json").read_text())
    single = score_records(read_predictions(run / "predictions" / "val-step6.jsonl"))
    assert set(single) == set(metrics) and all(v["num_samples"] == 3 for v in metrics.values())
    for task, values in single.items():
        got = {k: float("nan") if metrics[task][k] is None else metrics[task][k] for k in values}  # JSON null = NaN
        assert got == pytest.approx(values, abs=1e-9, nan_ok=True), task


@pytest.mark.slow
def test_the_sharded_runs_adapter_loads_on_the_unsharded_base_with_the_same_logits(runs):
    from peft import PeftModel

    from conftest import compose_config
    from llasmol.model.base import load_base_model, load_tokenizer

    cfg = compose_config(["paths.output_dir=/unused", "model.random_init=true"])
    base = load_base_model(cfg.model, load_tokenizer(cfg.model))  # the runs' random base, rebuilt from its seed
    model = PeftModel.from_pretrained(base, str(runs["fsdp"] / "checkpoints" / "last.adapter")).eval()
    probe = torch.load(f"{runs['fsdp']}.logits.pt", weights_only=True)
    with torch.no_grad():
        logits = model(input_ids=probe["input_ids"]).logits
        with model.disable_adapter():
            untuned = model(input_ids=probe["input_ids"]).logits
    torch.testing.assert_close(logits, probe["logits"], rtol=1e-5, atol=1e-5)
    assert (logits - untuned).abs().max() > 1e-3  # six steps did move the adapters off zero


@pytest.mark.slow
def test_a_sharded_run_stopped_by_sigterm_continues_exactly(runs, tmp_path):
    """SIGTERM to rank 1 alone, between the two micro-batches of step 2: both ranks finish that step and stop
    with interrupted.ckpt; `ckpt_path=last` then trains steps 3-6 with every loss and learning rate of the
    uninterrupted FSDP2 run, and validates as it did. Both halves keep each block's gathered weights from its
    forward to its backward (reshard_after_forward=false), which changes no number."""
    run = tmp_path / "run"
    signal_at = ["+callbacks.signal._target_=resume_probe.SignalAt", "+callbacks.signal.signal=SIGTERM",
                 "+callbacks.signal.step=1", "+callbacks.signal.micro_batch=1", "+callbacks.signal.rank=1"]
    FSDP_KEEP = [*FSDP, "trainer.strategy.reshard_after_forward=false"]
    stopped = _train(run, [*RUN, *FSDP_KEEP, f"+callbacks.recorder.path={tmp_path}/stopped", *signal_at], tmp_path)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert torch.load(run / "checkpoints" / "interrupted.ckpt", weights_only=True)["global_step"] == 2
    resumed = _train(run, [*RUN, *FSDP_KEEP, f"+callbacks.recorder.path={tmp_path}/resumed", "ckpt_path=last"],
                     tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = _steps(runs["fsdp"])
    for rank in (0, 1):
        before, after = _records(tmp_path / "stopped", rank), _records(tmp_path / "resumed", rank)
        assert [r["step"] for r in before] == [0, 0, 1, 1] and [r["step"] for r in after] == [2, 2, 3, 3, 4, 4, 5, 5]
        combined = before + after
        assert [r["indices"] for r in combined] == [r["indices"] for r in expected[rank]]
        assert [r["loss"] for r in combined] == pytest.approx([r["loss"] for r in expected[rank]], rel=1e-6)
        assert [r["lr"] for r in combined] == pytest.approx([r["lr"] for r in expected[rank]], rel=1e-12)
    assert _val_losses(run) == pytest.approx(_val_losses(runs["fsdp"]), rel=1e-6)


@pytest.mark.slow
def test_a_rank_killed_leaves_the_other_with_one_line_saying_how_to_go_on(tmp_path):
    """SIGKILL of rank 1 (the OOM killer) during step 1: rank 0, left at a collective, ends with exit status 1 and
    one `error:` line (no gloo traceback) that says another process ended, that no checkpoint was saved yet and
    the command that starts again in the run's folder; train.log keeps the line."""
    run = tmp_path / "run"
    kill = ["+callbacks.signal._target_=resume_probe.SignalAt", "+callbacks.signal.signal=SIGKILL",
            "+callbacks.signal.step=1", "+callbacks.signal.micro_batch=1", "+callbacks.signal.rank=1"]
    args = [*[a for a in RUN if not a.startswith("+callbacks.recorder")], *kill]
    done = _train(run, args, tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    # gloo says "closed" or, when the dead peer's socket is reset first (seen under load), "reset".
    assert re.search(r"another of this run's 2 processes ended at step 1 \(torch\.distributed: Connection "
                     r"(closed|reset) by peer\)", errors[0]), errors[0]
    assert "rank 0 cannot go on" in errors[0] and "no checkpoint was saved yet, start again with: " in errors[0]
    assert errors[0].endswith(f"hydra.run.dir={run} ckpt_path=last") and "llasmol.train" in errors[0]
    assert errors[0] in (run / "train.log").read_text()


@pytest.mark.slow
def test_a_checkpoint_of_two_processes_is_refused_on_one_naming_both(runs, cfg_factory):
    from llasmol.train import train

    last = runs["fsdp"] / "checkpoints" / "last.ckpt"
    cfg = cfg_factory(*[a for a in RUN if not a.startswith(("trainer.devices", "+callbacks.recorder"))], *FSDP,
                      "trainer.devices=1", f"ckpt_path={last}")
    with refused(f"ckpt_path={last}", "2 process(es)", "has 1", "trainer.devices × trainer.num_nodes"):
        train(cfg)
    # DDP's checkpoint under trainer=fsdp, on 2 processes: refused before any process is started
    ddp = runs["ddp"] / "checkpoints" / "last.ckpt"
    cfg = cfg_factory(*[a for a in RUN if not a.startswith("+callbacks.recorder")], *FSDP, f"ckpt_path={ddp}")
    with refused(f"ckpt_path={ddp}", "another trainer", "trainer=fsdp"):
        train(cfg)


@pytest.mark.slow
def test_ddp_over_two_nodes_on_loopback_started_as_srun_starts_them(tmp_path):
    """`trainer.num_nodes=2 trainer.devices=1`: one process per "node", each given the SLURM variables srun sets
    for its task (and MASTER_PORT, a free port, rather than the one Lightning derives from the job id), so that
    Lightning's SLURM environment ranks them; they train, validate and checkpoint."""
    run, port = tmp_path / "run", str(free_port())
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llasmol", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1",
             "SLURM_NNODES": "2", "SLURM_NODELIST": "127.0.0.1", "SLURM_JOB_NODELIST": "127.0.0.1",
             "MASTER_PORT": port}
    args = [f"hydra.run.dir={run}", *[a for a in RUN if not a.startswith(("trainer.devices", "+callbacks.recorder"))],
            "trainer=ddp", "trainer.num_nodes=2", "trainer.devices=1", "trainer.max_steps=3",
            "+callbacks.recorder._target_=resume_probe.StepRecorder", f"+callbacks.recorder.path={tmp_path}/steps"]
    procs = []
    try:
        for node in (0, 1):
            env = _env(**slurm, SLURM_PROCID=str(node), SLURM_LOCALID="0", SLURM_NODEID=str(node))
            with open(tmp_path / f"out.{node}", "w") as out, open(tmp_path / f"err.{node}", "w") as err:
                procs.append(subprocess.Popen([sys.executable, "-m", "llasmol.train", *args], cwd=tmp_path, env=env,
                                              stdout=out, stderr=err))
        codes = [p.wait(timeout=HANG_TIMEOUT) for p in procs]
    finally:
        for p in procs:  # a failed node leaves the other waiting at its next collective
            if p.poll() is None:
                p.kill()
    errs = [(tmp_path / f"err.{node}").read_text() for node in (0, 1)]
    assert codes == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    outs = [(tmp_path / f"out.{node}").read_text() for node in (0, 1)]
    assert [out.count("run directory:") for out in outs] == [1, 0]
    said = (run / "train.log").read_text()
    assert "accumulation 2 × 2 process(es)" in said and "validating the last step (3)" in said
    steps = {rank: _records(tmp_path / "steps", rank) for rank in (0, 1)}
    assert [r["step"] for r in steps[1]] == [0, 0, 1, 1, 2, 2]
    assert {r["cluster"] for rank in (0, 1) for r in steps[rank]} == {"SLURMEnvironment"}
    assert not set(steps[0][0]["indices"]) & set(steps[1][0]["indices"])
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3
    assert len((run / "predictions" / "val-step3.jsonl").read_text().splitlines()) == 9
