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


# Known lines of libraries' loggers: by logger, the parts of a message that mark it (each with why it is noise).
_LOG_LINES = {
    # Lightning's advertisement of a cloud service, and its note on building the training loader to count the
    # steps: the line before training's own, which made a slow first step on a busy machine read as a hang there.
    "lightning.pytorch.utilities.rank_zero": ("Tip:", "to estimate number of stepping batches"),
    # peft imports bitsandbytes, whose CPU backend looks for an optional 4-bit kernel on the Hub at import, in every
    # model command, quantised or not: offline (or untrusted) it says so twice and keeps its own 4-bit path.
    "kernels._internals.hf_hub": ("Skipping publisher trust check",),
    "bitsandbytes.backends.cpu.ops": ("from kernels-community",),
}


class _Known(logging.Filter):
    def __init__(self, parts: tuple[str, ...]) -> None:
        super().__init__()
        self.parts = parts

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(part in message for part in self.parts)


_FILTERS = {name: _Known(parts) for name, parts in _LOG_LINES.items()}  # one each: adding it again adds nothing


def quiet_known_noise() -> None:
    """Silence the known warnings (each command's first step, `llasmol.frame.start`)."""
    for pattern in _WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    quiet_known_log_lines()


def quiet_known_log_lines() -> None:
    """The known lines of libraries' loggers (`_LOG_LINES`): every other line of the same loggers still shows."""
    for name, known in _FILTERS.items():
        logging.getLogger(name).addFilter(known)


class _WarningsAndWorse(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


_ONLY_WARNINGS = _WarningsAndWorse()  # one instance: adding it again adds nothing


def quiet_other_ranks(rank: int) -> None:
    """In a launch's other processes (DDP, FSDP2: rank > 0), the console and the run's log keep warnings and
    errors only: their start-up and progress lines would repeat rank 0's, each once per process."""
    if rank > 0:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_ONLY_WARNINGS)


def lightning_logs_to_root() -> None:
    """Lightning's INFO lines through the root logger only; called once Lightning is imported, since its import
    adds a console handler of its own beside the root logger Hydra set up (console and the run's log file)."""
    if logging.getLogger().handlers:
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True
