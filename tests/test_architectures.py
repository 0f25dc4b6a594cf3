"""Every current architecture family runs the default job end to end on CPU: a tiny random instance of each
trains, validates with generation and metrics, saves, is evaluated and resumes (issue 25).

Mistral's (`model=tiny`'s own tiny-mistral) is the rest of the suite's model: tests/test_evaluate.py and
tests/test_resume.py run the same steps on it.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from conftest import compose_config
from refusals import refused
from llasmol.evaluate import evaluate
from llasmol.train import train

# Small enough to run in seconds: one task, batches of 4, a 2-sample validation, 4 generated tokens, a loss
# row every step.
QUICK = ["val_every_n_steps=2", "data.tasks=[forward_synthesis]", "data.micro_batch_size=4",
         "data.effective_batch_size=4", "data.max_samples_per_task={validation:2}",
         "generation.max_new_tokens_limit=4", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1"]


def logged_losses(run: Path) -> dict[int, float]:
    """step -> train/loss of the run's csv/metrics.csv (each step's row once)."""
    with (run / "csv" / "metrics.csv").open(newline="") as fh:
        rows = [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(fh) if r.get("train/loss")]
    assert len(rows) == len({s for s, _ in rows}), rows
    return dict(rows)


def adapter_tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def saved_adapter_is_the_checkpoints(run: Path) -> dict:
    """checkpoints/last.adapter's tensors, each checked equal to the resume checkpoint's copy of it."""
    import torch

    saved = adapter_tensors(run / "checkpoints" / "last.adapter")
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    for key, tensor in saved.items():
        name = key.removeprefix("base_model.")
        [match] = [v for k, v in state.items()
                   if k.replace(".modules_to_save", "").replace(".default", "").endswith(name)]
        assert torch.equal(match, tensor), key
    return saved


@pytest.mark.slow
@pytest.mark.parametrize("arch,lora", [("tiny-llama3", "full"), ("tiny-qwen2", "full"), ("tiny-qwen3", "full"),
                                       ("tiny-gemma2", "plus"), ("tiny-olmo2", "full")])
def test_a_tiny_instance_trains_validates_saves_evaluates_and_resumes(cfg_factory, tmp_path, arch, lora):
    import torch
    from omegaconf import OmegaConf

    run = tmp_path / "run"
    job = ["model=tiny", f"model.arch={arch}", f"lora={lora}", *QUICK]
    cfg = cfg_factory(*job, "trainer.max_steps=3", f"paths.output_dir={run}")
    result = train(cfg)
    assert result["global_step"] == 3
    assert (run / "metrics" / "val-step2.json").is_file()
    saved = saved_adapter_is_the_checkpoints(run)
    # 2 layers × 7 projections × (A, B); `plus` also saves its head (Gemma 2's is tied to the embedding).
    assert sum(".lora_A." in k or ".lora_B." in k for k in saved) == 2 * 7 * 2
    assert any("lm_head" in k for k in saved) == (lora == "plus")

    # Evaluate the run directory as `python -m llasmol.evaluate ckpt=<run>` does (it reads .hydra/config.yaml).
    (run / ".hydra").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    scored = tmp_path / "eval"
    evaluate(compose_config([f"paths.output_dir={scored}", f"ckpt={run}", "data.split=test",
                             "data.max_samples_per_task={test:2}", "generation.max_new_tokens_limit=4"], "evaluate"))
    metrics = json.loads((scored / "metrics" / "test.json").read_text())
    assert list(metrics) == ["forward_synthesis"] and metrics["forward_synthesis"]["num_samples"] == 2
    for name in ("exact_match", "top1_exact_match", "validity", "num_no_answer"):
        assert math.isfinite(metrics["forward_synthesis"][name]), (name, metrics)
    assert len((scored / "predictions" / "test.jsonl").read_text().splitlines()) == 2

    # The same job stopped after step 2 (its end: last.ckpt and last.adapter), then resumed to step 3 with
    # ckpt_path=last, continues as the run above: the same loss at every step, the same final adapter.
    # (Generation at validation draws nothing training uses: left out here, to save time.)
    again = [*job, "callbacks.generation_evaluator.samples_per_task=0"]
    stopped = tmp_path / "stopped"
    train(cfg_factory(*again, "trainer.max_steps=2", f"paths.output_dir={stopped}"))
    saved_adapter_is_the_checkpoints(stopped)
    resumed = train(cfg_factory(*again, "trainer.max_steps=3", f"paths.output_dir={stopped}", "ckpt_path=last"))
    assert resumed["resumed_from"] == str(stopped / "checkpoints" / "last.ckpt") and resumed["global_step"] == 3
    losses, expected = logged_losses(stopped), logged_losses(run)
    assert sorted(losses) == sorted(expected) == [1, 2, 3]  # rows at the optimizer steps completed
    assert [losses[s] for s in (1, 2, 3)] == pytest.approx([expected[s] for s in (1, 2, 3)], rel=1e-5)
    assert resumed["metrics"]["val/loss"] == pytest.approx(result["metrics"]["val/loss"], rel=1e-5)
    final = saved_adapter_is_the_checkpoints(stopped)
    for key, tensor in saved.items():
        assert torch.allclose(final[key], tensor, rtol=1e-4, atol=1e-7), key


def test_missing_special_tokens_are_named_by_the_config_ids_that_fit_the_vocabulary():
    """Galactica's case (`complete_special_tokens`): bos 0 names token 0; an id past the vocabulary or not an
    integer names nothing; a token the tokenizer already has is kept."""
    from transformers import PreTrainedTokenizerFast

    from llasmol.model.base import TINY_TOKENIZER_DIR, complete_special_tokens

    tok = PreTrainedTokenizerFast.from_pretrained(str(TINY_TOKENIZER_DIR))
    size = len(tok)
    tok.bos_token = tok.eos_token = tok.pad_token = None
    complete_special_tokens(tok, {"bos_token_id": 0, "eos_token_id": size, "pad_token_id": "3"})
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<unk>", None, None)
    complete_special_tokens(tok, {"bos_token_id": 1, "eos_token_id": size - 1, "pad_token_id": 3})
    assert tok.bos_token == "<unk>"  # already named: kept
    assert tok.eos_token == tok.convert_ids_to_tokens(size - 1) and tok.pad_token == "<pad>"
    assert len(tok) == size  # existing entries made special: no new ids


def test_the_meta_model_takes_the_vocabulary_size_asked_or_the_architectures():
    from llasmol.model.base import arch_facts, build_meta_model

    cfg = compose_config(["paths.output_dir=/tmp/unused"])
    assert build_meta_model(cfg.model, vocab_size=1000).get_input_embeddings().weight.shape[0] == 1000
    assert build_meta_model(cfg.model).get_input_embeddings().weight.shape[0] == arch_facts("tiny-mistral")["vocab_size"]


def test_the_random_base_is_rebuilt_from_its_init_seed():
    """Every model config states init_seed (0, conf/model_family/base.yaml); the same seed, the same base."""
    import torch

    from llasmol.model.base import load_base_model, load_tokenizer

    cfg = compose_config(["paths.output_dir=/tmp/unused", "model.random_init=true"]).model
    assert cfg.init_seed == 0 and compose_config(["model=mistral", "paths.output_dir=/x"]).model.init_seed == 0
    tok = load_tokenizer(cfg)
    seeded = load_base_model(cfg, tok).model.layers[0].mlp.up_proj.weight
    assert torch.equal(load_base_model(cfg, tok).model.layers[0].mlp.up_proj.weight, seeded)
    cfg.init_seed = 1
    assert not torch.equal(load_base_model(cfg, tok).model.layers[0].mlp.up_proj.weight, seeded)


def test_packing_is_refused_for_a_base_outside_the_llama_and_mistral_families_saying_why():
    from omegaconf import OmegaConf

    from llasmol.model.base import check_packing

    for arch, name, why in (("galactica-6.7b", "galactica", "opt, whose positions come from the attention mask"),
                            ("gemma2-9b", "gemma2", "gemma2, whose packed attention is not yet checked against "
                                                    "padded batches")):
        with refused("data.packing=true", f"model={name} is {why}", "data.packing=false"):
            check_packing(OmegaConf.create({"arch": arch, "name": name}))
    for arch in ("tiny-mistral", "llama2-7b"):
        check_packing(OmegaConf.create({"arch": arch, "name": arch}))
