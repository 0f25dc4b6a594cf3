"""`python -m llasmol.train [overrides]`: LoRA fine-tuning on SMolInstruct.

`train(cfg)` is a plain function (the tests call it); `main` is the thin Hydra shell around it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from omegaconf import DictConfig

from llasmol.core.config import command_line_values, named_run_dir
from llasmol.core.quiet import lightning_logs_to_root
from llasmol.core.run_lock import check_fresh_start, check_run_lock, process_rank
from llasmol.core.threads import wait_description
from llasmol.frame import command, start

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> dict[str, Any]:
    """Fit one run; returns its final metrics, parameter counts and best checkpoint.

    A table of contents: preflight, build, fit, finish, each step a helper of `llasmol.finetune`.
    """
    started = time.monotonic()
    # The first line at once: what runs and where, before torch, Lightning and the base take their seconds.
    tasks, threads = start(cfg, lambda c: f"training {c.model.name} + LoRA {c.lora.name} into {c.paths.output_dir} "
                                          "(loading torch, Lightning and the base)")
    from llasmol.model.base import check_base_reachable, check_packing, load_tokenizer  # torch: after the threads

    from llasmol.inference.loading import starting_adapter
    from llasmol.metrics.rewards import check_rewards

    check_rewards(cfg, tasks)

    start_from = starting_adapter(cfg)  # an init_from that does not fit this run is said before anything loads
    if cfg.data.get("packing"):
        check_packing(cfg.model)  # a setting the base cannot take is said before its files are looked for
    check_base_reachable(cfg.model)  # missing weights are one line before Lightning's import (some 4 s)
    # Here, not at the top: importing the command (the Hydra shell, the checks before Hydra) loads no torch.
    import lightning as L

    from llasmol.finetune.build import build_datamodule, build_model, build_module, build_trainer, record_run
    from llasmol.finetune.fit import finish, fit, run_result, validate_last_step
    from llasmol.finetune.preflight import check_run, claim_run_dir
    from llasmol.finetune.resume import Resume

    # Preflight: what this machine runs, the run directory (ours alone), what ckpt_path= means.
    lightning_logs_to_root()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    log.info("CPU: %d intra-op thread(s), OpenMP threads wait %s (cpu.threads, cpu.wait_policy)", threads,
             wait_description(cfg.get("cpu")))
    check_run(cfg)  # before the folder is claimed: a refused run leaves nothing behind
    out = claim_run_dir(cfg.paths.output_dir)
    resume = Resume.plan(cfg.get("ckpt_path"), out, cfg.model.name, cfg.lora.name)

    # Build: the data first, so bad data stops the run before the model loads and the loggers start.
    tokenizer = load_tokenizer(cfg.model)
    datamodule = build_datamodule(cfg, tokenizer, tasks)
    model, params = build_model(cfg, tokenizer, start_from)
    module = build_module(cfg, model, datamodule, start_from)
    trainer = build_trainer(cfg, datamodule, resume)  # the one place the resume plan meets the trainer
    record_run(cfg, trainer, datamodule, params)

    # Fit: from the planned checkpoint, if any; a SIGTERM ends the process with exit status 143.
    fit(trainer, module, datamodule, resume.checkpoint)

    # Finish: the last step validated if no validation fell on it, result.json, the closing line, the loggers.
    validate_last_step(trainer, module, datamodule, cfg.val_every_n_steps)
    result = run_result(trainer, params, out, resume.checkpoint, started)
    finish(trainer, result)
    return result


def _claim_run_folder(argv: list[str]) -> None:
    """Before Hydra writes its config into the folder: a second run must not replace the first one's."""
    if process_rank() == 0:  # DDP's other processes run this too, while rank 0 holds the lock
        check_run_lock(named_run_dir(argv))
        check_fresh_start(named_run_dir(argv), *command_line_values(
            argv, {"ckpt_path": None, "overwrite": False, "first_job": 0}).values())


def _check_rewards(cfg: DictConfig) -> None:
    from llasmol.metrics.rewards import check_rewards  # RDKit's import: only when a command line is checked

    check_rewards(cfg)


@command("train", run_folder=True, check=_check_rewards, before=_claim_run_folder)
def main(cfg: DictConfig) -> None:
    result = train(cfg)
    if process_rank() == 0:  # once, not once per DDP process
        print(f"run directory: {result['output_dir']}", flush=True)


if __name__ == "__main__":
    main.from_command_line()
