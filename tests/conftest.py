"""Shared fixtures: offline settings, composed Hydra configs, the official-layout fixture data."""

from __future__ import annotations

import os

# Tests never download: the Hub is off, W&B stays local. Set before anything imports huggingface_hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from llasmol.config import CONFIG_DIR
from smolinstruct_fixture import write_smolinstruct


def compose_config(overrides: list[str] | None = None, config_name: str = "train") -> DictConfig:
    """The config a command line with these overrides would get (without Hydra's run folder)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides or []))


@pytest.fixture(scope="session")
def smol_root(tmp_path_factory) -> Path:
    """A small SMolInstruct copy in the official layout (5 tasks, train/dev/test)."""
    return write_smolinstruct(tmp_path_factory.mktemp("smolinstruct"))


@pytest.fixture
def cfg_factory(tmp_path):
    """Compose the train config with overrides, writing into this test's temporary folder."""

    def make(*overrides: str) -> DictConfig:
        # W&B costs seconds per run; its own tests ask for it.
        logger = [] if any(o.startswith("logger=") for o in overrides) else ["logger=csv"]
        return compose_config([f"paths.output_dir={tmp_path}", *logger, *overrides])

    return make
