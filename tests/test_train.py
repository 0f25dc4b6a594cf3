"""End to end: the default CPU run learns and checkpoints; multirun; one-line errors."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import HANG_TIMEOUT, QUICK
from refusals import error_line, refused

from llasmol.core.tasks import SMOLINSTRUCT
from llasmol.core.threads import usable_cores
from llasmol.model.counting import count_trainable
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
    # the demo base, not random weights (4.3 nats at the start), and it learns, not just runs: 1.21 -> 1.15 measured
    assert losses[0] < 1.5 and losses[-1] < losses[0] - 0.04, losses
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
        # One of each path to the line: weights missing once the run has started (a given model.path, and the
        # Hub id, are named in-process by tests/test_troubleshooting.py), a setting refused before Hydra writes.
        (["model=mistral"], "mistralai/Mistral-7B-v0.1"),
        (["data.micro_batch_size=3"], "data.effective_batch_size=8 is not a multiple of data.micro_batch_size=3"),
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


def test_missing_weights_are_said_before_lightning_is_imported(tmp_path):
    """Lightning's import is some 4 s of the missing-weights line's 7: the base is looked for before it."""
    code = ("import sys\nfrom llasmol.core.config import compose_config\nfrom llasmol.core.errors import UserError\n"
            "from llasmol.train import train\n"
            f"cfg = compose_config(['model=mistral', 'paths.output_dir={tmp_path / 'run'}'])\n"
            "try:\n    train(cfg)\nexcept UserError as err:\n    print('lightning' in sys.modules, err)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert proc.stdout.startswith("False the tokenizer files of mistralai/Mistral-7B-v0.1 are not available offline"), (
        proc.stdout + proc.stderr[-2000:])


def test_the_first_line_of_train_comes_before_torch_loads(tmp_path):
    """A newcomer sees what runs and where at once (0.7 s where the next line takes 5 s): the line is logged
    before torch is imported (here the run then stops at the missing weights of a real base)."""
    code = ("import logging, sys\nfrom llasmol.core.config import compose_config\nfrom llasmol.core.errors import UserError\n"
            "from llasmol.train import train\n"
            "class First(logging.Handler):\n"
            "    def emit(self, record):\n"
            "        if not getattr(self, 'seen', False):\n"
            "            self.seen = True; print('torch' in sys.modules, record.getMessage())\n"
            "logging.getLogger().addHandler(First()); logging.getLogger().setLevel(logging.INFO)\n"
            f"cfg = compose_config(['model=mistral', 'lora=lite', 'paths.output_dir={tmp_path / 'run'}'])\n"
            "try:\n    train(cfg)\nexcept UserError:\n    pass\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert proc.stdout.splitlines()[0] == (f"False training mistral + LoRA lite into {tmp_path / 'run'} (loading "
                                           "torch, Lightning and the base)"), proc.stdout + proc.stderr[-2000:]


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

    from llasmol.core.offline import cached_on_disk
    from llasmol.model.base import _local_only

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert _local_only(OmegaConf.create({"hf_id": str(tmp_path), "path": None}), "base weights") is False
    assert cached_on_disk(str(tmp_path)) is False  # not a repository id: not cached, no exception
    with refused("mistralai/Mistral-7B-v0.1", "model.path"):
        _local_only(OmegaConf.create({"hf_id": "mistralai/Mistral-7B-v0.1", "path": None}), "base weights")


def test_importing_the_command_loads_neither_torch_nor_lightning():
    """`train`'s steps load them when it runs; the module the Hydra shell and the checks before Hydra live in
    stays quick to import."""
    code = "import sys, llasmol.train; print(sorted({'torch', 'lightning'} & set(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:] or proc.stdout


def test_user_errors_raise_from_the_plain_function(cfg_factory, tmp_path):
    # A config composed in a notebook meets the same checks as the command line, before anything is written
    # or any thread count is set.
    for bad in ("data.micro_batch_size=3", "optimizer.lr=-1", "cpu.threads=0"):
        with refused(bad, untouched=tmp_path):
            train(cfg_factory(bad, *SHORT))


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
    # The default waits as libgomp does (spins 300,000 times, then sleeps), on the cores other work leaves free.
    assert "GOMP_SPINCOUNT = '300000'" in proc.stderr
    said = next(line for line in log.splitlines() if "intra-op thread(s)" in line)
    threads = int(said.split("CPU: ")[1].split()[0])
    assert 1 <= threads <= usable_cores() and said.endswith(
        "OpenMP threads wait auto (the runtime's: spin, then sleep) (cpu.threads, cpu.wait_policy)"), said
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


def test_train_log_names_the_validation_the_best_checkpoint_keeps_as_best(caplog):
    """As the best-checkpoint callback does (`AdapterModelCheckpoint`: a tie keeps the later checkpoint), a later
    validation that equals the best loss takes its place in train.log's '(best val/loss … at step …)'."""
    from types import SimpleNamespace

    from llasmol.finetune.validation import GenerationEvaluator

    evaluator = GenerationEvaluator({}, samples_per_task=0, seed=13)
    with caplog.at_level("INFO", logger="llasmol.train"):
        for step, loss in [(2, 3.5), (4, 3.25), (6, 3.25), (8, 3.75)]:
            trainer = SimpleNamespace(callback_metrics={"val/loss": torch.tensor(loss)}, sanity_checking=False,
                                      is_global_zero=True, loggers=[], global_step=step)
            evaluator.on_validation_end(trainer, None)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation at step")]
    assert said == ["validation at step 2: val/loss 3.5000 (best val/loss 3.5000 at step 2)",
                    "validation at step 4: val/loss 3.2500 (best val/loss 3.2500 at step 4)",
                    "validation at step 6: val/loss 3.2500 (best val/loss 3.2500 at step 6)",
                    "validation at step 8: val/loss 3.7500 (best val/loss 3.2500 at step 6)"]


def test_a_base_out_of_reach_names_why_the_hub_could_not_be_asked(monkeypatch):
    from omegaconf import OmegaConf

    from llasmol.core import offline
    from llasmol.model.base import _local_only

    monkeypatch.setattr(offline, "cached_on_disk", lambda *args, **kwargs: False)
    cfg = OmegaConf.create({"hf_id": "mistralai/Mistral-7B-v0.1", "path": None})
    for reason in ("HF_HUB_OFFLINE is set", "huggingface.co unreachable: Network is unreachable"):
        monkeypatch.setattr(offline, "hub_unreachable", lambda reason=reason: reason)
        with refused("mistralai/Mistral-7B-v0.1", "model.path", reason, "hf download"):
            _local_only(cfg, "base weights")
    monkeypatch.setattr(offline, "hub_unreachable", lambda: None)
    assert _local_only(cfg, "base weights") is False  # the Hub may be asked


# ---------------------------------------------------------------------------------------------------------------
# The steps of `train` called directly with tiny stand-ins: the real fits above are slow, and the fast ones reach
# few of these branches.

class _TinyPeft(torch.nn.Module):
    """Stands in for a PEFT model: a trainable adapter beside a frozen base weight; records its forward's arguments."""

    def __init__(self, loss: float = 0.5) -> None:
        super().__init__()
        self.lora = torch.nn.Linear(2, 2)
        self.base = torch.nn.Linear(2, 2)
        self.base.requires_grad_(False)
        self.loss, self.calls = loss, []

    def forward(self, **kwargs):
        self.calls.append(kwargs)
        return SimpleNamespace(loss=torch.tensor(self.loss))


def _module(loss: float = 0.5, **trainer):
    from llasmol.finetune.module import LoRACausalLM

    module = LoRACausalLM(_TinyPeft(loss), optimizer=lambda params: torch.optim.SGD(params, lr=0.25))
    module._trainer = SimpleNamespace(**{"global_step": 6, "sanity_checking": False, **trainer})
    module.logged = []
    module.log = lambda name, value, **kwargs: module.logged.append((name, float(value), kwargs))
    module.optimizers = lambda: SimpleNamespace(param_groups=[{"lr": 2.5e-4}])
    return module


def _batch(**extra):
    return {"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
            "labels": torch.tensor([[5, -100, 7, 8], [-100, -100, 3, -100]]), "truncated": torch.tensor([True, False]),
            **extra}


def test_a_padded_batch_is_masked_and_a_packed_one_goes_by_its_position_ids():
    module = _module()
    batch = _batch()
    assert float(module(batch)) == 0.5
    assert set(module.model.calls[-1]) == {"input_ids", "attention_mask", "labels"}
    packed = _batch(position_ids=torch.tensor([[0, 1, 0, 1], [0, 1, 2, 3]]))
    module(packed)
    call = module.model.calls[-1]
    assert set(call) == {"input_ids", "position_ids", "labels", "use_cache"} and call["use_cache"] is False
    assert call["position_ids"] is packed["position_ids"]


def test_val_loss_is_weighted_by_the_tokens_that_carry_loss_after_the_shift():
    from llasmol.finetune.module import LoRACausalLM

    # Each row's first label never carries loss (nothing predicts it); of the rest, 7, 8 and 3 do.
    assert LoRACausalLM._target_tokens(_batch()) == 3
    module = _module()
    module.validation_step(_batch(), 0)
    assert module.logged == [("val/loss", 0.5, {"prog_bar": True, "sync_dist": True, "batch_size": 3}),
                             ("val/truncated", 1.0, {"reduce_fx": "sum", "sync_dist": True})]


def test_a_batch_of_padding_alone_logs_a_zero_weighted_zero_not_nan():
    """A rank's evaluation share padded to the others' length can end in a batch without a loss-carrying token:
    its mean is 0/0, which weighted by 0 would still make val/loss NaN."""
    module = _module(loss=float("nan"))
    padding = {"input_ids": torch.ones(1, 1, dtype=torch.long), "attention_mask": torch.ones(1, 1, dtype=torch.long),
               "labels": torch.full((1, 1), -100), "truncated": torch.tensor([False])}
    module.validation_step(padding, 0)
    assert module.logged[0] == ("val/loss", 0.0, {"prog_bar": True, "sync_dist": True, "batch_size": 0})


def test_a_training_step_logs_its_loss_truncations_and_learning_rate_and_then_its_token_rate(monkeypatch):
    from llasmol.finetune import module as module_file

    module = _module()
    assert float(module.training_step(_batch(), 0)) == 0.5
    assert module.logged == [
        ("train/loss", 0.5, {"prog_bar": True, "batch_size": 2}),
        ("train/truncated", 1.0, {"reduce_fx": "sum", "on_step": False, "on_epoch": True, "sync_dist": True}),
        ("train/lr", 2.5e-4, {"batch_size": 2}),
    ]
    module.logged.clear()
    clock = iter([100.0, 102.5])  # the batch's start, then its end: 5 useful tokens in 2.5 s
    monkeypatch.setattr(module_file, "time", SimpleNamespace(perf_counter=lambda: next(clock)))  # its clock only
    module.on_train_batch_start(_batch(), 0)
    module.on_train_batch_end(None, _batch(), 0)
    assert module.logged == [("train/tokens_per_sec", 2.0, {"batch_size": 2})]
    module.logged.clear()
    monkeypatch.setattr(module_file, "time", SimpleNamespace(perf_counter=lambda: 100.0))  # too coarse a clock
    module.on_train_batch_start(_batch(), 0)
    module.on_train_batch_end(None, _batch(), 0)
    assert module.logged == []


@pytest.mark.parametrize("last, then", [("", "start again"),
                                        ("/run/checkpoints/last.ckpt", "resume from the last good checkpoint with "
                                                                       "ckpt_path=/run/checkpoints/last.ckpt")])
def test_a_non_finite_loss_stops_before_the_update_and_says_what_to_change(last, then):
    module = _module(loss=float("nan"), gradient_clip_val=None,
                     checkpoint_callbacks=[SimpleNamespace(last_model_path=""), SimpleNamespace(last_model_path=last)])
    with refused("nan", "step 7", "optimizer.lr", "0.00025", "trainer.gradient_clip_val=1.0", then):
        module.training_step(_batch(), 0)
    assert module.logged == []


def test_the_step_of_the_latest_validation_is_remembered_but_not_the_sanity_check():
    module = _module(sanity_checking=True)
    module.on_validation_epoch_end()
    assert module.last_validated_step is None
    module._trainer.sanity_checking = False
    module.on_validation_epoch_end()
    assert module.last_validated_step == 6


def test_only_the_adapters_are_optimised_and_the_schedule_steps_every_optimizer_step():
    module = _module(estimated_stepping_batches=40)
    optimizer = module.configure_optimizers()  # no scheduler: the optimizer alone
    assert isinstance(optimizer, torch.optim.SGD)
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(module.model.lora.parameters())
    seen = {}

    def scheduler(opt, num_training_steps):
        seen.update(opt=opt, steps=num_training_steps)
        return "schedule"

    module.scheduler_factory = scheduler
    configured = module.configure_optimizers()
    assert configured == {"optimizer": seen["opt"], "lr_scheduler": {"scheduler": "schedule", "interval": "step"}}
    assert seen["steps"] == 40


def test_checkpoints_keep_the_adapters_only_and_refuse_another_variants():
    module = _module()
    state = {"model.lora.weight": 1, "model.lora.bias": 2, "model.base.weight": 3, "model.base.bias": 4}
    assert module.adapter_state_dict(state) == {"lora.weight": 1, "lora.bias": 2}
    checkpoint = {"state_dict": dict(state), "global_step": 3}
    module.on_save_checkpoint(checkpoint)
    # The adapters only, and whether trainer=fsdp saved them (its optimizer state is keyed otherwise).
    assert checkpoint == {"state_dict": {"model.lora.weight": 1, "model.lora.bias": 2}, "global_step": 3,
                          "llasmol_fsdp2": False, "objective": "sft"}  # a resume by another objective is refused
    from llasmol.finetune.distributed import FSDP2Strategy

    sharded = _module(strategy=FSDP2Strategy())
    sharded.on_save_checkpoint(fsdp := {"state_dict": {}})
    assert fsdp["llasmol_fsdp2"] is True
    module.on_load_checkpoint(checkpoint)  # its own adapters: fine
    # Lightning loads a checkpoint's state dict with strict=module.strict_loading: the frozen base is not in it.
    module.load_state_dict({"model.lora.weight": torch.zeros(2, 2), "model.lora.bias": torch.zeros(2)},
                           strict=module.strict_loading)
    assert not module.model.lora.weight.detach().any()
    module.on_load_checkpoint({"loops": {}})  # trainer=fsdp checks the weights as it loads them, before this hook
    with refused("1 saved", "2 trainable", "model.lora.bias", "model=", "lora="):
        module.on_load_checkpoint({"state_dict": {"model.lora.weight": 1}})
    with refused("3 saved", "model.plus.weight"):
        module.on_load_checkpoint({"state_dict": {"model.lora.weight": 1, "model.lora.bias": 2, "model.plus.weight": 3}})
    with refused("2 saved", "model.lora.bias"):
        module.on_load_checkpoint({"state_dict": {"model.lora.weight": 1, "model.x": 2}})  # the wanted one first


def test_fit_resumes_from_the_planned_checkpoint_reading_weights_only(caplog):
    from llasmol.finetune.fit import fit

    calls = []
    trainer = SimpleNamespace(fit=lambda module, **kwargs: calls.append((module, kwargs)))
    with caplog.at_level("INFO", logger="llasmol.train"):
        fit(trainer, "module", "data", None)
        assert caplog.messages == []
        fit(trainer, "module", "data", "/run/checkpoints/last.ckpt")
    assert caplog.messages == ["resuming from /run/checkpoints/last.ckpt"]
    assert calls == [("module", {"datamodule": "data", "ckpt_path": None, "weights_only": True}),
                     ("module", {"datamodule": "data", "ckpt_path": "/run/checkpoints/last.ckpt", "weights_only": True})]


def test_the_last_step_is_validated_once_and_competes_for_the_best_checkpoint(caplog, monkeypatch):
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint
    from llasmol.finetune.fit import validate_last_step

    best, last = AdapterModelCheckpoint(monitor="val/loss"), AdapterModelCheckpoint(resume=True)
    competed = []
    for callback in (best, last):
        monkeypatch.setattr(callback, "save_best_now", lambda trainer, c=callback: competed.append(c))
    validated = []
    trainer = SimpleNamespace(global_step=7, checkpoint_callbacks=[best, last, SimpleNamespace(monitor="val/loss")],
                              validate=lambda module, **kwargs: validated.append(kwargs))
    with caplog.at_level("INFO", logger="llasmol.train"):
        validate_last_step(trainer, SimpleNamespace(last_validated_step=7), "data", 5)  # validated at step 7 already
        assert validated == [] and competed == [] and caplog.messages == []
        validate_last_step(trainer, SimpleNamespace(last_validated_step=5), "data", 5)
    assert validated == [{"datamodule": "data", "verbose": False}]
    assert competed == [best]  # the checkpoint that keeps a best one, alone
    assert caplog.messages == ["validating the last step (7): val_every_n_steps=5 does not divide it"]


def test_the_runs_result_and_its_closing_line(tmp_path, caplog, monkeypatch):
    from llasmol.finetune import fit as fit_file
    from llasmol.finetune.fit import finish, run_result

    closed = []
    monkeypatch.setattr(fit_file, "finish_wandb_runs", lambda trainer: closed.append(trainer))
    checkpoint = SimpleNamespace(best_model_path=str(tmp_path / "best.ckpt"), best_model_score=torch.tensor(0.123456),
                                 monitor="val/loss")
    trainer = SimpleNamespace(checkpoint_callback=checkpoint, callback_metrics={"val/loss": torch.tensor(0.25)},
                              global_step=9, is_global_zero=True)
    monkeypatch.setattr(fit_file, "time", SimpleNamespace(monotonic=lambda: 1002.26))  # this module's clock only
    result = run_result(trainer, {"trainable": 3}, tmp_path, "/old/last.ckpt", 1000.0)
    assert result.pop("seconds") == 2.3  # this process's wall time, to a tenth of a second
    assert result == {"metrics": {"val/loss": 0.25}, "params": {"trainable": 3}, "best_checkpoint": str(tmp_path / "best.ckpt"),
                      "best_by": "val/loss", "output_dir": str(tmp_path), "global_step": 9,
                      "resumed_from": "/old/last.ckpt"}
    with caplog.at_level("INFO", logger="llasmol.train"):
        finish(trainer, result)
    assert json.loads((tmp_path / "result.json").read_text()) == result and closed == [trainer]
    assert caplog.messages == [f"done at step 9: best checkpoint {tmp_path / 'best.ckpt'} (val/loss 0.1235). Next: "
                               f"python -m llasmol.report {tmp_path} ; python -m llasmol.evaluate ckpt={tmp_path} "
                               "data.split=test"]
    (tmp_path / "result.json").unlink()
    caplog.clear()
    bare = SimpleNamespace(checkpoint_callback=None, callback_metrics={}, global_step=2, is_global_zero=True)
    result = run_result(bare, {}, tmp_path, None, 1002.26)
    assert result["best_checkpoint"] is None and result["metrics"] == {}
    with caplog.at_level("INFO", logger="llasmol.train"):
        finish(bare, result)
    assert caplog.messages[0].startswith("done at step 2: best checkpoint (none: no validation kept one). Next: ")
    (tmp_path / "result.json").unlink()
    finish(SimpleNamespace(**{**vars(bare), "is_global_zero": False}), result)
    assert not (tmp_path / "result.json").exists() and len(closed) == 3  # rank 0 writes; every rank closes W&B


def test_config_groups_instantiate_their_targets_only():
    from omegaconf import OmegaConf

    from llasmol.finetune.build import instantiate_all

    assert instantiate_all(None) == [] and instantiate_all(OmegaConf.create({})) == []
    made = instantiate_all(OmegaConf.create({"a": {"_target_": "fractions.Fraction", "numerator": 3}, "off": None,
                                             "note": {"text": "no target"}, "b": {"_target_": "fractions.Fraction"}}))
    assert [str(m) for m in made] == ["3", "0"]


def test_the_callbacks_a_resumable_run_needs_come_last_and_no_bar_when_it_is_off(cfg_factory):
    from llasmol.finetune.build import FreeCoreThreads, build_callbacks
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint
    from llasmol.finetune.resume import StepSeeding, StopAtStepBoundary
    from llasmol.finetune.tracking import ProgressBar, ProgressLines

    on_terminal = build_callbacks(cfg_factory("seed=21", "trainer.enable_progress_bar=true"))
    kinds = [type(c) for c in on_terminal]
    assert ProgressBar in kinds and kinds.count(AdapterModelCheckpoint) == 2
    # beside the bar, the progress lines go to train.log alone (it said nothing between validations there)
    assert [c.files_only for c in on_terminal if isinstance(c, ProgressLines)] == [True]
    assert kinds[-3:] == [FreeCoreThreads, StepSeeding, StopAtStepBoundary]
    cfg = cfg_factory("seed=21", "trainer.enable_progress_bar=false", "progress_every_s=7")
    callbacks = build_callbacks(cfg)
    assert ProgressBar not in [type(c) for c in callbacks] and callbacks[-2].seed == 21
    assert [(c.every_s, c.files_only) for c in callbacks if isinstance(c, ProgressLines)] == [(7.0, False)]  # the bar's stand-in
    del cfg.trainer.enable_progress_bar  # unset: Lightning's default shows the bar
    assert ProgressBar in [type(c) for c in build_callbacks(cfg)]


@pytest.mark.parametrize("every_s, said", [(0, [1, 2, 3]), (3600, [1])])
def test_a_redirected_run_says_its_steps_rate_time_left_and_loss_in_its_log(cfg_factory, caplog, every_s, said):
    """A line when training starts, one after the first step whatever the interval (its rate is the first known,
    and a slow first step must not read as a hang), then one every `progress_every_s`; Lightning's note that it
    loads the training loader to count the steps is not among them."""
    with caplog.at_level("INFO"):
        train(cfg_factory("trainer.max_steps=3", "val_every_n_steps=100", "trainer.enable_progress_bar=false",
                          "data.micro_batch_size=4", "data.effective_batch_size=8",  # 2 micro-batches a step
                          f"progress_every_s={every_s}", "callbacks.generation_evaluator.samples_per_task=1",
                          "generation.max_new_tokens_limit=4"))
    start, *lines = [m for m in caplog.messages if m.startswith("training: ")]
    assert start == f"training: from step 0 to 3; a line after the first step, then every {every_s}s (progress_every_s)"
    assert not [m for m in caplog.messages if "stepping batches" in m]
    assert [int(m.split()[1].split("/")[0]) for m in lines] == said
    for m in lines:
        assert re.fullmatch(r"training: \d/3 steps \(\d+%\), [\d.]+ steps/s, about \d+m\d\ds left; loss \d+\.\d{4}", m), m


def _datamodule(**source):
    return SimpleNamespace(source=SimpleNamespace(**{"describe": lambda: "SMolInstruct, /data/smol",
                                                     "table": SMOLINSTRUCT, **source}),
                           effective_batch_size=12, micro_batch_size=4, tasks=["name_conversion-i2f"],
                           gradient_accumulation=lambda world_size: 12 // (4 * world_size))


def test_an_adapters_card_says_how_it_was_trained(cfg_factory):
    from llasmol.finetune.build import card_facts

    facts = card_facts(cfg_factory(), {"trainable": 5}, _datamodule(), 3)
    assert facts["recipe"] == ("AdamW lr 0.003, cosine schedule with 20 warm-up steps, 2 epoch(s), effective batch 12 "
                               "(micro-batch 4 x accumulation 3), 512 tokens, no gradient clipping, seed 13")
    assert facts["lora"] == {"name": "full", "r": 16, "alpha": 16, "dropout": 0.05, "train_head": False,
                             "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    assert {k: facts[k] for k in ("model", "tiny", "demo", "params", "data", "tasks")} == {
        "model": "tiny", "tiny": False, "demo": True, "params": {"trainable": 5}, "data": "SMolInstruct, /data/smol",
        "tasks": ["name_conversion-i2f"]}  # the demo base, pretrained (tiny: its random weights)
    assert facts["base"].startswith("llasmol/demo-base (pretrained, weights sha256 ")
    random = card_facts(cfg_factory("model.random_init=true"), {"trainable": 5}, _datamodule(), 3)
    assert (random["tiny"], random["demo"]) == (True, True) and random["base"].startswith("llasmol/tiny-mistral")
    paper = card_facts(cfg_factory("trainer.max_steps=30", "trainer.gradient_clip_val=1.0", "lora=plus", "data.path=null"),
                       {}, _datamodule(), 1)
    assert ", at most 30 steps, " in paper["recipe"] and ", gradient norm clipped at 1, seed 13" in paper["recipe"]
    assert paper["lora"]["train_head"] is True
    assert ", 2 epoch(s), " in card_facts(cfg_factory("trainer.max_steps=0"), {}, _datamodule(), 1)["recipe"]


def test_a_run_records_its_counts_cards_and_hyperparameters(cfg_factory, tmp_path):
    from llasmol.finetune.build import record_run
    from llasmol.finetune.checkpointing import AdapterModelCheckpoint

    cfg = cfg_factory("seed=5")
    hyper = []
    adapter, other = AdapterModelCheckpoint(), SimpleNamespace(card_facts=None)
    trainer = SimpleNamespace(accumulate_grad_batches=3, checkpoint_callbacks=[adapter, other],
                              loggers=[SimpleNamespace(log_hyperparams=hyper.append)])
    record_run(cfg, trainer, _datamodule(), {"model": "tiny", "trainable": 5})
    assert json.loads((tmp_path / "params.json").read_text()) == {"model": "tiny", "trainable": 5}
    assert adapter.card_facts["recipe"].endswith("(micro-batch 4 x accumulation 3), 512 tokens, no gradient clipping, seed 5")
    assert other.card_facts is None
    [logged] = hyper
    assert logged["seed"] == 5 and logged["trainer"]["default_root_dir"] == str(tmp_path)  # interpolations resolved
    assert logged["params"] == {"model": "tiny", "trainable": 5} and logged["accumulate_grad_batches"] == 3


def test_the_trainer_accumulates_for_its_processes_and_validates_every_n_optimizer_steps(cfg_factory, tmp_path, caplog):
    from llasmol.finetune.build import build_trainer
    from llasmol.finetune.checkpointing import AtomicCheckpointIO
    from llasmol.finetune.resume import Resume

    with caplog.at_level("INFO", logger="llasmol.train"):
        trainer = build_trainer(cfg_factory("val_every_n_steps=7", "trainer.enable_progress_bar=false"), _datamodule(),
                                Resume(None, tmp_path))
    assert trainer.accumulate_grad_batches == 3 and trainer.val_check_interval == 21  # 7 optimizer steps of 3 batches
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    said = [r.getMessage() for r in caplog.records if r.name == "llasmol.train"]
    assert said == ["effective batch 12 = micro-batch 4 × accumulation 3 × 1 process(es)"]
    trainer.loggers[0].log_metrics({"x": 1.0}, step=5)  # Lightning's counter: the row takes the trainer's step, 0
    trainer.loggers[0].save()
    assert (tmp_path / "csv" / "metrics.csv").read_text().splitlines() == ["step,x", "0,1.0"]
    assert any(type(c) is Resume for c in trainer.callbacks)


def test_the_command_prints_its_run_directory_once(monkeypatch, capsys):
    import llasmol.train as command

    monkeypatch.setattr(command, "train", lambda cfg: {"output_dir": "/runs/x"})
    inner = command.main.__wrapped__
    for rank, printed in ((0, "run directory: /runs/x\n"), (1, "")):
        monkeypatch.setattr(command, "process_rank", lambda rank=rank: rank)
        inner(None)
        assert capsys.readouterr().out == printed


def test_a_validations_log_line_names_each_tasks_headline_and_only_rank_0_says_it(caplog, tmp_path):
    from llasmol.finetune.tracking import WandbLogger
    from llasmol.finetune.validation import GenerationEvaluator

    evaluator = GenerationEvaluator({}, samples_per_task=20, seed=13)
    assert evaluator.samples_per_task == 20  # the default subset: 20 samples per task
    wandb = WandbLogger(project="p", offline=True, save_dir=str(tmp_path))
    wandb._experiment = SimpleNamespace(summary={})

    def end(loss, step, **trainer):
        metrics = {} if loss is None else {"val/loss": torch.tensor(loss)}
        evaluator.on_validation_end(SimpleNamespace(**{"callback_metrics": metrics, "sanity_checking": False,
                                                       "is_global_zero": True, "loggers": [wandb],
                                                       "global_step": step, **trainer}), None)

    evaluator._last_results = {"name_conversion-s2f": {"exact_match": 0.5, "num_samples": 4.0},
                               "property_prediction-esol": {"rmse": float("nan")},  # nothing valid to score
                               "forward_synthesis": {"exact_match": 0.25}}
    with caplog.at_level("INFO", logger="llasmol.train"):
        end(1.0, 0, sanity_checking=True)  # Lightning's sanity check is no validation of the run
        end(1.0, 2, is_global_zero=False)
        end(None, 2)  # no loss (no validation batches): nothing to say
        assert caplog.messages == [] and evaluator._best is None and wandb.experiment.summary == {}
        end(2.0, 4)
        evaluator._last_results = None
        end(2.5, 6)
        # Every value on the same too few samples: said once at the end (the demo's 8 samples per task).
        evaluator._last_results = {"name_conversion-s2f": {"exact_match": 0.5, "num_samples": 8.0},
                                   "forward_synthesis": {"exact_match": 0.25, "num_samples": 8.0}}
        end(2.25, 8)
    assert caplog.messages == [
        "validation at step 4: val/loss 2.0000 (best val/loss 2.0000 at step 4); name_conversion-s2f exact_match 0.500 "
        "(n=4, too few), forward_synthesis exact_match 0.250",
        "validation at step 6: val/loss 2.5000 (best val/loss 2.0000 at step 4)",
        "validation at step 8: val/loss 2.2500 (best val/loss 2.0000 at step 4); name_conversion-s2f exact_match 0.500, "
        "forward_synthesis exact_match 0.250 (each n=8, too few)"]
    assert wandb.experiment.summary == {"val/loss_best": 2.0}


def test_a_validation_generates_on_its_ranks_share_logs_every_number_and_writes_in_the_run_folder(tmp_path, monkeypatch):
    """`GenerationEvaluator` with its collaborators recorded (the real ones run in the fast real-run tests)."""
    from contextlib import contextmanager

    from llasmol.finetune import validation
    from llasmol.finetune.tracking import WandbLogger
    from llasmol.finetune.validation import GenerationEvaluator

    calls = []
    share = SimpleNamespace(indices=[1, 3], split=SimpleNamespace(tasks=["name_conversion-s2f"], table=SMOLINSTRUCT))
    monkeypatch.setattr(validation.Samples, "of", lambda *args: calls.append(("samples", *args))
                        or SimpleNamespace(share=lambda rank, world: calls.append(("share", rank, world)) or share))
    monkeypatch.setattr(validation, "BeamGenerator", lambda *args: calls.append(("generator", *args)) or "generator")

    @contextmanager
    def progress(description, total, live, log_every_s):
        calls.append(("progress", description, total, live, log_every_s))
        yield "advance"

    monkeypatch.setattr(validation, "generation_progress", progress)
    records = [{"index": i, "task": "name_conversion-s2f", "input": "CCO", "gold": ["C2H6O"],
                "predictions": ["<MOLFORMULA> C2H6O </MOLFORMULA>"], "answers": ["C2H6O"]} for i in (3, 1)]
    monkeypatch.setattr(validation, "ModelAnswers", lambda generator, generation, tasks: SimpleNamespace(
        answer=lambda s, advance: calls.append(("answer", generator, s, advance)) or records))
    monkeypatch.setattr(validation, "gather_to_all", lambda mine: mine)
    monkeypatch.setattr(validation.RunFiles, "named", lambda out, name: (out, name))
    monkeypatch.setattr(validation, "reduced_metrics", lambda mine, tasks, device, table: ("reduced", tasks, device))
    outcome = SimpleNamespace(metrics={"name_conversion-s2f": {"exact_match": 0.5, "num_samples": 2, "note": "x"}},
                              intervals={"tasks": {"name_conversion-s2f": {"exact_match": (0.25, 0.75), "num_samples": None}}})

    class Evaluation:
        def __init__(self, files, intervals, write, tasks):
            calls.append(("evaluation", files, intervals, write))

        def write_predictions(self, everything):
            calls.append(("write", [r["index"] for r in everything]))

        def score(self, everything, reduced):
            calls.append(("score", reduced))
            return outcome

    monkeypatch.setattr(validation, "Evaluation", Evaluation)
    wandb = WandbLogger(project="p", offline=True, save_dir=str(tmp_path))
    wandb._experiment = SimpleNamespace(summary={})
    tables = []
    wandb.log_table = lambda **kwargs: tables.append(kwargs)
    logged = []
    module = SimpleNamespace(model="model", device="cpu", log=lambda key, value, **kw: logged.append((key, value, kw)))
    trainer = SimpleNamespace(sanity_checking=False, datamodule=SimpleNamespace(source="source", tokenizer="tok",
                                                                                 formatter="fmt"),
                              global_rank=1, world_size=2, default_root_dir=str(tmp_path / "default"),
                              is_global_zero=True, global_step=8, loggers=[wandb])
    generation = {"max_prompt_tokens": 64, "batch_size": 3}
    evaluator = GenerationEvaluator(generation, samples_per_task=2, seed=9, output_dir=str(tmp_path / "out"),
                                    intervals={"n": 10}, progress_every_s=30)
    evaluator.on_validation_epoch_end(SimpleNamespace(**{**vars(trainer), "sanity_checking": True}), module)
    assert calls == [] and logged == []  # Lightning's sanity check is not a validation of the run
    evaluator.on_validation_epoch_end(trainer, module)
    assert calls == [("samples", "source", "validation", 2, 9), ("share", 1, 2),
                     ("generator", "model", "tok", "fmt", 64, 3), ("progress", "validation generation", 2, None, 30),
                     ("answer", "generator", share, "advance"),
                     ("evaluation", (tmp_path / "out", "val-step8"), {"n": 10}, True), ("write", [1, 3]),
                     ("score", ("reduced", ["name_conversion-s2f"], "cpu"))]
    assert logged == [("val/name_conversion-s2f/exact_match", 0.5, {"sync_dist": True}),
                      ("val/name_conversion-s2f/num_samples", 2.0, {"sync_dist": True}),
                      ("val/name_conversion-s2f/exact_match_lo", 0.25, {"sync_dist": True}),
                      ("val/name_conversion-s2f/exact_match_hi", 0.75, {"sync_dist": True})]
    assert [t["step"] for t in tables] == [8] and wandb.experiment.summary == {
        "val/name_conversion-s2f/exact_match_best": 0.5, "val/name_conversion-s2f/exact_match_best_n": 2,
        "val/name_conversion-s2f/exact_match_best_note": "n=2, too few"}
    assert evaluator._last_results is outcome.metrics
    # The next validation: the same subset (drawn once), written by rank 0 alone, in the trainer's folder by default.
    calls.clear()
    evaluator.output_dir = None
    outcome.intervals = None
    evaluator.on_validation_epoch_end(SimpleNamespace(**{**vars(trainer), "is_global_zero": False}), module)
    assert calls[0] == ("share", 1, 2)
    assert ("progress", "validation generation", 2, None, None) in calls  # rank 0 alone says its progress
    assert ("evaluation", (tmp_path / "default", "val-step8"), {"n": 10}, False) in calls
    assert len(tables) == 1 and len(logged) == 6  # no intervals this time; no W&B rows from rank 1


def test_the_module_gets_the_configs_optimizer_and_a_schedule_only_when_one_is_set(cfg_factory):
    from llasmol.finetune.build import build_module

    model = _TinyPeft()
    module = build_module(cfg_factory(), model)
    assert module.model is model and module.optimizer_factory.keywords["lr"] == 0.003
    assert module.scheduler_factory.keywords["num_warmup_steps"] == 20
    assert build_module(cfg_factory("scheduler=null"), model).scheduler_factory is None


class _RecordingDataModule:
    """Stands in for `SMolInstructDataModule` as `cfg.data`'s target: records `setup`."""

    def __init__(self, tokenizer, path=None, prompts_only=False) -> None:
        from types import SimpleNamespace

        self.tokenizer, self.path, self.stages, self.prompts_only = tokenizer, path, [], prompts_only
        self.source = SimpleNamespace(check_reachable=lambda: self.stages.append("reachable?"))

    def setup(self, stage):
        self.stages.append(stage)

    def mix(self):
        return None


@pytest.mark.parametrize("path, stages, objective", [("/data/smol", ["fit"], "sft"), (None, ["reachable?"], "grpo")])
def test_a_local_copy_is_indexed_before_anything_else_starts(path, stages, objective):
    from omegaconf import OmegaConf

    from llasmol.finetune.build import build_datamodule

    cfg = OmegaConf.create({"data": {"_target_": f"{__name__}._RecordingDataModule", "path": path},
                            "objective": {"name": objective}})
    datamodule = build_datamodule(cfg, "tokenizer")
    assert isinstance(datamodule, _RecordingDataModule) and datamodule.tokenizer == "tokenizer"
    # A local copy is indexed now; the Hub's is fetched when Lightning sets the data up, but whether it can be is
    # asked now, before the model is built.
    assert datamodule.stages == stages
    assert datamodule.prompts_only == (objective == "grpo")  # GRPO trains on prompts alone


@pytest.mark.parametrize("switches, checkpointed, compiled", [
    ({}, False, None),
    ({"gradient_checkpointing": True, "compile": {"enabled": False, "backend": "eager"}}, True, None),
    ({"compile": {"enabled": True, "backend": "inductor", "mode": "max-autotune"}}, False, ("inductor", "max-autotune")),
])
def test_the_model_trains_with_its_switches_and_its_counts_are_named(switches, checkpointed, compiled, monkeypatch,
                                                                      caplog):
    from omegaconf import OmegaConf

    from llasmol.finetune import build

    model = _TinyPeft().eval()  # from_pretrained hands back eval mode
    done = []
    monkeypatch.setattr(build, "load_base_model", lambda model_cfg, tokenizer, quant: ("base", tokenizer, quant))
    monkeypatch.setattr(build, "apply_lora", lambda base, model_cfg, lora_cfg: done.append(("lora", base)) or model)
    monkeypatch.setattr(build, "enable_gradient_checkpointing", lambda m: done.append(("checkpointing", m)))
    monkeypatch.setattr(build, "compile_blocks", lambda m, backend, mode: done.append(("compile", backend, mode)) or 2)
    cfg = OmegaConf.create({"model": {"name": "tiny"}, "lora": {"name": "full"}, **switches})
    with caplog.at_level("INFO", logger="llasmol.train"):
        built, params = build.build_model(cfg, "tok")
    assert built is model and model.training and model.lora.training  # dropout draws, activations recompute
    assert done[0] == ("lora", ("base", "tok", None))
    assert (("checkpointing", model) in done) == checkpointed
    assert [d[1:] for d in done if d[0] == "compile"] == ([compiled] if compiled else [])
    assert params == {"model": "tiny", "lora": "full", "trainable": 6, "total": 12, "percent": 50.0}
    said = [r.getMessage() for r in caplog.records if r.name == "llasmol.train"]
    assert said[-1] == "tiny + LoRA full: 6 trainable of 12 parameters (50.00%)"
    if compiled:
        assert said[0] == "torch.compile (inductor): 2 transformer blocks, compiled at their first batch"


@pytest.mark.slow
def test_non_finite_loss_stops_training_with_one_line(tmp_path):
    proc = run_cli(["llasmol.train", "optimizer.lr=1e6", f"hydra.run.dir={tmp_path / 'run'}", *QUICK,
                    "trainer.max_steps=30", "val_every_n_steps=1"], tmp_path)
    error_line(proc, "optimizer.lr")
    # The checkpoints written before are whole: each loads and has its adapter.
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    assert ckpts, "validation every step: the steps before the blow-up left checkpoints"
    for ckpt in ckpts:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        assert state["state_dict"] and all(torch.isfinite(t).all() for t in state["state_dict"].values())
        assert (ckpt.with_name(ckpt.stem + ".adapter") / "adapter_model.safetensors").is_file()


def test_a_card_of_mixed_data_names_each_place_and_the_own_tasks_with_their_families(cfg_factory, tmp_path):
    """Own and SMolInstruct tasks trained together: the card says both places (the bundled excerpt by name, not
    this machine's path) and each own task's family, and its subject reads both."""
    from llasmol.data.source import BUNDLED_DATA, SMolInstructSource
    from llasmol.finetune.build import card_facts
    from llasmol.model.cards import trained_on

    table = tmp_path / "logp.csv"
    table.write_text("input,output,split\nCCO,-0.3,train\nCCCO,0.3,train\n")
    source = SMolInstructSource(path=str(BUNDLED_DATA), also=[str(table)], new_tasks={"logp": {"family": "number"}},
                                tasks=["property_prediction-esol", "logp"])
    datamodule = SimpleNamespace(**{**vars(_datamodule()), "source": source, "tasks": source.task_names()})
    facts = card_facts(cfg_factory(), {"trainable": 5}, datamodule, 3)
    assert facts["data"] == (f"SMolInstruct, the excerpt bundled with llasmol (a few hundred samples a task), "
                             f"{table.name}, a table of its own")
    assert facts["tasks"] == ["property_prediction-esol", "logp"] and facts["own_tasks"] == {"logp": "number"}
    assert trained_on(facts) == "SMolInstruct and tasks of its own (logp)"
    alone = SMolInstructSource(path=str(table), new_tasks={"logp": {"family": "number"}})
    only = card_facts(cfg_factory(), {}, SimpleNamespace(**{**vars(datamodule), "source": alone, "tasks": ["logp"]}), 1)
    assert trained_on(only) == "tasks of its own (logp)" and only["data"] == f"{table.name}, a table of its own"


def test_a_run_without_an_end_says_its_steps_and_rate_without_a_time_left(caplog, monkeypatch):
    """max_steps=-1 with max_epochs=-1 trains until stopped: Lightning's step estimate is infinite, and the line
    says so rather than failing mid-run."""
    from types import SimpleNamespace

    from llasmol.finetune import tracking

    clock = iter([100.0, 110.0])
    monkeypatch.setattr(tracking.time, "monotonic", lambda: next(clock))
    lines = tracking.ProgressLines(every_s=5)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, estimated_stepping_batches=float("inf"),
                              callback_metrics={})
    with caplog.at_level("INFO", logger="llasmol.train"):
        lines.on_train_start(trainer, None)
        trainer.global_step = 20
        lines.on_train_batch_end(trainer, None, None, None, 0)
    assert caplog.messages == ["training: from step 0, no end set; a line after the first step, then every 5s "
                               "(progress_every_s)", "training: 20 steps, 2.00 steps/s, no end set"]
