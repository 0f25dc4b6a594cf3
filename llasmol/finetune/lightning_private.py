"""Every use of Lightning's private API in llasmol, in one place, each with its reason.

Lightning has no public hook for these. The versions they were written against are pinned in
pyproject.toml (`lightning>=2.6,<2.7`), and `TOUCH_POINTS` lists each private name, so that
tests/test_lightning_private.py fails by name when an upgrade drops one, instead of a run failing hours in.
The rest of the package uses the small public-looking wrappers below, never a private name.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.strategies import ModelParallelStrategy

# (module, class, attribute, where it is set: "class" or "instance", why we touch it)
TOUCH_POINTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("lightning.pytorch.callbacks", "ModelCheckpoint", "_save_checkpoint", "class",
     "every save goes through it: the PEFT adapter is saved before the .ckpt and renamed in after it"),
    ("lightning.pytorch.callbacks", "ModelCheckpoint", "_remove_checkpoint", "class",
     "a replaced best checkpoint takes its adapter folder along"),
    ("lightning.pytorch.callbacks", "ModelCheckpoint", "_save_last_checkpoint", "class",
     "last.ckpt at the end of training when the step count is off the save interval"),
    ("lightning.pytorch.callbacks", "ModelCheckpoint", "_monitor_candidates", "class", "the same"),
    ("lightning.pytorch.callbacks", "ModelCheckpoint", "_save_topk_checkpoint", "class",
     "the validation of the last step, run after fit, competes for the best checkpoint too"),
    ("lightning.pytorch.callbacks", "ModelCheckpoint", "_last_global_step_saved", "instance", "the same"),
    ("lightning.pytorch.loggers", "CSVLogger", "_experiment", "instance",
     "a CSV writer that keeps the rows of a run resumed in place"),
    ("lightning.pytorch.loggers", "CSVLogger", "_fs", "instance", "the same"),
    ("lightning.pytorch.loggers.csv_logs", "ExperimentWriter", "_check_log_dir_exists", "class",
     "Lightning's deletes an existing metrics.csv as the logger starts"),
    ("lightning.pytorch.loggers.csv_logs", "ExperimentWriter", "NAME_METRICS_FILE", "class", "the same"),
    ("lightning.pytorch.loggers.csv_logs", "ExperimentWriter", "metrics_keys", "instance",
     "the kept rows' columns continue"),
    ("lightning.pytorch.loggers", "WandbLogger", "_experiment", "instance",
     "finish a W&B run only if it started (a multirun's next job must start its own)"),
    ("lightning.pytorch.loggers", "WandbLogger", "_wandb_init", "instance",
     "Lightning passes anonymous=None, which W&B 0.31 answers with a deprecation warning at every start"),
    ("lightning.pytorch.strategies", "ModelParallelStrategy", "_data_parallel_size", "instance",
     "trainer=fsdp shards over every process: one data-parallel dimension of nodes x devices, known only at setup"),
    ("lightning.pytorch.strategies", "ModelParallelStrategy", "_tensor_parallel_size", "instance", "the same"),
    ("lightning.pytorch.callbacks", "RichProgressBar", "progress", "instance",
     "the live rich display that the validation generation adds its row to"),
    ("lightning.pytorch.callbacks", "RichProgressBar", "_get_train_description", "class",
     "a run bounded by steps alone (max_epochs=-1) is not 'Epoch 0/-2'"),
    ("lightning.pytorch", "Trainer", "_logger_connector", "instance",
     "a stop raised at a step's end would skip the step's logged row, which Lightning writes after the hook"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "on_batch_end",
     "class", "the same"),
    ("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector",
     "update_train_step_metrics", "class", "the same"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "_should_check_val_fx", "class",
     "a stop at a step's end comes before the step's validation: the resumed run runs it first, where "
     "Lightning, restarting there, would count it as done"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "advance", "class", "the same"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "_skip_next_val", "instance", "the same"),
    ("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "val_loop", "instance", "the same"),
    ("lightning.pytorch.loops.fit_loop", "_FitLoop", "_data_fetcher", "instance", "the same"),
    ("lightning.pytorch", "Trainer", "_results", "instance",
     "a value logged in some steps only (a GRPO task's reward) is not written again in the steps that lack it"),
    ("lightning.pytorch.trainer.connectors.logger_connector.result", "_ResultMetric", "has_reset", "instance",
     "the same"),
)


def missing_touch_points() -> list[str]:
    """The touch points the installed Lightning lacks, as `Class.attribute` (empty when all are there)."""
    missing = []
    for module, cls_name, attr, where, _ in TOUCH_POINTS:
        cls = getattr(importlib.import_module(module), cls_name)
        owner: Any = cls if where == "class" else _instance(cls_name, cls)
        if not hasattr(owner, attr):
            missing.append(f"{cls_name}.{attr}")
    return missing


def _instance(name: str, cls: type) -> Any:
    import tempfile

    if name == "ModelParallelStrategy":
        return cls()
    if name in ("CSVLogger", "WandbLogger"):
        return cls(save_dir=tempfile.mkdtemp(), **({"offline": True} if name == "WandbLogger" else {}))
    if name == "ExperimentWriter":
        return cls(tempfile.mkdtemp())
    if name == "_ResultMetric":
        from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata

        return cls(_Metadata(fx="training_step", name="x"), is_tensor=True)
    if name in ("Trainer", "_FitLoop", "_TrainingEpochLoop"):
        from lightning.pytorch import Trainer

        trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=tempfile.mkdtemp())
        return {"Trainer": trainer, "_FitLoop": trainer.fit_loop, "_TrainingEpochLoop": trainer.fit_loop.epoch_loop}[name]
    return cls()


# --------------------------------------------------------------------------- checkpoints


class CheckpointWithHooks(ModelCheckpoint):
    """`ModelCheckpoint` with hooks around its private save and remove, and saves on demand."""

    def before_save(self, trainer, filepath: str) -> None:
        """Called before every checkpoint write."""

    def after_save(self, trainer, filepath: str, saved: bool) -> None:
        """Called after every checkpoint write; `saved` is False when the write raised."""

    def after_remove(self, trainer, filepath: str) -> None:
        """Called after a checkpoint file was removed."""

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        self.before_save(trainer, filepath)
        try:
            super()._save_checkpoint(trainer, filepath)
        except BaseException:
            self.after_save(trainer, filepath, saved=False)
            raise
        self.after_save(trainer, filepath, saved=True)

    def _remove_checkpoint(self, trainer, filepath: str) -> None:
        super()._remove_checkpoint(trainer, filepath)
        self.after_remove(trainer, filepath)

    def save_now(self, trainer, filepath: str) -> None:
        """Write a checkpoint to `filepath` at once (e.g. interrupted.ckpt)."""
        self._save_checkpoint(trainer, filepath)

    def save_best_now(self, trainer) -> None:
        """Let the latest validation compete for the best checkpoint (Lightning does it only during fit)."""
        self._save_topk_checkpoint(trainer, self._monitor_candidates(trainer))

    def save_last_unless_saved(self, trainer) -> None:
        """Write last.ckpt unless this step was saved already."""
        if self._last_global_step_saved != trainer.global_step:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


# --------------------------------------------------------------------------- validation at a stopped step


def validation_due_now(trainer) -> bool:
    """Whether the fit loop validates at the end of the step that has just finished (asked from a callback's
    `on_train_batch_end`, before the loop does)."""
    loop = trainer.fit_loop
    return loop._data_fetcher is not None and bool(loop.epoch_loop._should_check_val_fx(loop._data_fetcher))


def validate_first_on_resume(trainer) -> None:
    """The resumed run's first iteration validates the restored step instead of training: the run stopped at
    that step's end, before its validation. Lightning, restarting at a step due for validation from a
    checkpoint saved before it, fast-forwards its counters as if it had run; this takes the path Lightning
    takes for a validation stopped half-way, whose first iteration trains nothing and validates."""
    loop = trainer.fit_loop.epoch_loop
    advance = loop.advance

    def validate_instead(data_fetcher) -> None:
        loop.advance = advance  # once
        if loop.restarting and loop._should_check_val_fx(data_fetcher):
            loop.val_loop.restarting = False  # a fresh validation, not one to continue
            loop._skip_next_val = False
            return  # on_advance_end runs the validation; the next iteration trains
        advance(data_fetcher)

    loop.advance = validate_instead


# --------------------------------------------------------------------------- loggers


def forget_step_values(trainer, prefix: str) -> None:
    """Lightning keeps each value logged with on_step until the epoch ends and writes it in every later step's
    row: a series logged in some steps only (a GRPO task's reward, in the steps that drew its prompts) would
    repeat its last value. The values of the keys under `prefix` are marked reset (as Lightning's own reset
    marks them), so that the step's row holds only those logged again in it."""
    results = trainer._results
    for metric in (results.values() if results is not None else ()):
        if metric.meta.name.startswith(prefix):
            metric.has_reset = True


def log_step_row_now(trainer, pl_module, outputs, batch, batch_idx: int) -> None:
    """What Lightning does for a step's logged row after the callbacks' `on_train_batch_end`: the module's own
    hook, then the row to the loggers (when the step is one to log). For a callback that ends training in
    that hook by raising, which skips the rest of the batch: without this the step's row is never written."""
    pl_module.on_train_batch_end(outputs, batch, batch_idx)
    connector = trainer._logger_connector
    connector.on_batch_end()
    connector.update_train_step_metrics()


class CSVLoggerWithWriter(CSVLogger):
    """`CSVLogger` whose writer comes from `make_writer` (Lightning builds it inside its `experiment`)."""

    def make_writer(self, log_dir: str) -> ExperimentWriter:
        return ExperimentWriter(log_dir)

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = self.make_writer(self.log_dir)
        return self._experiment


class WriterKeepingFile(ExperimentWriter):
    """An `ExperimentWriter` that may keep an existing metrics file and continue its columns."""

    METRICS_FILE = ExperimentWriter.NAME_METRICS_FILE

    def __init__(self, log_dir: str, keep_file: bool, columns: tuple[str, ...] = ()) -> None:
        self._keep_file = keep_file
        super().__init__(log_dir)
        if columns:
            self.metrics_keys = list(columns)

    def _check_log_dir_exists(self) -> None:
        if not self._keep_file:  # Lightning's check deletes an existing metrics.csv
            super()._check_log_dir_exists()


def wandb_run_started(logger) -> bool:
    return logger._experiment is not None


class WandbLoggerWithoutAnonymous(WandbLogger):
    """`WandbLogger` that does not pass W&B the `anonymous` setting it no longer has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)


# --------------------------------------------------------------------------- FSDP2


class ModelParallelOverEveryProcess(ModelParallelStrategy):
    """`ModelParallelStrategy` whose device mesh is one data-parallel dimension over every process of every
    node (FSDP2 alone). Lightning's "auto" makes it nodes × devices-per-node, data parallel across nodes and
    tensor parallel within one, and the sizes can be given only before the devices and nodes are known."""

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        self._tensor_parallel_size = 1
        super().setup_environment()


# --------------------------------------------------------------------------- progress


def live_progress(trainer):
    """The rich display of the run's progress bar, or None (no bar, or not a rich one)."""
    return getattr(getattr(trainer, "progress_bar_callback", None), "progress", None)


class StepBoundBar(RichProgressBar):
    """Lightning's rich bar, whose training row reads 'Epoch 0/-2' when the run has no epoch bound (max_epochs=-1,
    the GRPO command's): there it reads 'Epoch 0'."""

    def _get_train_description(self, current_epoch: int) -> str:
        text = super()._get_train_description(current_epoch)
        epochs = self.trainer.max_epochs
        if epochs is not None and epochs < 0:
            text = text.replace(f"Epoch {current_epoch}/{epochs - 1}", f"Epoch {current_epoch}", 1)
            text = f"{text.rstrip():{len(self.validation_description)}}"  # as wide as before: no flicker
        return text
