"""Hydra/OmegaConf glue shared by the commands and the tests."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parent
# The configs live at the repository top (`conf/`), next to the package, as the layout asks.
CONFIG_DIR = PACKAGE_DIR.parent / "conf"


def register_resolvers() -> None:
    """`${llasmol_asset:data/sample}` resolves to a path inside the installed package."""
    if not OmegaConf.has_resolver("llasmol_asset"):
        OmegaConf.register_new_resolver("llasmol_asset", lambda rel: str(PACKAGE_DIR / rel))


register_resolvers()
