"""Every current architecture family trains end to end on CPU: a tiny random instance of each (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llasmol.train import train

# Small enough to run in seconds: one task, a 2-sample validation, 4 generated tokens.
QUICK = ["trainer.max_steps=3", "val_every_n_steps=2", "data.tasks=[forward_synthesis]",
         "data.max_samples_per_task={validation:2}", "generation.max_new_tokens_limit=4",
         "trainer.enable_progress_bar=false"]


@pytest.mark.slow
@pytest.mark.parametrize("arch,lora", [("tiny-llama3", "full"), ("tiny-qwen2", "full"), ("tiny-qwen3", "full"),
                                       ("tiny-gemma2", "plus"), ("tiny-olmo2", "full")])
def test_a_tiny_instance_trains_validates_and_saves(cfg_factory, tmp_path, arch, lora):
    from safetensors import safe_open

    result = train(cfg_factory("model=tiny", f"model.arch={arch}", f"lora={lora}", *QUICK))
    assert result["global_step"] == 3
    assert (tmp_path / "metrics" / "val-step2.json").is_file()
    adapter = Path(tmp_path / "checkpoints" / "last.adapter" / "adapter_model.safetensors")
    with safe_open(str(adapter), "pt") as fh:
        keys = list(fh.keys())
    # 2 layers × 7 projections × (A, B); `plus` also saves its head (Gemma 2's is tied to the embedding).
    assert sum(".lora_A." in k or ".lora_B." in k for k in keys) == 2 * 7 * 2
    assert any("lm_head" in k for k in keys) == (lora == "plus")
