"""`python -m llasmol.train [overrides]`: LoRA fine-tuning on SMolInstruct.

`train(cfg)` is a plain function (the tests call it); `main` is the thin Hydra shell around it.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from llasmol.core import run_dir
from llasmol.core.config import CONFIG_DIR, check_command_line, command_line_values, named_run_dir
from llasmol.core.errors import report_user_errors
from llasmol.core.files import write_json
from llasmol.core.quiet import quiet_known_noise
from llasmol.core.run_lock import check_fresh_start, check_run_lock, hold_run_lock
from llasmol.core.schema import check_config

log = logging.getLogger("llasmol.train")


def _instantiate_all(group: DictConfig | None) -> list:
    """Instantiate every `_target_` entry of a config group such as `callbacks` or `logger`."""
    if not group:
        return []
    return [hydra.utils.instantiate(node) for node in group.values() if node and "_target_" in node]


def build_model(cfg: DictConfig, tokenizer):
    """Base model with adapters, and its parameter counts."""
    from llasmol.model.base import load_base_model
    from llasmol.model.blocks import compile_blocks, enable_gradient_checkpointing
    from llasmol.model.lora import apply_lora, count_parameters

    model = apply_lora(load_base_model(cfg.model, tokenizer, cfg.get("quantization")), cfg.model, cfg.lora)
    # from_pretrained hands back eval mode, which Lightning keeps; transformers recomputes activations
    # (gradient_checkpointing) and dropout draws only in training mode.
    model.train()
    if cfg.get("gradient_checkpointing"):
        enable_gradient_checkpointing(model)
    if cfg.get("compile") and cfg.compile.enabled:
        n = compile_blocks(model, cfg.compile.backend, cfg.compile.get("mode"))
        log.info("torch.compile (%s): %d transformer blocks, compiled at their first batch", cfg.compile.backend, n)
    return model, count_parameters(model)


def card_facts(cfg: DictConfig, params: dict, datamodule, accumulation: int) -> dict:
    """What each saved adapter's model card says about how it was made."""
    from llasmol.model.lora import base_name, target_modules

    source = datamodule.source
    data = source.path if cfg.data.get("path") else f"{source.hub_id} at revision {source.revision}"
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
    return {"base": base_name(cfg.model), "model": cfg.model.name, "tiny": bool(cfg.model.get("random_init")),
            "lora": lora, "params": params, "data": data, "tasks": datamodule.tasks, "recipe": recipe}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit one run; returns its final metrics, parameter counts and best checkpoint."""
    started = time.monotonic()
    import lightning as L
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from llasmol.metrics.families import use_scoring
    from llasmol.model.base import check_packing, load_tokenizer, quantization_config
    from llasmol.training.checkpointing import AdapterModelCheckpoint, AtomicCheckpointIO
    from llasmol.training.distributed import check_optimizer, check_trainer
    from llasmol.training.module import LoRACausalLM
    from llasmol.training.resume import Resume, StepSeeding, StopAtStepBoundary
    from llasmol.training.tracking import check_loggers

    quiet_known_noise()
    check_config(cfg)
    use_scoring(cfg.get("scoring"))
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank == 0:
        hold_run_lock(out)  # one run per directory, until this process ends
        from llasmol.training.checkpointing import tidy_run_dir

        for note in tidy_run_dir(out):  # what a killed run left: safe to touch now the lock is ours
            log.warning("%s", note)

    # Checks, cheapest first: the checkpoint to resume, a strategy, logger or quantisation the machine
    # cannot run, the data (indexed now when local, so bad data stops the run before loggers start).
    resume = Resume.plan(cfg.get("ckpt_path"), out, cfg.model.name, cfg.lora.name)
    check_trainer(cfg.trainer)
    check_optimizer(cfg.optimizer, cfg.trainer)
    check_loggers(cfg.get("logger"))
    if cfg.data.get("packing"):
        check_packing(cfg.model)
    quantization_config(cfg.get("quantization"))
    tokenizer = load_tokenizer(cfg.model)
    datamodule = hydra.utils.instantiate(cfg.data, tokenizer=tokenizer, _convert_="all")
    if datamodule.path:
        datamodule.setup("fit")

    # Build: the model, then the trainer with its callbacks and loggers.
    model, params = build_model(cfg, tokenizer)
    params = {"model": cfg.model.name, "lora": cfg.lora.name, **params}
    log.info(
        "%s + LoRA %s: %s trainable of %s parameters (%.2f%%)",
        params["model"], params["lora"], f"{params['trainable']:,}", f"{params['total']:,}", params["percent"],
    )
    module = LoRACausalLM(
        model,
        optimizer=hydra.utils.instantiate(cfg.optimizer),
        scheduler=hydra.utils.instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
    )
    callbacks = [*_instantiate_all(cfg.get("callbacks")), StepSeeding(cfg.seed), StopAtStepBoundary()]
    if not cfg.trainer.get("enable_progress_bar", True):
        from lightning.pytorch.callbacks import ProgressBar

        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    resume.prepare_logger_config(cfg.get("logger"))
    # FSDP and DeepSpeed presets bring their own checkpoint writers; the rest write through a rename.
    plugins = [] if OmegaConf.is_dict(cfg.trainer.get("strategy")) else [AtomicCheckpointIO()]
    trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=_instantiate_all(cfg.get("logger")), plugins=plugins or None
    )
    # Accumulation depends on how many processes the trainer runs, known only once it exists.
    accumulation = datamodule.gradient_accumulation(trainer.world_size)
    trainer.accumulate_grad_batches = accumulation
    trainer.val_check_interval = cfg.val_every_n_steps * accumulation
    log.info(
        "effective batch %d = micro-batch %d × accumulation %d × %d process(es)",
        datamodule.effective_batch_size, datamodule.micro_batch_size, accumulation, trainer.world_size,
    )
    write_json(out / run_dir.PARAMS, params)
    facts = card_facts(cfg, params, datamodule, accumulation)
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, AdapterModelCheckpoint):
            callback.card_facts = facts
    resume.attach(trainer)
    for logger in trainer.loggers:
        logger.log_hyperparams(
            {**OmegaConf.to_container(cfg, resolve=True), "params": params, "accumulate_grad_batches": accumulation}
        )

    # Fit. weights_only: a checkpoint is data from disk; ours hold only tensors and plain containers.
    if resume.checkpoint:
        log.info("resuming from %s", resume.checkpoint)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume.checkpoint, weights_only=True)
    except SIGTERMException:
        # Lightning's SIGTERM is a SystemExit without a code, i.e. success; a stopped run is not one.
        _finish_loggers(trainer)
        raise SystemExit(143) from None
    if module.last_validated_step != trainer.global_step:
        # Every run ends with something to report, even when val_every_n_steps does not divide its length.
        log.info("validating the last step (%d): val_every_n_steps=%d does not divide it",
                 trainer.global_step, cfg.val_every_n_steps)
        trainer.validate(module, datamodule=datamodule, verbose=False)
        for callback in trainer.checkpoint_callbacks:  # every rank: gathering sharded adapters is collective
            if isinstance(callback, AdapterModelCheckpoint) and callback.monitor:
                callback.save_best_now(trainer)
    if trainer.is_global_zero:
        resume.finish()

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    checkpoint = trainer.checkpoint_callback
    result = {
        "metrics": metrics,
        "params": params,
        "best_checkpoint": checkpoint.best_model_path if checkpoint else None,
        "output_dir": str(out),
        "global_step": trainer.global_step,
        "resumed_from": resume.checkpoint,
        "seconds": round(time.monotonic() - started, 1),  # this process's wall time, for the ablation chart
    }
    if trainer.is_global_zero:
        write_json(out / run_dir.RESULT, result)
        best = checkpoint.best_model_score if checkpoint else None
        log.info("done at step %d: best checkpoint %s%s. Next: python -m llasmol.report %s ; "
                 "python -m llasmol.evaluate ckpt=%s data.split=test", trainer.global_step,
                 result["best_checkpoint"] or "(none: no validation kept one)",
                 f" (val/loss {float(best):.4f})" if best is not None else "", out, out)
    _finish_loggers(trainer)
    return result


def _finish_loggers(trainer) -> None:
    """Close W&B runs, so the next job of a multirun (same process) starts its own run."""
    from llasmol.training.lightning_private import wandb_run_started
    from llasmol.training.tracking import wandb_loggers

    for logger in wandb_loggers(trainer):
        if wandb_run_started(logger):
            logger.experiment.finish()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")
@report_user_errors
def main(cfg: DictConfig) -> None:
    from lightning.pytorch.utilities import rank_zero_only

    result = train(cfg)
    if rank_zero_only.rank == 0:  # once, not once per DDP process
        print(f"run directory: {result['output_dir']}", flush=True)


if __name__ == "__main__":
    check_command_line("train", run_folder=True)
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank == 0:  # DDP's other processes run this line too, while rank 0 holds the lock
        # Before Hydra writes its config into the folder: a second run must not replace the first one's.
        report_user_errors(check_run_lock)(named_run_dir(sys.argv[1:]))
        report_user_errors(check_fresh_start)(named_run_dir(sys.argv[1:]), *command_line_values(
            sys.argv[1:], {"ckpt_path": None, "overwrite": False}).values())
    main()
