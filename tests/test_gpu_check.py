"""bench/gpu_check.py: its FLOPs count for Mistral-7B, and a dry run of the whole script on CPU."""

from __future__ import annotations

import json
import os
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


# The lent GPU machine's image (issue #36): these distributions and what they require, nothing else. It lacks
# the rest of llasmol's requirements; bench/gpu_check.sh brings the ones it needs from bench/wheels/.
IMAGE = ("torch", "transformers", "peft", "lightning", "safetensors", "accelerate", "pytest")
NOT_IN_IMAGE = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "bitsandbytes", "rdkit", "wandb"}


def image_like_venv(root: Path) -> Path:
    """A fresh virtual environment that holds the GPU image's packages alone, linked from this one (their CPU
    builds): the distributions of `IMAGE` and every one they require. Returns its python."""
    import importlib.metadata as metadata
    import re

    from packaging.requirements import Requirement

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python*/site-packages"))
    todo, found = list(IMAGE), {}
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement this machine does not have
        found[name] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    assert not set(found) & NOT_IN_IMAGE, sorted(set(found) & NOT_IN_IMAGE)
    for dist in found.values():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return root / "bin" / "python"


@pytest.mark.slow
def test_the_check_starts_on_the_bare_gpu_image_with_the_fetched_wheels(tmp_path):
    """bench/gpu_check.sh --dry-run in an environment of the image's packages only: it unpacks hydra, omegaconf,
    antlr4 and bitsandbytes from bench/wheels/ and runs its three parts (LoRA steps and beam search, QLoRA,
    FSDP2 through Lightning) tiny on CPU."""
    wheels = sorted(p.name.split("-")[0] for p in (ROOT / "bench" / "wheels").glob("*.whl"))
    assert wheels == ["antlr4_python3_runtime", "bitsandbytes", "hydra_core", "omegaconf"], \
        "fetch the GPU machine's wheels first: bash bench/gpu_wheels.sh (.ci/run does)"
    python = image_like_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHON=str(python), GPU_CHECK_OUT=str(tmp_path / "out"))
    bare = subprocess.run([str(python), "-c", "import torch, transformers, peft, lightning\nimport hydra"], env=env,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert "No module named 'hydra'" in bare.stderr  # the image's packages are there, hydra is not
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--peak-tflops", "0.5"], env=env,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for wheel in wheels:
        assert f"unpacked {wheel}-" in proc.stdout
    results = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}
    assert sorted(results) == ["gpu_check", "gpu_check_fsdp2", "gpu_check_fsdp2_whole", "gpu_check_qlora"]
    assert "== GRPO beside TRL skipped: python has no rdkit, trl or datasets" in proc.stdout  # said, not failed
    train = results["gpu_check"]["train"]
    assert results["gpu_check"]["optimizer"] == "adamw8bit"  # bitsandbytes' 8-bit AdamW, from its wheel
    assert train["tokens_per_sec"] == pytest.approx(2 * 2 * 32 / train["seconds"], rel=1e-3, abs=0.05)  # 0.1 rounding
    assert train["mfu"] == pytest.approx(train["model_tflops_per_sec"] / 0.5, abs=1e-4)
    assert train["last_loss"] != train["first_loss"]  # the optimizer steps do move the loss
    beam = results["gpu_check"]["beam_search"]
    assert (beam["sequences"], beam["new_tokens_per_sequence"]) == (2 * 1, 4)
    qlora = results["gpu_check_qlora"]
    assert (qlora["quantization"], qlora["layers"]) == ("4bit", 1)
    assert qlora["train"]["last_loss"] != qlora["train"]["first_loss"]
    for case in ("fsdp2", "fsdp2_whole"):  # the host's and the device's peak of each way to build the base
        fsdp = results[f"gpu_check_{case}"]
        assert (fsdp["case"], fsdp["processes"], fsdp["ranks"][0]["resumed_steps"]) == (case, 1, 1)
        assert fsdp["checkpoint_bytes"] > 0 and fsdp["parameter_bytes_held_per_process"][0] > 0
        assert fsdp["peak_rss_mib_per_process"][0] > 0 and fsdp["first_step_seconds"] > 0


def test_asking_for_a_gpu_without_one_is_one_line():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=HANG_TIMEOUT)
    assert proc.returncode == 1 and proc.stderr.strip().startswith("error: --device cuda but no CUDA GPU")
