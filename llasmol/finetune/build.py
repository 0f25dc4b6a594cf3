"""What `llasmol.train` builds from its config, in order: the data, the base model with its adapters, the
LightningModule, the trainer with its callbacks, plugins and loggers; then the run's facts where they are
read (params.json, each adapter's model card, every logger's hyperparameters)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import hydra
from lightning import Trainer
from lightning.pytorch.callbacks import Callback, ProgressBar
from omegaconf import DictConfig, OmegaConf

from llasmol.core import run_dir
from llasmol.core.files import write_json
from llasmol.core.tasks import TaskTable
from llasmol.core.threads import retune_threads
from llasmol.data.datamodule import SMolInstructDataModule
from llasmol.core.schema import is_fsdp2
from llasmol.model.base import load_base_model, load_base_on_meta
from llasmol.model.blocks import compile_blocks, enable_gradient_checkpointing
from llasmol.model.lora import apply_lora, base_name, count_parameters, target_modules
from llasmol.finetune.checkpointing import AdapterModelCheckpoint, AtomicCheckpointIO
from llasmol.finetune.distributed import uses_fsdp2
from llasmol.finetune.module import LoRACausalLM
from llasmol.finetune.rollouts import GRPOLoRA
from llasmol.metrics.rewards import Rewards
from llasmol.metrics.support import FEWEST_TO_COMPARE
from llasmol.model.adapters import load_adapter_weights
from llasmol.finetune.resume import Resume, StepSeeding, StopAtStepBoundary
from llasmol.finetune.tracking import ProgressLines, number_rows_by_optimizer_step
from llasmol.finetune.validation import GenerationEvaluator

log = logging.getLogger("llasmol.train")  # the run's log lines keep the command's name in train.log


def instantiate_all(group: DictConfig | None) -> list:
    """Instantiate every `_target_` entry of a config group such as `callbacks` or `logger`."""
    if not group:
        return []
    return [hydra.utils.instantiate(node) for node in group.values() if node and "_target_" in node]


def build_datamodule(cfg: DictConfig, tokenizer, tasks: Optional[TaskTable] = None) -> SMolInstructDataModule:
    """The DataModule of `cfg.data` (`tasks`: the table the config check made of it); a local copy is indexed now,
    so bad data stops the run before loggers start."""
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all",
                                         prompts_only=cfg.objective.name == "grpo",
                                         **({"table": tasks} if tasks is not None else {}))
    if datamodule.path:
        datamodule.setup("fit")
        mix = datamodule.mix()
        if mix:
            log.info("training samples per epoch: %s (data.weights)", mix)
    else:  # fetched by Lightning's prepare_data, once the model is built: unreachable is said now
        datamodule.source.check_reachable()
    return datamodule


def build_model(cfg: DictConfig, tokenizer, start: Optional[Path] = None):
    """Base model with adapters (`start`'s weights when given: `init_from`'s adapter folder), and its parameter
    counts (logged), named by model and LoRA variant."""
    if is_fsdp2((cfg.get("trainer") or {}).get("strategy")) and not cfg.model.get("random_init"):
        # No process holds the whole base: it is built on the meta device and each process reads its own shards
        # once FSDP2 has sharded it (`FSDP2Strategy.shard`). A random base (the tiny model) has no files to read
        # from: its values are one seeded sequence over the whole model, so it is built whole, then sharded.
        base = load_base_on_meta(cfg.model, tokenizer)
        log.info("trainer=fsdp: the base is built on the meta device; each process reads its own shards of %s",
                 base.deferred_weights.folder)
    else:
        base = load_base_model(cfg.model, tokenizer, cfg.get("quantization"))
    model = apply_lora(base, cfg.model, cfg.lora)
    if start is not None:
        load_adapter_weights(model, start)
        log.info("adapters start from %s (init_from)", start)
    # from_pretrained hands back eval mode, which Lightning keeps; transformers recomputes activations
    # (gradient_checkpointing) and dropout draws only in training mode.
    model.train()
    if cfg.get("gradient_checkpointing"):
        enable_gradient_checkpointing(model)
    if cfg.get("compile") and cfg.compile.enabled:
        n = compile_blocks(model, cfg.compile.backend, cfg.compile.get("mode"))
        log.info("torch.compile (%s): %d transformer blocks, compiled at their first batch", cfg.compile.backend, n)
    params = {"model": cfg.model.name, "lora": cfg.lora.name, **count_parameters(model)}
    log.info(
        "%s + LoRA %s: %s trainable of %s parameters (%.2f%%)",
        params["model"], params["lora"], f"{params['trainable']:,}", f"{params['total']:,}", params["percent"],
    )
    return model, params


def build_module(cfg: DictConfig, model, datamodule: Optional[SMolInstructDataModule] = None,
                 start: Optional[Path] = None, rewards: Optional[Rewards] = None) -> LoRACausalLM:
    """The LightningModule training `model`'s adapters by the config's objective, optimizer and scheduler
    (`datamodule`: the run's, whose tokenizer and task table GRPO samples with; `start`: the adapter folder the
    adapters started from, GRPO's KL reference; `rewards`: GRPO's, built once by the config check)."""
    optimizer = hydra.utils.instantiate(cfg.optimizer)
    scheduler = hydra.utils.instantiate(cfg.scheduler) if cfg.get("scheduler") else None
    if cfg.objective.name == "sft":
        return LoRACausalLM(model, optimizer=optimizer, scheduler=scheduler)
    split = datamodule.split("train")
    # Each task's first training answer, through every reward function: a user's that fails is one line now.
    firsts = {}
    for i in range(len(split)):
        sample = split[i]
        firsts.setdefault(sample["task"], (sample["output"], [sample["raw_output"]]))
    rewards.probe(firsts)
    return GRPOLoRA(model, optimizer, scheduler, objective=cfg.objective, tokenizer=datamodule.tokenizer,
                    tasks=datamodule.source.table, rewards=rewards, generation=cfg.generation, seed=cfg.seed,
                    output_dir=cfg.paths.output_dir, start=start)


class FreeCoreThreads(Callback):
    """Under cpu.wait_policy=auto, one intra-op thread per core other work leaves free, recounted as training
    goes (`llasmol.core.threads.retune_threads`: at most every few seconds; a no-op under any other policy)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        retune_threads()


def build_callbacks(cfg: DictConfig, rewards: Optional[Rewards] = None) -> list:
    """The config's callbacks (without a progress bar when it is switched off) and the free-core thread count,
    then the two a resumable run needs: step-seeded random draws and stopping at an optimizer step's end. The
    validation rewards with `rewards` (a GRPO run's, the very object its rollouts use)."""
    callbacks = [*instantiate_all(cfg.get("callbacks")), FreeCoreThreads(), StepSeeding(cfg.seed),
                 StopAtStepBoundary()]
    for callback in callbacks:
        if isinstance(callback, GenerationEvaluator):
            callback.rewards = rewards
    # The bar on a terminal, its lines on the console elsewhere; on a terminal the lines go to train.log alone, which
    # would otherwise say nothing between validations.
    bar = cfg.trainer.get("enable_progress_bar", True)
    for callback in callbacks:
        if isinstance(callback, ProgressLines):
            callback.files_only = bar
    return [c for c in callbacks if bar or not isinstance(c, ProgressBar)]


def build_trainer(cfg: DictConfig, datamodule: SMolInstructDataModule, resume: Resume,
                  rewards: Optional[Rewards] = None) -> Trainer:
    """The trainer of `cfg.trainer`, built through the resume plan (the one place a plan meets the trainer),
    with gradient accumulation set for the number of processes it runs (`rewards`: a GRPO run's, for validation)."""
    callbacks = build_callbacks(cfg, rewards)
    plugins = [AtomicCheckpointIO()]  # every preset writes its .ckpt on rank 0, through a rename

    def make(plan_callbacks: list) -> Trainer:  # called by the plan, once the loggers' settings are ready
        return hydra.utils.instantiate(cfg.trainer, callbacks=[*callbacks, *plan_callbacks],
                                       logger=instantiate_all(cfg.get("logger")), plugins=plugins)

    trainer = resume.trainer(make, cfg.get("logger"))
    number_rows_by_optimizer_step(trainer)
    # Accumulation depends on how many processes the trainer runs, known only once it exists.
    accumulation = datamodule.gradient_accumulation(trainer.world_size)
    trainer.accumulate_grad_batches = accumulation
    trainer.val_check_interval = cfg.val_every_n_steps * accumulation
    log.info(
        "effective batch %d = micro-batch %d × accumulation %d × %d process(es)%s",
        datamodule.effective_batch_size, datamodule.micro_batch_size, accumulation, trainer.world_size,
        _sharding(trainer),
    )
    warn_small_data(cfg, datamodule)
    return trainer


def warn_small_data(cfg: DictConfig, datamodule: SMolInstructDataModule) -> None:
    """A small table of one's own trains on little without a word but Lightning's logging-interval warning: one line
    when a task's validation split holds fewer rows than a metric needs to be compared (`FEWEST_TO_COMPARE`), naming
    the setting that changes it (a run shorter than one validation interval is said as training starts,
    `ProgressLines`)."""
    splits = getattr(datamodule.source, "splits", None) or {}
    counts = datamodule.split("validation").counts() if "validation" in splits else {}
    caps = cfg.data.get("max_samples_per_task") or {}
    cap = caps.get("validation") if isinstance(caps, Mapping) else None
    # a split capped on purpose (data.max_samples_per_task, the demo ablation's 8) was chosen small: no warning
    few = {task: n for task, n in counts.items() if n < FEWEST_TO_COMPARE and n != cap}
    if few:
        fractions = cfg.data.get("split_fractions")
        fractions = OmegaConf.to_container(fractions) if OmegaConf.is_config(fractions) else fractions
        log.warning("validation holds only %s: its metrics are too few to compare (fewer than %d); a larger share goes "
                    "to validation with data.split_fractions (now %s), or give the task more rows",
                    ", ".join(f"{n} row(s) of {task}" for task, n in few.items()), FEWEST_TO_COMPARE, fractions)


def _sharding(trainer: Trainer) -> str:
    """How the processes hold the model, said beside the batch (the start-up lines are rank 0's alone)."""
    if trainer.world_size == 1:
        return ""
    if uses_fsdp2(trainer):
        return f"; FSDP2: each process holds 1/{trainer.world_size} of the weights (trainer=fsdp)"
    return "; DDP: each process holds the whole model"


def record_run(cfg: DictConfig, trainer: Trainer, datamodule: SMolInstructDataModule, params: dict) -> None:
    """The run's facts where they are read: params.json, card.json (what every adapter checkpoint's and an
    export's model card say), and the composed config with the parameter counts as every logger's
    hyperparameters."""
    accumulation = trainer.accumulate_grad_batches
    write_json(Path(cfg.paths.output_dir) / run_dir.PARAMS, params)
    own = datamodule.source.table.declared
    if own:  # the run's own tasks, for every later command that reads it (before any file names them)
        run_dir.write_tasks(Path(cfg.paths.output_dir), own)
    facts = card_facts(cfg, params, datamodule, accumulation)
    write_json(Path(cfg.paths.output_dir) / run_dir.CARD, facts)
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, AdapterModelCheckpoint):
            callback.card_facts = facts
    for logger in trainer.loggers:
        logger.log_hyperparams(
            {**OmegaConf.to_container(cfg, resolve=True), "params": params, "accumulate_grad_batches": accumulation}
        )


def card_facts(cfg: DictConfig, params: dict, datamodule: SMolInstructDataModule, accumulation: int) -> dict:
    """What each saved adapter's model card, and an export's, say about how it was made (`llasmol.model.cards`)."""
    data = datamodule.source.describe()
    optimizer = str(cfg.optimizer._target_).rsplit(".", 1)[-1]
    length = (f"at most {cfg.trainer.max_steps} steps" if cfg.trainer.get("max_steps", -1) > 0
              else f"{cfg.trainer.max_epochs} epoch(s)")
    clip = cfg.trainer.get("gradient_clip_val")
    recipe = (f"{optimizer} lr {cfg.optimizer.lr:g}, cosine schedule with {cfg.scheduler.num_warmup_steps} warm-up "
              f"steps, {length}, effective batch {datamodule.effective_batch_size} (micro-batch "
              f"{datamodule.micro_batch_size} x accumulation {accumulation}), {cfg.data.max_length} tokens, "
              f"{f'gradient norm clipped at {clip:g}' if clip else 'no gradient clipping'}, seed {cfg.seed}")
    lora = {"name": cfg.lora.name, "r": cfg.lora.r, "alpha": cfg.lora.alpha, "dropout": cfg.lora.dropout,
            "targets": target_modules(cfg.model, cfg.lora), "train_head": bool(cfg.lora.get("train_head"))}
    objective = None
    if cfg.objective.name == "grpo":  # beyond the paper's SFT: said on every card of the run
        o = cfg.objective
        objective = (f"GRPO (loss {o.loss_type}, {o.num_generations} completions a prompt at temperature "
                     f"{o.temperature:g}, beta {o.beta:g}) rewarded by the paper's metrics (conf/reward/), from "
                     f"{Path(cfg.init_from).name if cfg.get('init_from') else 'fresh adapters'}")
    return {"base": base_name(cfg.model), "model": cfg.model.name, "tiny": bool(cfg.model.get("random_init")),
            "demo": cfg.model.get("tokenizer") == "tiny",
            "objective": objective,
            "lora": lora, "params": params, "data": data, "tasks": list(datamodule.tasks), "recipe": recipe,
            "own_tasks": {t: datamodule.source.table[t].family for t in datamodule.tasks
                          if t in datamodule.source.table.declared}}
