"""SMolInstruct reading, prompt formatting, sharded sampling and the LightningDataModule."""
