"""SMolInstruct reading, prompt formatting, sharded sampling and the LightningDataModule."""

from llasmol.data.tasks import TASKS

__all__ = ["TASKS"]
