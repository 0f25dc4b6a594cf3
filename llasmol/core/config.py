"""Hydra/OmegaConf glue shared by the commands and the tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# The configs ship inside the package (package data), so a plain `pip install .` finds them.
CONFIG_DIR = PACKAGE_DIR / "conf"


def _sweep_group() -> str | None:
    """The W&B group of a multirun job: the sweep folder's name, shared by all its jobs; None otherwise."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return f"{HydraConfig.get().job.name}-{Path(HydraConfig.get().sweep.dir).name}"


def _interactive() -> bool:
    return sys.stdout.isatty()


RESOLVERS = {
    # `${llasmol_asset:data/bundled}`: a path inside the installed package.
    "llasmol_asset": lambda rel: str(PACKAGE_DIR / rel),
    # W&B stays offline (no account, no network) unless the user asks for online, by config or WANDB_MODE.
    "llasmol_wandb_offline": lambda: os.environ.get("WANDB_MODE", "offline") != "online",
    "llasmol_sweep_group": _sweep_group,
    # Progress bars only on a terminal; logs and CI stay quiet.
    "llasmol_interactive": _interactive,
    # The GPU presets' precision: bf16 autocast on GPUs, plain fp32 when run on CPU.
    "llasmol_precision": lambda accelerator: "32-true" if accelerator == "cpu" else "bf16-mixed",
}


def register_resolvers() -> None:
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


register_resolvers()


def compose_config(overrides: list[str] | None = None, config_name: str = "train"):
    """The config a command line with these overrides would get (without Hydra's run folder); for tests,
    benchmarks and notebooks."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))


class SweepSummary(Callback):
    """A Hydra callback: once every job of a multirun of `train` has ended, print the sweep folder and the
    command that compares its variants (the jobs' own output scrolled past long before)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        if config.get("task_name") == "train":
            sweep = Path(config.hydra.sweep.dir).resolve()
            print(f"sweep folder: {sweep}\n  compare its variants: python -m llasmol.report {sweep}", flush=True)
