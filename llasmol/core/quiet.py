"""Known noise of the libraries we run, silenced by its message so that every other warning still shows."""

from __future__ import annotations

import logging
import warnings

_WARNINGS = (
    # transformers 5, on every generate with a PEFT model: a rename, nothing for a user to do.
    r".*is_gradient_checkpointing.* is deprecated",
    # Lightning 2.6 on torch 2.13: its own use of a torch utility.
    r".*isinstance\(treespec, LeafSpec\)",
    # Lightning's ModelCheckpoint on a run resumed in its own directory, where the checkpoints are expected.
    r"Checkpoint directory .* exists and is not empty",
    r".*dirpath has changed",
    # bitsandbytes' 8-bit layers (quantization=8bit) at every matmul: LLM.int8() computes in fp16 by design.
    r"MatMul8bitLt: inputs will be cast from .* to float16 during quantization",
)


class _NoTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in record.getMessage()  # Lightning's advertisement of a cloud service


_NO_TIPS = _NoTips()  # one instance: adding it again adds nothing


def quiet_known_noise() -> None:
    """Silence the known warnings (each command's first step, `llasmol.frame.start`)."""
    for pattern in _WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NO_TIPS)


def lightning_logs_to_root() -> None:
    """Lightning's INFO lines through the root logger only; called once Lightning is imported, since its import
    adds a console handler of its own beside the root logger Hydra set up (console and the run's log file)."""
    if logging.getLogger().handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True
