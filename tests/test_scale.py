"""Scale-out presets: every trainer × quantization composes; FSDP2 shards each block and the root; switches keep
the math. The multi-process runs themselves are in tests/test_multiprocess.py."""

from __future__ import annotations

import hydra
import pytest
import torch

from conftest import compose_config
from refusals import refused

from llasmol.model.blocks import clean_name
from llasmol.finetune.distributed import FSDP2Strategy, mixed_precision, shard_model
from llasmol.core.schema import check_config
from llasmol.model.blocks import compile_blocks, decoder_layer_types, enable_gradient_checkpointing
from test_lora import tiny_peft_model

TRAINERS = {  # preset: (strategy, precision)
    "cpu": ("auto", "32-true"),
    "gpu": ("auto", "bf16-mixed"),
    "ddp": ("ddp", "bf16-mixed"),
    "fsdp": ("llasmol.finetune.distributed.FSDP2Strategy", "bf16-mixed"),
}
QUANT = {"none": (None, False), "8bit": (8, True), "4bit": (4, True)}


@pytest.mark.parametrize("quant", list(QUANT))
@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_every_trainer_and_quantization_composes(trainer, quant):
    cfg = compose_config(["model=mistral", f"trainer={trainer}", f"quantization={quant}", "paths.output_dir=/x"])
    strategy, precision = TRAINERS[trainer]
    got = cfg.trainer.get("strategy", "auto")
    assert (got["_target_"] if hasattr(got, "get") else got) == strategy
    assert cfg.trainer.precision == precision
    bits, checkpointing = QUANT[quant]
    assert cfg.quantization.bits == bits
    # The paper's 8-bit AdamW whatever the trainer and bits: no preset swaps it (under trainer=fsdp the check
    # asks for optimizer=adamw), and the recipe's settings survive.
    assert cfg.optimizer._target_ == "bitsandbytes.optim.AdamW8bit" and cfg.optimizer.lr == 1e-4
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


@pytest.mark.parametrize("overrides, names", [
    (["quantization=4bit", "trainer=fsdp"], ["quantization=4bit", "trainer=fsdp", "trainer=ddp"]),
    (["quantization=8bit", "trainer=fsdp", "trainer.accelerator=cpu"], ["quantization=8bit", "trainer=fsdp"]),
    (["+trainer.strategy=deepspeed"], ["trainer.strategy='deepspeed'", "llasmol.finetune.distributed.FSDP2Strategy",
                                       "DeepSpeed"]),
    (["trainer=ddp", "trainer.strategy=fsdp"], ["trainer.strategy='fsdp'"]),
    (["trainer=fsdp", "trainer.strategy._target_=lightning.pytorch.strategies.FSDPStrategy"],
     ["trainer.strategy={'_target_': 'lightning.pytorch.strategies.FSDPStrategy'"]),
    (["model=mistral", "trainer=fsdp"], ["optimizer._target_=bitsandbytes.optim.AdamW8bit", "trainer=fsdp",
                                         "add optimizer=adamw", "trainer=ddp"]),
    (["trainer=fsdp", "optimizer=paged_adamw8bit"], ["optimizer._target_=bitsandbytes.optim.PagedAdamW8bit",
                                                     "trainer=fsdp"]),
])
def test_a_strategy_llasmol_does_not_run_is_refused_in_one_line(overrides, names):
    with refused(*names):
        check_config(compose_config([*overrides, "paths.output_dir=/x"]))


@pytest.mark.parametrize("overrides", [["trainer=fsdp"], ["trainer=ddp"], ["trainer=fsdp", "quantization=none"],
                                       ["trainer=ddp", "quantization=4bit"], [],
                                       ["model=mistral", "trainer=fsdp", "optimizer=adamw"],
                                       ["model=mistral", "trainer=ddp", "quantization=4bit"]])
def test_the_strategies_llasmol_runs_pass(overrides):
    check_config(compose_config([*overrides, "trainer.accelerator=cpu", "paths.output_dir=/x"]))


@pytest.mark.parametrize("overrides, batch", [([], 8), (["trainer=ddp", "trainer.devices=2"], 16),
                                              (["trainer=fsdp", "trainer.devices=[0,1]", "trainer.num_nodes=2"], 32),
                                              (["trainer=ddp", "trainer.devices=auto"], 8)])
def test_the_demo_trains_8_samples_a_step_on_each_process(overrides, batch):
    """So `trainer=fsdp trainer.accelerator=cpu trainer.devices=2` runs as it is (8 over 2 processes of
    micro-batch 8 would not divide); `auto` counts as one process, the count being unknown until Lightning looks."""
    cfg = compose_config([*overrides, "trainer.accelerator=cpu", "paths.output_dir=/x"])
    assert (cfg.data.micro_batch_size, cfg.data.effective_batch_size) == (8, batch)


def test_the_fsdp_preset_builds_fsdp2_saving_one_file_of_whole_adapters():
    cfg = compose_config(["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "paths.output_dir=/x"])
    assert cfg.trainer.precision == "32-true"  # on CPU, as the ddp preset
    strategy = hydra.utils.instantiate(cfg.trainer.strategy)
    assert isinstance(strategy, FSDP2Strategy) and strategy.reshard_after_forward is True
    assert strategy._save_distributed_checkpoint is False


def test_mixed_precision_gathers_half_weights_and_reduces_gradients_in_fp32():
    bf16 = mixed_precision("bf16-mixed")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    fp16 = mixed_precision("16-mixed")
    assert (fp16.param_dtype, fp16.reduce_dtype) == (torch.float16, torch.float32)
    for full in ("32-true", "bf16-true"):
        assert (mixed_precision(full).param_dtype, mixed_precision(full).reduce_dtype) == (None, None)


@pytest.mark.parametrize("family", ["mistral", "galactica"])
@pytest.mark.parametrize("lora", ["lite", "plus"])
def test_fsdp2_shards_each_block_and_the_base_model_keeping_what_trains(family, lora, one_process_group):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    model = tiny_peft_model(family, lora)
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    batch = _batch(model)
    expected_loss, expected_grads = _loss_and_grads(model, batch)
    model.zero_grad(set_to_none=True)
    assert shard_model(model, one_process_group, "32-true") == 2
    units = {name for name, m in model.named_modules() if isinstance(m, FSDPModule)}
    if family == "galactica":  # the blocks and the base model as the root, which holds the tied embeddings and head
        layers = "base_model.model.model.decoder.layers"
        # OPT's MLP is two direct children of a block; in the tiny one (FFN 2x hidden) attention is its largest part
        assert units == {f"{layers}.0", f"{layers}.0.self_attn", f"{layers}.1", f"{layers}.1.self_attn",
                         "base_model.model"}
    else:  # the blocks, each block's MLP (its largest part), the embeddings, the head, the base model as the root
        layers = "base_model.model.model.layers"
        assert units == {f"{layers}.0", f"{layers}.0.mlp", f"{layers}.1", f"{layers}.1.mlp",
                         "base_model.model.model.embed_tokens", "base_model.model.lm_head", "base_model.model"}
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before  # per parameter, names unchanged
    loss, grads = _loss_and_grads(model, batch)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys() == {n for n, trains in before.items() if trains}
    for name, grad in grads.items():  # the same gradients (a view returned by OPT's blocks is harmless here)
        torch.testing.assert_close(grad.full_tensor(), expected_grads[name], rtol=1e-5, atol=1e-7)
    graded = {n for n, p in model.named_parameters() if p.grad is not None}
    assert graded == set(grads)  # frozen weights get no gradient
    if lora == "plus":
        assert "base_model.model.lm_head.modules_to_save.default.weight" in graded


@pytest.mark.parametrize("family", ["mistral", "galactica"])
def test_on_cpus_each_unit_is_gathered_alone_and_its_buffer_freed_at_once(family, one_process_group):
    """On gloo no unit gathers the next one ahead of its backward (it names itself, already gathered), and
    every unit's all-gather is asynchronous, which frees its buffer as soon as the weights are copied out:
    BENCHMARKS.md §15 measures what each saves."""
    from torch.distributed.fsdp import FSDPModule

    model = tiny_peft_model(family, "plus")
    shard_model(model, one_process_group, "32-true")
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    assert len(units) >= 3
    for unit in units:
        state = unit._get_fsdp_state()
        assert state._states_to_backward_prefetch == [state]
        assert all(group.unshard_async_op for group in state._fsdp_param_groups)


def test_wrapper_prefixes_do_not_reach_checkpoint_names():
    assert clean_name("model._orig_mod.layers.0._checkpoint_wrapped_module.q_proj.lora_A.default.weight") \
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


@pytest.mark.parametrize("overrides, nodes, gpus", [
    (["trainer.devices=8", "trainer.num_nodes=2"], 2, 8),  # the docs' 2 nodes × 8 GPUs
    (["trainer.devices=auto"], 1, 4),  # every GPU SLURM gives: the paper's 4 asked for
    (["trainer.devices=[0,1]", "trainer.num_nodes=3"], 3, 2),
])
def test_the_slurm_launcher_asks_sbatch_for_the_trainers_nodes_gpus_and_tasks(overrides, nodes, gpus, tmp_path,
                                                                              monkeypatch):
    """The Hydra submitit launcher as the command builds it, stopped where it would hand the job script to sbatch:
    the script asks for trainer.num_nodes nodes, trainer.devices GPUs and as many tasks (processes) per node."""
    import submitit
    from hydra import compose, initialize_config_dir

    from llasmol.core.config import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", "model=mistral", "trainer=ddp",
                                          "hydra.launcher.partition=a100", f"hydra.sweep.dir={tmp_path}", *overrides],
                      return_hydra_config=True)
    launcher = hydra.utils.instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # as on a cluster, with srun
    submitted = []
    monkeypatch.setattr(submitit.AutoExecutor, "map_array", lambda executor, fn, *args: submitted.append(executor) or [])
    assert launcher.launch([["lora=full"]], initial_job_idx=0) == []
    script = submitted[0]._executor._make_submission_file_text("python -m submitit.core._submit", "uid")
    sbatch = {line.split("=")[0]: line.split("=", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH --")
              and "=" in line}
    assert sbatch["#SBATCH --nodes"] == str(nodes) and sbatch["#SBATCH --partition"] == "a100"
    assert sbatch["#SBATCH --gpus-per-node"] == sbatch["#SBATCH --ntasks-per-node"] == str(gpus)


@pytest.mark.slow
def test_multirun_through_the_submitit_launcher(tmp_path):
    """The launcher the SLURM preset builds on, in its local mode: each variant a job of its own process."""
    import json

    from refusals import run_cli

    sweep = tmp_path / "sweep"
    proc = run_cli(["llasmol.train", "--multirun", "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}",
                    "lora=lite,attn", "trainer.max_steps=2", "val_every_n_steps=2", "logger=csv",
                    "trainer.enable_progress_bar=false", "callbacks.generation_evaluator.samples_per_task=1",
                    "generation.max_new_tokens_limit=4", "data.max_samples_per_task={validation:4}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/result.json")}
    assert sorted(results) == ["0_tiny_lite", "1_tiny_attn"]
    from llasmol.model.counting import count_trainable

    expected = [count_trainable(compose_config([f"lora={v}"], config_name="params"))["trainable"] for v in ("lite", "attn")]
    assert [results[k]["params"]["trainable"] for k in sorted(results)] == expected and expected[0] < expected[1]
    assert all(r["global_step"] == 2 and "val/loss" in r["metrics"] for r in results.values())
    assert (sweep / ".submitit").is_dir()  # the jobs really went through submitit
    assert f"sweep folder: {sweep.resolve()}" in proc.stdout and f"python -m llasmol.report {sweep.resolve()}" in proc.stdout


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


@pytest.mark.parametrize("optimizer, trainer, refuses", [
    ("paged_adamw8bit", ["model=mistral"], False),  # trainer=gpu (a GPU-less machine: check_devices' line, below)
    ("paged_adamw8bit", ["model=mistral", "trainer=ddp"], False),
    ("paged_adamw8bit", ["model=mistral", "trainer=cpu"], True),
    ("paged_adamw8bit", ["trainer.accelerator=cpu"], True),
    ("adamw8bit", ["trainer=cpu"], False),
    ("adamw", ["trainer=cpu"], False),
])
def test_a_paged_optimizer_needs_a_gpu_trainer(optimizer, trainer, refuses):
    cfg = compose_config([f"optimizer={optimizer}", *trainer, "paths.output_dir=/x"])
    if not refuses:
        check_config(cfg)
        return
    with refused("optimizer._target_=bitsandbytes.optim.PagedAdamW8bit", "trainer.accelerator=cpu",
                 "optimizer=adamw8bit"):
        check_config(cfg)


@pytest.mark.parametrize("accelerator, devices, seen, named", [
    ("gpu", "auto", 0, ["trainer.accelerator=gpu", "no CUDA GPU", "trainer=cpu", "trainer.accelerator=cpu trainer.devices=2"]),
    ("cuda", 1, 0, ["trainer.accelerator=cuda", "trainer=cpu"]),
    ("gpu", 3, 2, ["trainer.devices=3", "sees 2", "trainer.devices=2"]),
    ("gpu", 2, 2, None),  # as many as there are
    ("gpu", "auto", 1, None),
    ("gpu", -1, 1, None),  # Lightning's "every one"
    ("cpu", 2, 0, None),  # processes on the CPU (gloo)
])
def test_the_gpus_a_run_asks_for_are_checked_before_anything_loads(accelerator, devices, seen, named, monkeypatch):
    from llasmol.finetune.preflight import check_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: seen)
    trainer = {"accelerator": accelerator, "devices": devices}
    if named is None:
        check_devices(trainer)
        return
    with refused(*named):
        check_devices(trainer)


@pytest.mark.parametrize("nodes, environ, named", [
    (2, {}, ["trainer.num_nodes=2", "MASTER_ADDR and NODE_RANK are not set", "srun or torchrun"]),
    (2, {"MASTER_ADDR": "10.0.0.1"}, ["NODE_RANK is not set"]),  # every node would take rank 0
    (4, {"NODE_RANK": "1"}, ["trainer.num_nodes=4", "MASTER_ADDR is not set"]),
    (2, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"}, None),  # started by hand, told everything
    (2, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": " 0 "}, None),
    # A rank past the last node waited forever after "MEMBER: 6/2"; one that is no number is no rank.
    (2, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "2"}, ["NODE_RANK='2'", "trainer.num_nodes=2", "from 0 to 1"]),
    (2, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "5"}, ["NODE_RANK='5'", "from 0 to 1"]),
    (3, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "-1"}, ["NODE_RANK='-1'", "from 0 to 2"]),
    (2, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "one"}, ["NODE_RANK='one'"]),
    (2, {"SLURM_NTASKS": "2"}, None), (2, {"TORCHELASTIC_RUN_ID": "x"}, None),  # a launcher ranks the nodes
    (1, {}, None), (1, {"NODE_RANK": "0"}, None), (1, {"NODE_RANK": ""}, None),
    # One node with a NODE_RANK left from another job waited forever after "MEMBER: 3/2"
    (1, {"NODE_RANK": "1"}, ["NODE_RANK='1'", "trainer.num_nodes=1", "unset NODE_RANK"]),
    (1, {"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"}, ["NODE_RANK='1'"]),
    (1, {"NODE_RANK": "1", "SLURM_NTASKS": "2"}, None)])  # a launcher's own rank: its business
def test_nodes_started_by_hand_must_be_told_their_rank_and_the_first_nodes_address(nodes, environ, named):
    """Without it each node took rank 0 and waited for the others forever after "MEMBER: 1/2"."""
    from llasmol.finetune.preflight import check_nodes

    if named is None:
        check_nodes({"num_nodes": nodes}, environ)
        return
    with refused(*named):
        check_nodes({"num_nodes": nodes}, environ)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the GPU the run asks for")
def test_the_papers_recipe_on_a_machine_without_a_gpu_is_one_line_before_the_base_loads(tmp_path):
    """The paper's setup with the base standing in (`model=tiny trainer=gpu`): refused before Lightning builds a
    trainer (which would say `No supported gpu backend found!` once the base had loaded), no run folder left."""
    from refusals import refused_cli

    refused_cli(["llasmol.train", "trainer=gpu"], tmp_path, "trainer.accelerator=gpu", "trainer=cpu")
    assert not list(tmp_path.glob("outputs/train/*"))  # the timestamped run folder is not left behind


def test_no_optimizer_config_is_no_paged_optimizer():
    from llasmol.core.schema import _optimizer_runs_here

    for optimizer in (None, {}):
        assert _optimizer_runs_here({"optimizer": optimizer, "trainer": {"accelerator": "cpu"}}) is None


@pytest.mark.parametrize("overrides, named", [
    (["trainer=fsdp", "trainer.accelerator=cpu", "trainer.strategy.reshard_after_forward=maybe"],
     ["trainer.strategy.reshard_after_forward='maybe'", "true", "false"]),
    (["seed=1180591620717411303424"], ["seed=1180591620717411303424", "4294967295"]),
    (["seed=-1"], ["seed=-1"]),
    (["trainer.devices=-1"], ["trainer.devices=-1", "trainer.accelerator=cpu", "trainer.devices=2"]),
])
def test_odd_trainer_values_are_one_line_at_the_config_check(overrides, named):
    """Before Lightning's import and the base's load: fully_shard read reshard_after_forward a minute in, and
    seed_everything and the CPU accelerator failed with their own tracebacks."""
    with refused(*named):
        check_config(compose_config([*overrides, "paths.output_dir=/x"]))
    check_config(compose_config(["seed=4294967295", "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2",
                                 "trainer.strategy.reshard_after_forward=false", "paths.output_dir=/x"]))
    check_config(compose_config(["model=mistral", "trainer.devices=-1", "paths.output_dir=/x"]))  # every GPU
