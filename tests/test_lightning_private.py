"""Lightning's private names that llasmol touches are all still there, and the pin says which Lightning."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

from llasmol.finetune.lightning_private import TOUCH_POINTS, missing_touch_points

ROOT = Path(__file__).resolve().parents[1]


def test_every_private_touch_point_exists_in_the_installed_lightning():
    assert missing_touch_points() == []
    assert len(TOUCH_POINTS) >= 10 and all(why for *_, why in TOUCH_POINTS)  # each says why


def test_lightning_is_pinned_to_the_minor_version_tested():
    pin = re.search(r'"lightning>=(\d+)\.(\d+),<(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins lightning to one minor version"
    low, high = (int(pin[1]), int(pin[2])), (int(pin[3]), int(pin[4]))
    installed = tuple(int(x) for x in version("lightning").split(".")[:2])
    assert low <= installed < high and high == (low[0], low[1] + 1)


def test_no_private_lightning_name_is_used_outside_its_module():
    """Only llasmol/finetune/lightning_private.py names Lightning's private attributes."""
    names = {attr for _, _, attr, _, _ in TOUCH_POINTS if attr.startswith("_")}
    for path in (ROOT / "llasmol").rglob("*.py"):
        if path.name == "lightning_private.py":
            continue
        text = path.read_text()
        used = {n for n in names if re.search(rf"\.{re.escape(n)}\b", text)}
        assert not used, f"{path.relative_to(ROOT)} uses {sorted(used)}: go through lightning_private"


# The wrappers themselves, called directly with tiny stand-ins: a real fit reaches only some of their branches.

def test_a_touch_point_an_upgrade_dropped_is_named_as_class_dot_attribute(monkeypatch):
    from llasmol.finetune import lightning_private

    monkeypatch.setattr(lightning_private, "TOUCH_POINTS", (
        ("lightning.pytorch.callbacks", "ModelCheckpoint", "_no_such_hook", "class", "why"),
        ("lightning.pytorch.loggers.csv_logs", "ExperimentWriter", "no_such_field", "instance", "why"),
        ("lightning.pytorch.callbacks", "ModelCheckpoint", "_save_checkpoint", "class", "why"),
    ))
    assert missing_touch_points() == ["ModelCheckpoint._no_such_hook", "ExperimentWriter.no_such_field"]


class _Recording:
    """A `CheckpointWithHooks` whose hooks record what they were told."""

    @staticmethod
    def make(tmp_path):
        from llasmol.finetune.lightning_private import CheckpointWithHooks

        class Recording(CheckpointWithHooks):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.calls = []

            def before_save(self, trainer, filepath):
                self.calls.append(("before_save", filepath))

            def after_save(self, trainer, filepath, saved):
                self.calls.append(("after_save", filepath, saved))

            def after_remove(self, trainer, filepath):
                self.calls.append(("after_remove", filepath))

        return Recording(dirpath=str(tmp_path))


def test_checkpoint_hooks_surround_every_save_and_say_whether_it_was_written(tmp_path, monkeypatch):
    import pytest
    from lightning.pytorch.callbacks import ModelCheckpoint

    callback = _Recording.make(tmp_path)
    written = []
    monkeypatch.setattr(ModelCheckpoint, "_save_checkpoint", lambda self, trainer, path: written.append(path))
    callback.save_now("trainer", "a/interrupted.ckpt")  # e.g. interrupted.ckpt, at once
    assert written == ["a/interrupted.ckpt"]
    assert callback.calls == [("before_save", "a/interrupted.ckpt"), ("after_save", "a/interrupted.ckpt", True)]

    def disk_full(self, trainer, path):
        raise OSError("disk full")

    callback.calls.clear()
    monkeypatch.setattr(ModelCheckpoint, "_save_checkpoint", disk_full)
    with pytest.raises(OSError, match="disk full"):  # the write's error still reaches the caller
        callback.save_now("trainer", "b.ckpt")
    assert callback.calls == [("before_save", "b.ckpt"), ("after_save", "b.ckpt", False)]

    callback.calls.clear()
    removed = []
    monkeypatch.setattr(ModelCheckpoint, "_remove_checkpoint", lambda self, trainer, path: removed.append(path))
    callback._remove_checkpoint("trainer", "old.ckpt")
    assert removed == ["old.ckpt"] and callback.calls == [("after_remove", "old.ckpt")]


def test_the_last_validation_competes_for_best_and_last_is_written_once_per_step(tmp_path, monkeypatch):
    from types import SimpleNamespace

    callback = _Recording.make(tmp_path)
    seen = []
    monkeypatch.setattr(callback, "_monitor_candidates", lambda trainer: {"val/loss": trainer.global_step})
    monkeypatch.setattr(callback, "_save_topk_checkpoint", lambda trainer, c: seen.append(("topk", c)))
    monkeypatch.setattr(callback, "_save_last_checkpoint", lambda trainer, c: seen.append(("last", c)))
    callback.save_best_now(SimpleNamespace(global_step=7))
    assert seen == [("topk", {"val/loss": 7})]
    seen.clear()
    callback._last_global_step_saved = 7
    callback.save_last_unless_saved(SimpleNamespace(global_step=7))  # step 7 saved already
    assert seen == []
    callback.save_last_unless_saved(SimpleNamespace(global_step=8))
    assert seen == [("last", {"val/loss": 8})]


def test_a_step_stopped_in_its_end_hook_still_gets_its_module_hook_and_logged_row():
    from types import SimpleNamespace

    from llasmol.finetune.lightning_private import log_step_row_now

    calls = []
    module = SimpleNamespace(on_train_batch_end=lambda *args: calls.append(("module", *args)))
    connector = SimpleNamespace(on_batch_end=lambda: calls.append(("on_batch_end",)),
                                update_train_step_metrics=lambda: calls.append(("update_train_step_metrics",)))
    log_step_row_now(SimpleNamespace(_logger_connector=connector), module, "out", "batch", 3)
    # Lightning's order after the callbacks' hook: the module's own hook, then the row to the loggers.
    assert calls == [("module", "out", "batch", 3), ("on_batch_end",), ("update_train_step_metrics",)]


def test_the_csv_loggers_writer_is_made_once_in_its_log_folder(tmp_path):
    from lightning.pytorch.loggers.csv_logs import ExperimentWriter

    from llasmol.finetune.lightning_private import CSVLoggerWithWriter

    logger = CSVLoggerWithWriter(save_dir=str(tmp_path), name="csv", version="")
    writer = logger.experiment
    assert type(writer) is ExperimentWriter and Path(writer.log_dir) == Path(logger.log_dir)
    assert (tmp_path / "csv").is_dir() and logger.experiment is writer


@pytest.mark.parametrize("nodes, devices", [(1, 2), (2, 1), (2, 4)])
def test_the_fsdp2_mesh_is_one_data_parallel_dimension_over_every_process(nodes, devices, monkeypatch):
    """Lightning's "auto" sizes would make nodes × devices a 2-D (data, tensor) mesh; FSDP alone wants one."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from llasmol.finetune.lightning_private import ModelParallelOverEveryProcess

    seen = []
    monkeypatch.setattr(ModelParallelStrategy, "setup_environment",
                        lambda self: seen.append((self._data_parallel_size, self._tensor_parallel_size)))
    strategy = ModelParallelOverEveryProcess()
    strategy.num_nodes = nodes
    monkeypatch.setattr(ModelParallelOverEveryProcess, "num_processes", devices)
    strategy.setup_environment()
    assert seen == [(nodes * devices, 1)]


def test_the_live_progress_display_is_the_rich_bars_or_none():
    from types import SimpleNamespace

    from llasmol.finetune.lightning_private import live_progress

    assert live_progress(SimpleNamespace(progress_bar_callback=SimpleNamespace(progress="display"))) == "display"
    assert live_progress(SimpleNamespace(progress_bar_callback=None)) is None
    assert live_progress(SimpleNamespace()) is None
