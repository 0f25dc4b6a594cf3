"""bench/gpu_check.py: its FLOPs count for Mistral-7B, and a dry run of the whole script on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def test_lora_step_flops_of_mistral_7b():
    from gpu_check import flops_per_token

    from conftest import compose_config
    from llasmol.model.base import arch_config, build_meta_model
    from llasmol.model.lora import apply_lora

    cfg = compose_config(["model=mistral", "lora=full"], config_name="params")
    model = apply_lora(build_meta_model(cfg.model), cfg.model, cfg.lora)
    d, ffn, kv, layers, vocab = 4096, 14336, 1024, 32, 32000
    frozen = layers * (2 * d * d + 2 * d * kv + 3 * d * ffn) + vocab * d  # blocks' matmuls + output head
    adapters = 41_943_040  # the paper's Mistral-7B `full` count (python -m llasmol.params)
    attention = 12 * layers * 512 * d
    assert flops_per_token(model, arch_config("mistral-7b"), 512) == 4 * frozen + 6 * adapters + attention


def _dry_run(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """bench/gpu_check.py on the tiny architecture on CPU, one warm-up step: its process and JSON result."""
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--arch", "tiny-mistral", "--device",
                           "cpu", "--warmup", "1", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_dry_run_on_cpu_reports_throughput_memory_and_mfu(tmp_path):
    proc, result = _dry_run(tmp_path, "--steps", "3", "--micro-batch", "2", "--seq-len", "32", "--prompts", "2",
                            "--prompt-len", "8", "--new-tokens", "5", "--beams", "3", "--returns", "2",
                            "--peak-tflops", "0.5")
    train = result["train"]
    assert train["tokens_per_sec"] == pytest.approx(3 * 2 * 32 / train["seconds"], rel=1e-3, abs=0.05)  # 0.1 rounding
    assert train["mfu"] == pytest.approx(train["model_tflops_per_sec"] / 0.5, abs=1e-4)
    assert train["last_loss"] < train["first_loss"]  # 4 optimizer steps on random tokens do move the loss
    beam = result["beam_search"]
    assert (beam["sequences"], beam["new_tokens_per_sequence"]) == (2 * 2, 5)
    assert "tokens/s" in proc.stdout


@pytest.mark.slow
def test_dry_run_of_the_qlora_check_on_cpu(tmp_path):
    """The QLoRA part of the GPU check loads a quantised base through llasmol's loader and trains on it."""
    _, result = _dry_run(tmp_path, "--quantization", "4bit", "--layers", "1", "--steps", "2", "--micro-batch", "2",
                         "--seq-len", "16", "--prompts", "1", "--prompt-len", "4", "--new-tokens", "2", "--beams", "2",
                         "--returns", "1", "--gradient-checkpointing")
    assert (result["quantization"], result["layers"]) == ("4bit", 1)
    assert result["train"]["last_loss"] != result["train"]["first_loss"]


def test_asking_for_a_gpu_without_one_is_one_line():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=HANG_TIMEOUT)
    assert proc.returncode == 1 and proc.stderr.strip().startswith("error: --device cuda but no CUDA GPU")
