"""Scale-out presets: every trainer × quantization composes; FSDP wraps LoRA-aware; switches keep the math."""

from __future__ import annotations

import hydra
import pytest
import torch

from conftest import compose_config
from llasmol.model.blocks import clean_name
from llasmol.finetune.distributed import LoRAFSDPStrategy, check_trainer, lora_wrap_policy
from llasmol.core.errors import UserError
from llasmol.model.blocks import compile_blocks, decoder_layer_types, enable_gradient_checkpointing
from test_lora import tiny_peft_model

TRAINERS = {  # preset: (strategy, precision)
    "cpu": ("auto", "32-true"),
    "gpu": ("auto", "bf16-mixed"),
    "ddp": ("ddp", "bf16-mixed"),
    "fsdp": ("llasmol.finetune.distributed.LoRAFSDPStrategy", "bf16-mixed"),
    "deepspeed": ("lightning.pytorch.strategies.DeepSpeedStrategy", "bf16-mixed"),
}
QUANT = {"none": (None, "bitsandbytes.optim.AdamW8bit", False),
         "8bit": (8, "bitsandbytes.optim.PagedAdamW8bit", True),
         "4bit": (4, "bitsandbytes.optim.PagedAdamW8bit", True)}


@pytest.mark.parametrize("quant", list(QUANT))
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_every_trainer_and_quantization_composes(trainer, quant):
    cfg = compose_config(["model=mistral", f"trainer={trainer}", f"quantization={quant}", "paths.output_dir=/x"])
    strategy, precision = TRAINERS[trainer]
    got = cfg.trainer.get("strategy", "auto")
    assert (got["_target_"] if hasattr(got, "get") else got) == strategy
    assert cfg.trainer.precision == precision
    bits, optimizer, checkpointing = QUANT[quant]
    assert cfg.quantization.bits == bits
    if trainer == "cpu":  # a CPU run has nothing to page optimizer state to
        optimizer = optimizer.replace("Paged", "")
    assert cfg.optimizer._target_ == optimizer and cfg.optimizer.lr == 1e-4  # the recipe's settings survive
    assert cfg.gradient_checkpointing is checkpointing
    assert cfg.data.effective_batch_size == 512 and cfg.model.dtype == "bfloat16"
    assert cfg.trainer.use_distributed_sampler is False  # our sampler shards by rank on every preset


def test_accumulation_follows_devices_times_nodes():
    cfg = compose_config(["model=mistral", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=4",
                          "trainer.num_nodes=2", "paths.output_dir=/x", "logger=none"])
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=[], logger=False)
    assert trainer.world_size == 8
    from transformers import PreTrainedTokenizerFast

    from llasmol.model.base import TINY_TOKENIZER_DIR

    dm = hydra.utils.instantiate(cfg.data, tokenizer=PreTrainedTokenizerFast.from_pretrained(str(TINY_TOKENIZER_DIR)))
    assert dm.gradient_accumulation(trainer.world_size) == 16  # 512 = micro-batch 4 × 16 × 8 processes


def test_sharded_strategies_stop_in_one_line_without_gpus():
    fsdp = compose_config(["model=mistral", "trainer=fsdp", "paths.output_dir=/x"]).trainer
    with pytest.raises(UserError, match="trainer=fsdp shards the model over GPUs .* trainer=ddp trainer.accelerator=cpu"):
        check_trainer(fsdp)
    deepspeed = compose_config(["model=mistral", "trainer=deepspeed", "paths.output_dir=/x"]).trainer
    with pytest.raises(UserError, match="deepspeed"):
        check_trainer(deepspeed)
    check_trainer(compose_config(["paths.output_dir=/x"]).trainer)  # cpu: fine


def test_fsdp_preset_builds_its_strategy():
    cfg = compose_config(["model=mistral", "trainer=fsdp", "paths.output_dir=/x"])
    strategy = hydra.utils.instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, LoRAFSDPStrategy)
    assert strategy.kwargs["use_orig_params"] is True  # frozen and trainable tensors side by side


@pytest.mark.parametrize("family", ["mistral", "galactica"])
@pytest.mark.parametrize("lora", ["lite", "plus"])
def test_fsdp_wraps_each_block_and_each_adapter_and_nothing_else(family, lora):
    model = tiny_peft_model(family, lora)
    policy = lora_wrap_policy(decoder_layer_types(model))
    units = {name for name, m in model.named_modules() if name and policy(m, recurse=False, nonwrapped_numel=0)}
    layers = "base_model.model.model.decoder.layers" if family == "galactica" else "base_model.model.model.layers"
    blocks = {f"{layers}.{i}" for i in range(2)}
    adapters = {name for name, m in model.named_modules() if name.endswith((".lora_A.default", ".lora_B.default"))}
    head = {"base_model.model.lm_head.modules_to_save.default"} if lora == "plus" else set()
    assert units == blocks | adapters | head
    assert len(adapters) == 2 * 2 * (2 if lora == "lite" else 6 if family == "galactica" else 7)
    # Inside a unit nothing trainable is left over: every trainable tensor is in an adapter unit.
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(any(n.startswith(u + ".") for u in adapters | head) for n in trainable)


def test_wrapper_prefixes_do_not_reach_checkpoint_names():
    assert clean_name("model._fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.q_proj.lora_A.default.weight") \
        == "model.layers.0.q_proj.lora_A.default.weight"


def _loss_and_grads(model, batch):
    torch.manual_seed(1)  # same dropout masks for both models
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _batch(model):
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    plain, checkpointed = tiny_peft_model("mistral", "full"), tiny_peft_model("mistral", "full")
    plain.train(), checkpointed.train()
    enable_gradient_checkpointing(checkpointed)
    assert checkpointed.base_model.model.model.gradient_checkpointing
    batch = _batch(plain)
    loss_a, grads_a = _loss_and_grads(plain, batch)
    loss_b, grads_b = _loss_and_grads(checkpointed, batch)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 2 * 2 * 7
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7)


def test_compiled_blocks_keep_names_and_numbers():
    plain, compiled = tiny_peft_model("mistral", "lite"), tiny_peft_model("mistral", "lite")
    assert compile_blocks(compiled, backend="eager") == 2  # the eager backend traces without generating code
    assert list(plain.state_dict()) == list(compiled.state_dict())
    batch = _batch(plain)
    loss_a, grads_a = _loss_and_grads(plain, batch)
    loss_b, grads_b = _loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss_a, loss_b)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name])


def test_switches_reach_the_training_model(cfg_factory):
    from llasmol.model.base import load_tokenizer
    from llasmol.finetune.build import build_model

    cfg = cfg_factory("gradient_checkpointing=true", "compile.enabled=true", "compile.backend=eager")
    model, params = build_model(cfg, load_tokenizer(cfg.model))
    assert model.base_model.model.model.gradient_checkpointing
    blocks = model.base_model.model.model.layers
    assert all(b._compiled_call_impl is not None for b in blocks)
    assert params["trainable"] == 65_536  # compiling and checkpointing add no parameters


def test_slurm_launcher_maps_the_trainer_onto_jobs():
    from hydra import compose, initialize_config_dir

    from llasmol.core.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "model=mistral", "trainer.num_nodes=2",
                                          "hydra.launcher.partition=a100", "hydra.launcher.gpus_per_node=8"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert (launcher.partition, launcher.nodes, launcher.gpus_per_node, launcher.tasks_per_node) == ("a100", 2, 8, 8)


@pytest.mark.slow
def test_multirun_through_the_submitit_launcher(tmp_path):
    """The launcher the SLURM preset builds on, in its local mode: each variant a job of its own process."""
    import json

    from test_train import run_cli

    sweep = tmp_path / "sweep"
    proc = run_cli(["llasmol.train", "--multirun", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}",
                    "lora=lite,attn", "trainer.max_steps=2", "val_every_n_steps=2", "logger=csv",
                    "trainer.enable_progress_bar=false", "callbacks.generation_evaluator.samples_per_task=1",
                    "generation.max_new_tokens_limit=4", "data.max_samples_per_task={validation:4}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/result.json")}
    assert sorted(results) == ["0_tiny_lite", "1_tiny_attn"]
    from llasmol.params import count_trainable

    expected = [count_trainable(compose_config([f"lora={v}"], config_name="params"))["trainable"] for v in ("lite", "attn")]
    assert [results[k]["params"]["trainable"] for k in sorted(results)] == expected and expected[0] < expected[1]
    assert all(r["global_step"] == 2 and "val/loss" in r["metrics"] for r in results.values())
    assert (sweep / ".submitit").is_dir()  # the jobs really went through submitit
    assert f"sweep folder: {sweep.resolve()}" in proc.stdout and f"python -m llasmol.report {sweep.resolve()}" in proc.stdout


def test_norm_clipping_under_fsdp_goes_through_the_sharded_root(monkeypatch):
    """The paper recipe clips at norm 1.0. Lightning's FSDP precision plugin refuses norm clipping, so the
    strategy routes it to the FSDP root (global norm over all shards); here on one CPU process with gloo."""
    import torch.distributed as dist
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from lightning.pytorch.utilities.exceptions import MisconfigurationException
    from torch.distributed.fsdp import FullyShardedDataParallel

    from conftest import free_port
    from llasmol.finetune.lightning_private import clip_norm_through_root

    precision = FSDPPrecision("32-true")
    with pytest.raises(MisconfigurationException, match="norm"):
        precision.clip_gradients(None, 1.0, "norm")  # why the strategy steps in
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        root = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)),
                                        device_id=torch.device("cpu"))
        root(torch.randn(3, 4)).pow(2).sum().mul(100).backward()
        norm = lambda: float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in root.parameters()])))  # noqa: E731
        assert norm() > 10
        clip_norm_through_root(precision, root)
        precision.clip_gradients(None, 1.0, "norm")  # what Lightning calls with gradient_clip_val=1.0
        assert norm() == pytest.approx(1.0, rel=1e-5)
    finally:
        dist.destroy_process_group()


def _plain_mistral():
    from transformers import AutoModelForCausalLM

    from llasmol.model.base import arch_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(arch_config("mistral-7b", hidden_size=32, intermediate_size=64,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2, vocab_size=64))


def test_checkpointing_a_model_without_adapters_is_non_reentrant_and_turns_the_cache_off():
    base = _plain_mistral()
    assert base.config.use_cache is True
    enable_gradient_checkpointing(base)  # no PEFT wrapper: the model is its own base
    assert base.model.gradient_checkpointing and base.config.use_cache is False
    replay = base.model.layers[0]._gradient_checkpointing_func
    assert replay.keywords == {"use_reentrant": False}  # frozen embeddings need no gradient, dropout replays


def test_compile_blocks_compiles_each_block_and_only_the_blocks():
    base = _plain_mistral()
    assert compile_blocks(base, backend="eager") == 2
    compiled = {name for name, m in base.named_modules() if m._compiled_call_impl is not None}
    assert compiled == {"model.layers.0", "model.layers.1"}
    assert decoder_layer_types(base) == (type(base.model.layers[0]),)
    with pytest.raises(ValueError, match="no transformer block classes found in Linear"):
        decoder_layer_types(torch.nn.Linear(2, 2))


def test_the_lora_wrap_policy_looks_inside_everything_and_wraps_blocks_and_trainable_leaves():
    block = torch.nn.TransformerEncoderLayer(4, 1)
    policy = lora_wrap_policy((torch.nn.TransformerEncoderLayer,))
    frozen, trainable, bare = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.ReLU()
    frozen.requires_grad_(False)
    half = torch.nn.Linear(2, 2)
    half.bias.requires_grad_(False)  # a leaf only partly trainable stays inside its block
    parent = torch.nn.Sequential(torch.nn.Linear(2, 2))  # trainable, but not a leaf
    assert all(policy(m, recurse=True, nonwrapped_numel=0) for m in (frozen, bare, parent, block))
    assert [policy(m, recurse=False, nonwrapped_numel=0) for m in (block, trainable, frozen, bare, half, parent)] == \
        [True, True, False, False, False, False]


def test_the_lora_fsdp_strategy_derives_its_policy_from_the_models_blocks():
    class Block(torch.nn.Module):  # a transformer block, as the model's _no_split_modules names it
        pass

    model = torch.nn.Sequential(Block(), torch.nn.Linear(2, 2))
    model._no_split_modules = ["Block"]
    model[1].requires_grad_(False)
    policy = LoRAFSDPStrategy().wrap_policy(model)
    assert policy(model[0], recurse=False, nonwrapped_numel=0) is True
    assert policy(model[1], recurse=False, nonwrapped_numel=0) is False


@pytest.mark.parametrize("trainer_cfg, cuda, message", [
    ({"strategy": "fsdp", "accelerator": "gpu"}, False, "trainer=fsdp shards the model over GPUs and this machine has "
     "none (accelerator=gpu): on CPU use trainer=ddp trainer.accelerator=cpu trainer.devices=2"),
    ({"strategy": {"_target_": "llasmol.finetune.distributed.LoRAFSDPStrategy"}, "accelerator": "cpu"}, True,
     "trainer=fsdp shards the model over GPUs and this machine has none (accelerator=cpu)"),
    ({"strategy": "deepspeed_stage_3", "accelerator": "cpu"}, True, "trainer=deepspeed shards the model over GPUs"),
    ({"strategy": "fsdp", "accelerator": "gpu"}, True, None),  # a GPU machine runs it
    ({"strategy": "ddp", "accelerator": "cpu"}, False, None),
    ({"strategy": None, "accelerator": "cpu"}, False, None),
    ({"accelerator": "cpu"}, False, None),
])
def test_a_sharded_strategy_needs_gpus_and_its_package(trainer_cfg, cuda, message, monkeypatch):
    import importlib.util

    from omegaconf import OmegaConf

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: "spec")  # DeepSpeed installed
    cfg = OmegaConf.create(trainer_cfg)
    if message is None:
        check_trainer(cfg)
        return
    with pytest.raises(UserError) as err:
        check_trainer(cfg)
    assert str(err.value).startswith(message)


def test_deepspeed_without_its_package_says_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError) as err:
        check_trainer({"strategy": "deepspeed", "accelerator": "gpu"})
    assert str(err.value) == ('trainer=deepspeed needs the DeepSpeed package: pip install -e ".[deepspeed]" (on a CUDA '
                              "machine), or use trainer=fsdp")


@pytest.mark.parametrize("target, accelerator, cuda, refused", [
    ("bitsandbytes.optim.PagedAdamW8bit", "gpu", True, False),
    ("bitsandbytes.optim.PagedAdamW8bit", "gpu", False, True),
    ("bitsandbytes.optim.PagedAdamW8bit", "cpu", True, True),
    ("bitsandbytes.optim.AdamW8bit", "cpu", False, False),
    ("torch.optim.AdamW", "cpu", False, False),
])
def test_a_paged_optimizer_needs_a_gpu(target, accelerator, cuda, refused, monkeypatch):
    from llasmol.finetune.distributed import check_optimizer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    trainer = {"accelerator": accelerator}
    if not refused:
        check_optimizer({"_target_": target}, trainer)
        return
    with pytest.raises(UserError) as err:
        check_optimizer({"_target_": target}, trainer)
    assert str(err.value) == (f"optimizer._target_={target} pages its state through CUDA memory and this run has no GPU "
                              f"(trainer.accelerator={accelerator}): use optimizer._target_=bitsandbytes.optim.AdamW8bit "
                              "(the same update, unpaged)")


def test_no_optimizer_config_is_no_paged_optimizer():
    from llasmol.finetune.distributed import check_optimizer

    check_optimizer(None, {"accelerator": "cpu"})
    check_optimizer({}, {"accelerator": "cpu"})


def test_adapters_are_gathered_whole_under_zero_3_and_taken_from_the_strategy_otherwise(monkeypatch):
    import sys
    from contextlib import contextmanager
    from types import SimpleNamespace

    from llasmol.finetune.distributed import module_state_dict

    gathered = []

    @contextmanager
    def gathered_parameters(params):  # DeepSpeed's: the partitioned tensors whole inside the block
        gathered.append(len(params))
        yield

    monkeypatch.setitem(sys.modules, "deepspeed", SimpleNamespace(zero=SimpleNamespace(GatheredParameters=gathered_parameters)))
    module = torch.nn.Module()
    module.model = torch.nn.Module()
    module.model._checkpoint_wrapped_module = torch.nn.Linear(2, 2)  # a wrapper's prefix, not in checkpoint names
    module.frozen = torch.nn.Linear(2, 2)
    module.frozen.requires_grad_(False)
    zero3 = SimpleNamespace(strategy=SimpleNamespace(zero_stage_3=True), lightning_module=module)
    state = module_state_dict(zero3)
    assert gathered == [2] and sorted(state) == ["model.bias", "model.weight"]
    weight = module.model._checkpoint_wrapped_module.weight
    assert torch.equal(state["model.weight"], weight) and state["model.weight"].data_ptr() != weight.data_ptr()
    for strategy in (SimpleNamespace(lightning_module_state_dict=lambda: "whole"),  # DDP, FSDP: the strategy's own
                     SimpleNamespace(zero_stage_3=False, lightning_module_state_dict=lambda: "whole")):
        assert module_state_dict(SimpleNamespace(strategy=strategy, lightning_module=module)) == "whole"
