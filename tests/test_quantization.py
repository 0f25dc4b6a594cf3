"""Quantised bases (QLoRA) and the paper's 8-bit AdamW, run for real on bitsandbytes' CPU backend."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from refusals import refused, refused_cli
from safetensors.torch import load_file

from llasmol.model.base import load_base_model, load_tokenizer, quantization_config
from llasmol.model.lora import apply_lora
from llasmol.model.memory import weight_bytes
from llasmol.core.schema import check_config

bnb = pytest.importorskip("bitsandbytes")

# Short runs: two validations on one sample a task, answers cut at 4 new tokens.
QUICK = ["trainer.enable_progress_bar=false", "data.max_samples_per_task={validation:2}",
         "callbacks.generation_evaluator.samples_per_task=1", "generation.max_new_tokens_limit=4",
         "trainer.log_every_n_steps=1"]


def _tiny(*overrides: str):
    cfg = compose_config(["paths.output_dir=/tmp/unused", *overrides])
    return cfg, load_tokenizer(cfg.model)


@pytest.mark.parametrize("compute_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("double_quant", [True, False])
def test_4bit_base_is_nf4_with_the_configured_compute_dtype_and_adapters_train_in_fp32(compute_dtype, double_quant):
    cfg, tok = _tiny("quantization=4bit", f"quantization.compute_dtype={compute_dtype}",
                     f"quantization.double_quant={str(double_quant).lower()}")
    model = apply_lora(load_base_model(cfg.model, tok, cfg.quantization), cfg.model, cfg.lora)
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(q.base_layer, bnb.nn.Linear4bit)
    state = q.base_layer.weight.quant_state
    assert state.quant_type == "nf4" and q.base_layer.compute_dtype == getattr(torch, compute_dtype)
    assert (state.nested is True) is double_quant
    assert not q.base_layer.weight.requires_grad
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert {type(m.base_layer).__name__ for m in model.modules() if hasattr(m, "lora_A") and len(m.lora_A)} == {"Linear4bit"}
    # One CPU kernel layout throughout: bitsandbytes would repack a layer's weights at its first eval forward (and
    # train with another kernel afterwards); every 4-bit layer that could is told not to.
    repacking = [m.support_avx512bf16_for_cpu for m in model.modules() if hasattr(m, "support_avx512bf16_for_cpu")]
    if hasattr(bnb.nn.Linear4bit(4, 4), "support_avx512bf16_for_cpu"):  # the CPU backend's switch, where it has one
        assert len(repacking) == 7 * 2 and not any(repacking)  # 7 projections in each of the 2 layers


def test_a_quantised_base_keeps_its_norms_in_fp32_and_a_plain_base_keeps_its_dtype():
    """QLoRA's preparation (PEFT's prepare_model_for_kbit_training) casts the unquantised weights to fp32 for
    stable k-bit training; a base that is not quantised is left in the dtype it was asked for."""
    cfg, tok = _tiny("quantization=4bit", "model.dtype=bfloat16")
    quantised = load_base_model(cfg.model, tok, cfg.quantization)
    assert quantised.model.layers[0].input_layernorm.weight.dtype == torch.float32
    cfg, tok = _tiny("model.dtype=bfloat16")
    plain = load_base_model(cfg.model, tok, cfg.quantization)
    assert plain.model.layers[0].input_layernorm.weight.dtype == torch.bfloat16


def test_8bit_base_is_llm_int8():
    cfg, tok = _tiny("quantization=8bit")
    model = apply_lora(load_base_model(cfg.model, tok, cfg.quantization), cfg.model, cfg.lora)
    layer = model.base_model.model.model.layers[1].mlp.down_proj.base_layer
    assert isinstance(layer, bnb.nn.Linear8bitLt) and layer.weight.dtype == torch.int8
    batch = tok(["<SMILES> CCO </SMILES>"], return_tensors="pt")
    loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert torch.isfinite(loss) and grads and any(g.abs().sum() > 0 for g in grads)


def test_the_quantised_tiny_base_is_the_random_base_quantised():
    """Evaluating an adapter on the quantised base must see the same base the run trained on: the random
    weights rebuilt from model.init_seed, then quantised (4-bit codes close to the fp32 weights)."""
    cfg, tok = _tiny("quantization=8bit")
    plain = load_base_model(cfg.model, tok).model.layers[0].mlp.up_proj.weight.detach()
    layer = load_base_model(cfg.model, tok, cfg.quantization).model.layers[0].mlp.up_proj
    dequantised = layer.weight.float() * layer.weight.SCB[:, None].float() / 127
    assert torch.allclose(dequantised, plain, atol=plain.abs().max().item() / 100)


@pytest.mark.parametrize("quantization", ["4bit", "8bit", "4bit quantization.double_quant=false"])
def test_weight_memory_counted_on_the_meta_device_is_what_bitsandbytes_stores(quantization):
    name, *extra = quantization.split()
    cfg, tok = _tiny(f"quantization={name}", *extra)
    real = load_base_model(cfg.model, tok, cfg.quantization)
    stored = sum(t.numel() * t.element_size() for t in real.state_dict().values())
    with torch.device("meta"):
        from llasmol.model.base import build_meta_model

        meta = build_meta_model(cfg.model, vocab_size=len(tok))
    sizes = weight_bytes(meta, torch.float32, cfg.quantization)
    layers = [m for m in real.modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]
    stored_layers = sum(t.numel() * t.element_size() for m in layers for t in m.state_dict().values())
    assert len(layers) == 14  # 2 blocks × 7 projections; the head stays unquantised
    # Only the serialised metadata of each layer (a few hundred bytes) is not counted.
    assert 0 <= stored_layers - sizes["quantized"] <= 200 * len(layers)
    assert sizes["total"] == pytest.approx(stored, rel=0.005)
    plain = weight_bytes(meta, torch.float32)
    assert plain["quantized"] == 0 and plain["total"] == sum(p.numel() for p in meta.parameters()) * 4


def test_weight_memory_of_a_7b_base_halves_and_quarters():
    from llasmol.model.counting import base_weight_bytes

    sizes = {q: base_weight_bytes(compose_config(["model=mistral", f"quantization={q}"], "params"))
             for q in ("none", "8bit", "4bit")}
    assert sizes["none"]["total"] == 2 * 7_241_732_096  # Mistral-7B-v0.1's parameters in bf16
    linear = sizes["none"]["total"] - sizes["4bit"]["other"]  # the quantisable layers, in bf16
    assert sizes["8bit"]["quantized"] / linear == pytest.approx(0.5, abs=0.002)
    assert sizes["4bit"]["quantized"] / linear == pytest.approx(0.258, abs=0.002)  # 4 bits + 1/8 bit of absmax
    assert sizes["4bit"]["training"] > sizes["4bit"]["total"]  # embeddings and head in fp32 for training
    # Double quantisation is bitsandbytes' default (and conf/quantization/4bit.yaml's): a setting without the key
    # counts it; without it each block of 64 weights keeps its absmax in 32 bits instead of about 8.1, some 0.37
    # bit a weight more.
    from llasmol.model.base import torch_dtype
    from llasmol.model.memory import weight_bytes
    from llasmol.model.counting import meta_base

    cfg = compose_config(["model=mistral", "quantization=4bit"], "params")
    base, dtype = meta_base(cfg), torch_dtype(cfg.model.dtype)
    assert weight_bytes(base, dtype, {"bits": 4, "double_quant": True})["quantized"] == sizes["4bit"]["quantized"]
    single = weight_bytes(base, dtype, {"bits": 4, "double_quant": False})["quantized"]
    assert (single - sizes["4bit"]["quantized"]) / linear == pytest.approx((32 - 8.127) / 64 / 16, abs=0.001)
    # What `params` prints of them (README: 13.49 GiB bf16, 3.84 GiB 4-bit, 4.33 GiB when training).
    from llasmol.model.memory import describe

    assert describe(sizes["none"], "bfloat16", compose_config(["quantization=none"]).quantization) == \
        "weights: 13.49 GiB in bfloat16"
    four = describe(sizes["4bit"], "bfloat16", compose_config(["quantization=4bit"]).quantization)
    assert four.startswith("weights: 3.84 GiB (4-bit nf4, double-quantised: ") and four.endswith(
        "4.33 GiB when training (the unquantised parts cast to fp32)"), four
    assert describe(sizes["8bit"], "bfloat16", compose_config(["quantization=8bit"]).quantization).startswith(
        "weights: 6.99 GiB (8-bit: 6.51 GiB in the quantised layers")


def test_bad_quantisation_settings_are_one_line():
    """The schema checks them, before anything is built; quantization_config takes what it let through."""
    from llasmol.core.schema import check_config

    for override, names in [("quantization.quant_type=nf5", ["quantization.quant_type='nf5'", "nf4, fp4"]),
                            ("quantization.double_quant=maybe", ["quantization.double_quant='maybe'"]),
                            ("quantization.bits=3", ["quantization.bits=3", "4, 8 or null"]),
                            ("~quantization.compute_dtype", ["quantization.bits=4", "quantization.compute_dtype"])]:
        with refused(*names):
            check_config(compose_config(["paths.output_dir=/x", "quantization=4bit", override]))
    bad = compose_config(["quantization=4bit"]).quantization
    bad.compute_dtype = "float8"  # a dtype name is the model's table's to know
    with refused("quantization.compute_dtype 'float8'"):
        quantization_config(bad)


@pytest.mark.parametrize("overrides, target, lr", [
    (["model=mistral", "quantization=4bit"], "bitsandbytes.optim.AdamW8bit", 1e-4),  # the paper setup's
    (["model=mistral", "quantization=8bit", "trainer=cpu"], "bitsandbytes.optim.AdamW8bit", 1e-4),
    (["quantization=4bit"], "torch.optim.AdamW", 3e-3),  # the tiny demo's, quantised or not
    (["model=mistral", "quantization=4bit", "optimizer=paged_adamw8bit"], "bitsandbytes.optim.PagedAdamW8bit", 1e-4),
    (["quantization=8bit", "optimizer=adamw8bit", "optimizer.lr=0.01"], "bitsandbytes.optim.AdamW8bit", 0.01),
    (["model=mistral", "optimizer=adamw", "experiment=lora_ablation"], "torch.optim.AdamW", 1e-4),
])
def test_the_optimizer_is_its_group_choice_and_the_recipe_keeps_its_settings(overrides, target, lr):
    """conf/optimizer/ picks the update, setup/demo.yaml or setup/paper.yaml its default, the recipe its lr; a
    choice on the command line wins over the setup's whatever else is chosen (quantisation included)."""
    cfg = compose_config([*overrides, "paths.output_dir=/x"])
    assert (cfg.optimizer._target_, cfg.optimizer.lr, cfg.optimizer.weight_decay) == (target, lr, 0.0)
    assert cfg.gradient_checkpointing is ("quantization=none" not in overrides and any(
        o.startswith("quantization=") for o in overrides))


def test_a_paged_optimizer_is_refused_on_a_cpu_and_runs_its_check_on_a_gpu_trainer():
    with refused("optimizer._target_=bitsandbytes.optim.PagedAdamW8bit", "trainer.accelerator=cpu",
                 "optimizer=adamw8bit"):
        check_config(compose_config(["quantization=4bit", "optimizer=paged_adamw8bit", "paths.output_dir=/x"]))
    check_config(compose_config(["quantization=4bit", "optimizer=adamw8bit", "paths.output_dir=/x"]))
    check_config(compose_config(["model=mistral", "quantization=4bit", "optimizer=paged_adamw8bit",
                                 "paths.output_dir=/x"]))  # trainer=gpu: paging is what it is for


def _rows(run: Path) -> list[dict]:
    with (run / "csv" / "metrics.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_qlora_trains_validates_saves_and_evaluates_on_cpu(cfg_factory, tmp_path, bits, recwarn):
    """QLoRA end to end on a CPU: train on the quantised tiny base, then evaluate the adapter on the
    unquantised base (the usual path) and on the quantised one."""
    from llasmol.evaluate import evaluate
    from llasmol.train import train

    tasks = "data.tasks=[name_conversion-s2f,property_prediction-bbbp]"
    result = train(cfg_factory(f"quantization={bits}", "optimizer=adamw8bit", "trainer.max_steps=4", "val_every_n_steps=2", tasks, *QUICK))
    assert result["global_step"] == 4
    hparams = (tmp_path / "csv" / "hparams.yaml").read_text()
    assert "bitsandbytes.optim.AdamW8bit" in hparams and f"bits: {bits[0]}" in hparams
    validations = [r for r in _rows(tmp_path) if r["val/loss"]]
    assert len(validations) == 2 and all(float(r["val/name_conversion-s2f/num_samples"]) == 1 for r in validations)
    # from_pretrained returns a model in eval mode, where LoRA dropout and activation checkpointing are off.
    assert not [w for w in recwarn if "in eval mode" in str(w.message)]
    adapter = tmp_path / "checkpoints" / "last.adapter"
    assert (adapter / "adapter_config.json").is_file()
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert len(lora_b) == 14 and all(t.dtype == torch.float32 for t in lora_b)
    assert all(t.abs().sum() > 0 for t in lora_b)  # trained: PEFT initialises lora_B to zeros

    common = [f"ckpt={adapter}", "data.split=test", "data.max_samples_per_task={test:2}",
              "generation.max_new_tokens_limit=4", tasks]
    for quantization in ("none", bits):
        out = tmp_path / f"eval-{quantization}"
        evaluated = evaluate(compose_config([f"paths.output_dir={out}", f"quantization={quantization}", *common,
                                             f"output={out / 'test.json'}"], "evaluate"))
        assert evaluated["metrics"]["name_conversion-s2f"]["num_samples"] == 2
        assert evaluated["metrics"]["property_prediction-bbbp"]["num_samples"] == 2


@pytest.mark.slow
def test_a_4bit_run_stopped_by_ctrl_c_resumes_to_the_unstopped_runs_losses(cfg_factory, tmp_path):
    """QLoRA stopped at the end of step 2 and continued: the 4-bit base is rebuilt as it was (the checkpoint
    holds only what trains), and every step's loss is the unstopped run's."""
    from llasmol.train import train

    args = ["quantization=4bit", "data.tasks=[name_conversion-s2f,property_prediction-bbbp]", *QUICK,
            "trainer.max_steps=4", "val_every_n_steps=4", "trainer.log_every_n_steps=1"]
    run, straight = tmp_path / "run", tmp_path / "straight"
    with pytest.raises(SystemExit):
        train(cfg_factory(*args, f"paths.output_dir={run}", "+callbacks.signal={_target_:test_resume.SignalAtStep,step:2}"))
    assert torch.load(run / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=True)["global_step"] == 2
    assert train(cfg_factory(*args, f"paths.output_dir={run}", "ckpt_path=last"))["global_step"] == 4
    train(cfg_factory(*args, f"paths.output_dir={straight}"))

    def losses(folder: Path) -> list[tuple[int, float]]:
        return [(int(r["step"]), round(float(r["train/loss"]), 5)) for r in _rows(folder) if r.get("train/loss")]

    assert [step for step, _ in losses(run)] == [1, 2, 3, 4]
    assert losses(run) == losses(straight)


@pytest.mark.slow
def test_the_paper_optimizer_lowers_the_loss_and_resumes_exactly_from_its_8bit_state(tmp_path):
    """`recipe=paper` on the tiny model with a small batch: bitsandbytes' AdamW8bit at the paper's lr 1e-4
    and weight decay, cosine schedule (warm-up scaled to the short run), accumulation 2. The loss falls, the
    checkpoint holds the 8-bit optimizer state, and a run stopped by SIGTERM between micro-batches resumes to
    the uninterrupted run's losses."""
    from llasmol.train import train

    run = ["recipe=paper", "data.effective_batch_size=8", "trainer.max_steps=24", "scheduler.num_warmup_steps=2",
           "val_every_n_steps=12", "checkpoint_every_n_steps=4", "callbacks.generation_evaluator.samples_per_task=0",
           "data.max_samples_per_task={validation:24}", "trainer.enable_progress_bar=false", "logger=csv",
           "+callbacks.recorder._target_=resume_probe.StepRecorder"]

    def fit(folder: Path, *extra: str) -> dict:
        cfg = compose_config([f"paths.output_dir={folder}", f"+callbacks.recorder.path={folder}.steps", *run, *extra])
        assert cfg.optimizer._target_ == "bitsandbytes.optim.AdamW8bit" and cfg.optimizer.lr == 1e-4
        assert cfg.optimizer.weight_decay == 0.0
        return train(cfg)

    def losses(folder: Path) -> list[tuple[int, float]]:
        lines = Path(f"{folder}.steps.0").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines)]

    reference = fit(tmp_path / "reference")
    val = [float(r["val/loss"]) for r in _rows(tmp_path / "reference") if r["val/loss"]]
    assert len(val) == 2 and val[1] < val[0] - 0.01  # the paper's lr moves the adapters within 24 steps
    state = torch.load(tmp_path / "reference" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    moments = [s.get("__bnb_optimizer_quant_state__", s) for s in state["optimizer_states"][0]["state"].values()]
    assert len(moments) == 28  # lora_A and lora_B of 14 projections
    # bitsandbytes keeps 8-bit moments for tensors of 4,096 elements and more (min_8bit_size; every adapter
    # of a 7B base): here the FFN's r x 256 and 256 x r matrices, 3 per block.
    kinds = [(s["state1"].dtype, s["state2"].dtype) for s in moments]
    assert kinds.count((torch.uint8, torch.uint8)) == 6 and kinds.count((torch.float32, torch.float32)) == 22

    stopped = tmp_path / "stopped"
    with pytest.raises(SystemExit) as stop:
        # Between the two micro-batches of step 9.
        fit(stopped, "+callbacks.stop._target_=resume_probe.SignalAt", "+callbacks.stop.signal=SIGTERM",
            "+callbacks.stop.step=9", "+callbacks.stop.micro_batch=1")
    assert stop.value.code == 143
    interrupted = torch.load(stopped / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=True)
    assert interrupted["global_step"] == 10  # the step in progress was finished first
    before = losses(stopped)
    resumed = fit(stopped, "ckpt_path=last")
    assert resumed["resumed_from"].endswith("interrupted.ckpt") and resumed["global_step"] == 24
    combined = losses(stopped)
    assert combined[:len(before)] == before and combined[len(before)][0] == 10
    assert [step for step, _ in combined] == [step for step, _ in losses(tmp_path / "reference")]
    assert [loss for _, loss in combined] == pytest.approx([loss for _, loss in losses(tmp_path / "reference")],
                                                           rel=1e-6)
    assert resumed["metrics"]["val/loss"] == pytest.approx(reference["metrics"]["val/loss"], rel=1e-6)


def test_quantised_layer_bytes_are_bitsandbytes_layout_counted_by_hand():
    """The byte counts of the module docstring, worked by hand for a 7B-sized 4096×4096 projection and for a
    3×5 layer whose 15 weights fill neither a byte pair nor a block (every count rounds up)."""
    from llasmol.model.memory import quantized_linear_bytes

    n = 4096 * 4096
    assert quantized_linear_bytes(4096, 4096, 8) == n + 4 * 4096  # int8 codes + one fp32 scale a row
    # 4-bit, double-quantised: n/2 packed codes; 262144 blocks of 64 with an 8-bit absmax each, 1024 fp32 scales
    # (one per 256 blocks), the 256-entry fp32 absmax code book and the 16-entry fp32 NF4 code book.
    assert quantized_linear_bytes(4096, 4096, 4) == 8_388_608 + 262_144 + 4 * 1024 + 1024 + 64
    assert quantized_linear_bytes(4096, 4096, 4, double_quant=False) == 8_388_608 + 4 * 262_144 + 64
    assert quantized_linear_bytes(3, 5, 8) == 15 + 12
    assert quantized_linear_bytes(3, 5, 4) == 8 + (1 + 4 + 1024) + 64
    assert quantized_linear_bytes(3, 5, 4, double_quant=False) == 8 + 4 + 64


def test_weight_bytes_of_a_small_stack_are_counted_by_hand():
    """Two linear layers and an output head: the head and every bias stay in the base's dtype; training casts
    them to fp32. A setting without `double_quant` double-quantises (bitsandbytes' default)."""
    from llasmol.model.memory import describe, quantized_linear_bytes

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 128)  # 8192 weights + 128 biases
            self.b = torch.nn.Linear(128, 64, bias=False)  # 8192 weights
            self.head = torch.nn.Linear(64, 10, bias=False)  # 640 weights, never quantised

        def get_output_embeddings(self):
            return self.head

    with torch.device("meta"):
        model = Tiny()
    plain = weight_bytes(model, torch.bfloat16)
    assert plain == {"quantized": 0, "other": 2 * (8192 + 128 + 8192 + 640),
                     "total": 2 * (8192 + 128 + 8192 + 640), "training": 2 * (8192 + 128 + 8192 + 640)}
    assert weight_bytes(model, torch.bfloat16, {"bits": None}) == plain
    layer = 4096 + (128 + 4 + 1024) + 64  # 8192 weights: 128 blocks, one nested scale
    assert quantized_linear_bytes(128, 64, 4) == quantized_linear_bytes(64, 128, 4) == layer
    four = weight_bytes(model, torch.bfloat16, {"bits": 4, "double_quant": True})
    assert four == {"quantized": 2 * layer, "other": 2 * (128 + 640), "total": 2 * layer + 2 * (128 + 640),
                    "training": 2 * layer + 4 * (128 + 640)}
    single = weight_bytes(model, torch.bfloat16, {"bits": 4, "double_quant": False})["quantized"]
    assert single == 2 * (4096 + 4 * 128 + 64)
    assert weight_bytes(model, torch.float16, {"bits": 8})["quantized"] == (8192 + 4 * 128) + (8192 + 4 * 64)
    # `describe` says what conf/quantization/4bit.yaml sets.
    gib = 1024 ** 3
    sizes = {"quantized": gib, "other": gib // 2, "total": 3 * gib // 2, "training": 2 * gib}
    assert describe(sizes, "bfloat16", {"bits": 4, "quant_type": "nf4", "double_quant": True}) == (
        "weights: 1.50 GiB (4-bit nf4, double-quantised: 1.00 GiB in the quantised layers, 0.50 GiB of embeddings, "
        "norms and head in bfloat16); 2.00 GiB when training (the unquantised parts cast to fp32)")
    assert describe(sizes, "float16", {"bits": 4, "quant_type": "fp4", "double_quant": False}).startswith(
        "weights: 1.50 GiB (4-bit fp4: 1.00 GiB")
    assert describe(sizes, "float16", None) == "weights: 1.50 GiB in float16"


def test_quantising_the_tiny_base_shows_no_progress_bars_and_leaves_the_setting_as_it_was(capfd):
    """The random base goes through a temporary folder (a few kB): transformers' bars for that are hidden,
    then put back as they were; checkpointing stays the `gradient_checkpointing` switch's business."""
    from transformers.utils import logging as hf_logging

    cfg, tok = _tiny("quantization=4bit")
    as_found = hf_logging.is_progress_bar_enabled()
    try:
        for before in (True, False):
            (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()
            capfd.readouterr()
            model = load_base_model(cfg.model, tok, cfg.quantization)
            err = capfd.readouterr().err
            assert "Loading weights" not in err and "Writing model shards" not in err, err[-500:]
            assert hf_logging.is_progress_bar_enabled() is before
            assert model.is_activation_checkpointing is False
    finally:
        (hf_logging.enable_progress_bar if as_found else hf_logging.disable_progress_bar)()


def test_4bit_settings_default_to_double_quantised_nf4_in_bfloat16():
    """quantization=4bit is QLoRA's: nf4, double quantisation, bfloat16 compute (conf/quantization/4bit.yaml)."""
    four = quantization_config(compose_config(["quantization=4bit"]).quantization)
    assert four.load_in_4bit is True and four.load_in_8bit is False
    assert four.bnb_4bit_quant_type == "nf4" and four.bnb_4bit_use_double_quant is True
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    eight = quantization_config(compose_config(["quantization=8bit"]).quantization)
    assert eight.load_in_8bit is True and eight.load_in_4bit is False
    assert quantization_config(None) is None and quantization_config({"bits": None}) is None


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_a_paged_optimizer_without_cuda_ends_with_one_line(tmp_path):
    """Quantised bases run on a CPU (bitsandbytes' CPU backend); only paging optimizer state needs CUDA."""
    refused_cli(["llasmol.train", "quantization=4bit", "optimizer=paged_adamw8bit",
                 f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                "optimizer._target_=bitsandbytes.optim.PagedAdamW8bit", "optimizer=adamw8bit")
