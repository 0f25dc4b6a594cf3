"""End to end: the default CPU run learns and checkpoints; multirun; one-line errors."""

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

from conftest import HANG_TIMEOUT
from llasmol.core.errors import UserError
from llasmol.core.threads import usable_cores
from llasmol.params import count_trainable
from llasmol.train import train

SHORT = ["data.max_samples_per_task={validation:12}", "trainer.enable_progress_bar=false"]


def val_losses(run_dir: Path) -> list[float]:
    with (run_dir / "csv" / "metrics.csv").open() as fh:
        return [float(row["val/loss"]) for row in csv.DictReader(fh) if row["val/loss"]]


def run_cli(args: list[str], cwd: Path, timeout: int = HANG_TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


@pytest.mark.slow
def test_default_run_learns_and_writes_peft_checkpoints(cfg_factory, tmp_path):
    cfg = cfg_factory("trainer.max_steps=150", "val_every_n_steps=50", *SHORT)
    result = train(cfg)
    losses = val_losses(tmp_path)
    assert len(losses) == 3
    assert losses[-1] < losses[0] - 0.3, losses  # it learns, not just runs
    assert result["global_step"] == 150

    # The trainable count is logged at start and equals the meta-device count.
    params = json.loads((tmp_path / "params.json").read_text())
    meta = count_trainable(cfg)
    assert (params["trainable"], params["total"]) == (meta["trainable"], meta["total"])

    # Best checkpoint by val/loss, plus last; each with a PEFT adapter folder beside it.
    best = Path(result["best_checkpoint"])
    assert best.is_file() and f"val_loss{min(losses):.4f}" in best.name
    for ckpt in (best, tmp_path / "checkpoints" / "last.ckpt"):
        adapter = ckpt.with_name(ckpt.stem + ".adapter")
        assert (adapter / "adapter_config.json").is_file()
        assert (adapter / "adapter_model.safetensors").is_file()

    # Lightning state holds only the trainable tensors, plus what resuming needs.
    state = torch.load(best, map_location="cpu", weights_only=False)
    assert state["state_dict"] and all(".lora_" in k for k in state["state_dict"])
    assert state["optimizer_states"] and state["lr_schedulers"]

    # The adapter loads with plain PEFT on a fresh base and carries the checkpoint's weights.
    from peft import PeftModel

    from llasmol.model.base import load_base_model, load_tokenizer

    tok = load_tokenizer(cfg.model)
    peft_model = PeftModel.from_pretrained(load_base_model(cfg.model, tok), str(best.with_name(best.stem + ".adapter")))
    loaded = {k: v for k, v in peft_model.state_dict().items() if ".lora_" in k}
    saved = {k.removeprefix("model."): v for k, v in state["state_dict"].items()}
    assert set(saved) == {k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")
                          for k in loaded} or set(saved) == set(loaded)
    for key, value in saved.items():
        torch.testing.assert_close(peft_model.state_dict()[key], value)


@pytest.mark.slow
def test_multirun_of_two_variants_records_each_count(tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli(
        ["llasmol.train", "--multirun", "lora=lite,attn", f"hydra.sweep.dir={sweep}", "trainer.max_steps=2",
         "val_every_n_steps=1", "data.max_samples_per_task={train:8,validation:2}", "logger=csv"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in runs] == ["0_tiny_lite", "1_tiny_attn"]
    from conftest import compose_config

    for run, lora in zip(runs, ["lite", "attn"]):
        params = json.loads((run / "params.json").read_text())
        assert params["lora"] == lora
        expected = count_trainable(compose_config([f"lora={lora}"], config_name="params"))
        assert params["trainable"] == expected["trainable"]
        assert (run / "checkpoints" / "last.adapter" / "adapter_model.safetensors").is_file()
        assert f"run directory: {run}" in proc.stdout
    # The jobs a stopped sweep had not started join its folder numbered on (first_job=), as the stop says.
    more = run_cli(["llasmol.train", "--multirun", "lora=full", f"hydra.sweep.dir={sweep}", "first_job=2",
                    "trainer.max_steps=1", "val_every_n_steps=1", "data.max_samples_per_task={train:8,validation:2}",
                    "logger=csv"], cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    from llasmol.analysis import load_sweep

    assert [r.name for r in load_sweep(sweep)] == ["0_tiny_lite", "1_tiny_attn", "2_tiny_full"]


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["model=mistral"], "mistralai/Mistral-7B-v0.1"),
        (["model=llama2", "model.path=/nonexistent/llama"], "model.path=/nonexistent/llama"),
        (["data.micro_batch_size=3"], "data.effective_batch_size=8 is not a multiple of data.micro_batch_size=3"),
        (["data.tasks=[forward_synthesis,retro]"], "unknown task 'retro'"),
    ],
)
@pytest.mark.slow
def test_mistakes_end_with_one_clear_line(tmp_path, overrides, needle):
    proc = run_cli(["llasmol.train", *overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    if overrides[0].startswith("model="):
        assert "model.path=" in errors[0]  # says how to point at local weights


@pytest.mark.slow
def test_a_machine_without_network_fails_fast_without_hf_hub_offline(tmp_path):
    """No HF_HUB_OFFLINE: the Hub is probed once (here: a closed local port, so nothing can download)
    instead of a minute of retries and a warning per retry; the run's log keeps the error too."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "PYTHONUNBUFFERED": "1"}
    for key in ("HF_HUB_OFFLINE", "HYDRA_FULL_ERROR", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                "ALL_PROXY", "all_proxy"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "llasmol.train", "model=mistral", f"hydra.run.dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HANG_TIMEOUT)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "mistralai/Mistral-7B-v0.1" in errors[0] and "127.0.0.1 unreachable" in errors[0]
    assert "Retrying" not in proc.stderr and "Traceback" not in proc.stderr
    assert errors[0] in (tmp_path / "run" / "train.log").read_text()


def test_a_local_folder_as_hf_id_is_not_asked_of_the_hub(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from llasmol.model.base import _local_only
    from llasmol.core.offline import cached_on_disk

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _local_only(OmegaConf.create({"hf_id": str(tmp_path), "path": None}), "base weights") is False
    assert cached_on_disk(str(tmp_path)) is False  # not a repository id: not cached, no exception
    with pytest.raises(UserError, match="not available offline"):
        _local_only(OmegaConf.create({"hf_id": "mistralai/Mistral-7B-v0.1", "path": None}), "base weights")


def test_importing_the_command_loads_neither_torch_nor_lightning():
    """`train`'s steps load them when it runs; the module the Hydra shell and the checks before Hydra live in
    stays quick to import."""
    code = "import sys, llasmol.train; print(sorted({'torch', 'lightning'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:] or proc.stdout


def test_user_errors_raise_from_the_plain_function(cfg_factory, tmp_path):
    with pytest.raises(UserError, match="micro_batch_size=3"):
        train(cfg_factory("data.micro_batch_size=3", *SHORT))
    # A config composed in a notebook meets the same checks as the command line, before anything is written
    # or any thread count is set.
    for bad, said in (("optimizer.lr=-1", "optimizer.lr=-1 must be a number > 0"),
                      ("cpu.threads=0", "cpu.threads=0 must be an integer >= 1")):
        with pytest.raises(UserError, match=f"^{re.escape(said)}"):
            train(cfg_factory(bad, *SHORT))
    assert not any(tmp_path.rglob("*.json")) and not any(tmp_path.rglob("*.log"))


@pytest.mark.slow
def test_paper_recipe_runs_on_the_tiny_model(cfg_factory, tmp_path):
    """The paper's optimizer (8-bit AdamW), warm-up and computed accumulation, on CPU."""
    cfg = cfg_factory("recipe=paper", "data.effective_batch_size=16", "trainer.max_steps=3", "val_every_n_steps=2",
                      "data.max_samples_per_task={validation:2}", "trainer.enable_progress_bar=false",
                      "trainer.log_every_n_steps=1")
    result = train(cfg)
    assert result["global_step"] == 3
    hparams = (tmp_path / "csv" / "hparams.yaml").read_text()
    assert "accumulate_grad_batches: 4" in hparams  # 16 = micro-batch 4 × 4 × 1 process
    assert "bitsandbytes.optim.AdamW8bit" in hparams
    with (tmp_path / "csv" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    lrs = [(int(r["step"]), float(r["train/lr"])) for r in rows if r["train/lr"]]
    # Linear warm-up over 1000 steps towards 1e-4: step k (its row at k, the steps completed) used (k-1)/1000.
    assert lrs == [(k, pytest.approx(1e-7 * (k - 1), abs=1e-12)) for k in (1, 2, 3)]
    # Validation every 2 optimizer steps = every 8 micro-batches, and at the end (step 3 is not on the grid).
    assert [int(r["step"]) for r in rows if r["val/loss"]] == [2, 3]


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_runs_end_to_end(tmp_path):
    """`trainer=ddp trainer.accelerator=cpu trainer.devices=2`: gloo, validation generation and metrics."""
    run = tmp_path / "run"
    proc = run_cli(
        ["llasmol.train", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=4",
         "val_every_n_steps=2", "data.effective_batch_size=16", "logger=csv", "trainer.enable_progress_bar=false",
         "callbacks.generation_evaluator.samples_per_task=3", "generation.max_new_tokens_limit=4",
         "data.max_samples_per_task={validation:6}", f"hydra.run.dir={run}"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("run directory:") == 1
    assert "accumulation 1 × 2 process(es)" in (run / "train.log").read_text()  # 16 = 8 × 1 × 2
    # Each rank generated its share; the file and the metrics cover the whole subset.
    records = [json.loads(x) for x in (run / "predictions" / "val-step4.jsonl").read_text().splitlines()]
    assert len(records) == 11 * 3 and len({r["index"] for r in records}) == 33
    metrics = json.loads((run / "metrics" / "val-step4.json").read_text())
    assert all(v["num_samples"] == 3 for v in metrics.values())
    # The two ranks' synchronised metrics are what one process scores from the same predictions.
    from llasmol.inference.predictions import read_predictions
    from llasmol.metrics.scoring import score_records

    single = score_records(read_predictions(run / "predictions" / "val-step4.jsonl"))
    assert set(single) == set(metrics)
    for task, values in single.items():
        got = {k: float("nan") if metrics[task][k] is None else metrics[task][k] for k in values}  # JSON null = NaN
        assert got == pytest.approx(values, abs=1e-9, nan_ok=True), task


@pytest.mark.slow
def test_a_short_run_validates_its_last_step_and_tells_its_story_in_train_log(tmp_path, monkeypatch):
    """No terminal (nohup, SLURM, CI): train.log has a line per validation and a summary with what to run next;
    and every place that names a validation numbers it as train.log does (issue #28 item 7): 11 training
    samples in micro-batches of 8 make 2 steps an epoch, so step 2 ends epoch 0 (validated during fit) and step
    3 is in epoch 1 (validated after fit, where Lightning's own counters are one off in each direction)."""
    run = tmp_path / "run"
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("OMP_DISPLAY_ENV", "VERBOSE")  # libgomp prints its settings as torch loads it
    proc = run_cli(["llasmol.train", f"hydra.run.dir={run}", "trainer.max_steps=3", "val_every_n_steps=2",
                    "logger=csv", "trainer.enable_progress_bar=false", "generation.max_new_tokens_limit=4",
                    "callbacks.generation_evaluator.samples_per_task=1", "trainer.log_every_n_steps=1",
                    "data.max_samples_per_task={train:1,validation:2}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (run / "metrics").iterdir()) == [
        "val-step2.intervals.json", "val-step2.json", "val-step3.intervals.json",
        "val-step3.json"]  # each validation's metrics and, beside them, their bootstrap intervals
    assert sorted(p.name for p in (run / "predictions").iterdir()) == ["val-step2.jsonl", "val-step3.jsonl"]
    log = (run / "train.log").read_text()
    lines = [line for line in log.splitlines() if "validation at step" in line]
    assert [line.split("validation at step ")[1].split(":")[0] for line in lines] == ["2", "3"]
    assert all("val/loss" in line and "(best" in line and "exact_match" in line for line in lines)
    assert "done at step 3" in log and f"python -m llasmol.report {run}" in log
    assert f"python -m llasmol.evaluate ckpt={run} data.split=test" in log
    assert log.count("GPU available") == 1 and "Tip:" not in log  # Lightning's lines once, no advertising
    # The command set OpenMP's passive wait before torch loaded it (libgomp's own default spins 300,000 times).
    assert "GOMP_SPINCOUNT = '0'" in proc.stderr
    assert f"CPU: {usable_cores()} intra-op thread(s), OpenMP threads wait passive" in log
    # The CSV numbers each validation and each training step as train.log does, with the epoch of that step.
    with (run / "csv" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    validations = [(int(r["step"]), int(r["epoch"]), float(r["val/loss"])) for r in rows if r["val/loss"]]
    assert [(step, epoch) for step, epoch, _ in validations] == [(2, 0), (3, 1)]
    assert [int(r["step"]) for r in rows if r["train/loss"]] == [1, 2, 3]
    said = {int(line.split("validation at step ")[1].split(":")[0]): line.split("val/loss ")[1].split(" ")[0]
            for line in lines}
    assert said == {step: f"{loss:.4f}" for step, _, loss in validations}
    # The validation after fit competes for the best checkpoint as the ones during fit do; the best
    # checkpoint and its adapter are named by the step of the validation that chose them.
    best = Path(json.loads((run / "result.json").read_text())["best_checkpoint"])
    step, _, loss = min(validations, key=lambda v: v[2])
    assert best.is_file() and best.name == f"step{step}-val_loss{loss:.4f}.ckpt", best
    from llasmol.model.adapters import adapter_step

    assert adapter_step(best.with_name(f"step{step}-val_loss{loss:.4f}.adapter")) == step
    assert not (run / "checkpoints" / "interrupted.ckpt").exists()


def test_train_log_names_the_first_validation_of_the_best_loss_as_best(caplog):
    """As the best-checkpoint callback does (ModelCheckpoint keeps the first of equal scores), a later
    validation that only equals the best loss does not take its place in train.log's '(best … at step …)'."""
    from types import SimpleNamespace

    from llasmol.finetune.validation import GenerationEvaluator

    evaluator = GenerationEvaluator({}, samples_per_task=0)
    with caplog.at_level("INFO", logger="llasmol.train"):
        for step, loss in [(2, 3.5), (4, 3.25), (6, 3.25), (8, 3.75)]:
            trainer = SimpleNamespace(callback_metrics={"val/loss": torch.tensor(loss)}, sanity_checking=False,
                                      is_global_zero=True, loggers=[], global_step=step)
            evaluator.on_validation_end(trainer, None)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation at step")]
    assert said == ["validation at step 2: val/loss 3.5000 (best 3.5000 at step 2)",
                    "validation at step 4: val/loss 3.2500 (best 3.2500 at step 4)",
                    "validation at step 6: val/loss 3.2500 (best 3.2500 at step 4)",
                    "validation at step 8: val/loss 3.7500 (best 3.2500 at step 4)"]


def test_a_base_out_of_reach_names_why_the_hub_could_not_be_asked(monkeypatch):
    from omegaconf import OmegaConf

    from llasmol.core import offline
    from llasmol.model.base import _local_only

    monkeypatch.setattr(offline, "cached_on_disk", lambda *args, **kwargs: False)
    cfg = OmegaConf.create({"hf_id": "mistralai/Mistral-7B-v0.1", "path": None})
    for reason in ("HF_HUB_OFFLINE is set", "huggingface.co unreachable: Network is unreachable"):
        monkeypatch.setattr(offline, "hub_unreachable", lambda reason=reason: reason)
        with pytest.raises(UserError) as err:
            _local_only(cfg, "base weights")
        assert str(err.value).startswith("base weights of mistralai/Mistral-7B-v0.1 are not available offline (not in "
                                         f"the Hugging Face cache and no model.path; {reason}): run `hf download ")
    monkeypatch.setattr(offline, "hub_unreachable", lambda: None)
    assert _local_only(cfg, "base weights") is False  # the Hub may be asked
