"""Validation generation moves its row of the training run's live progress display."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TextColumn

from llasmol.inference.progress import generation_progress


def test_the_generation_row_advances_and_redraws_while_generating():
    screen = io.StringIO()
    # As Lightning's bar between its own redraws: nothing refreshes the display unless asked.
    live = Progress(TextColumn("{task.description}"), MofNCompleteColumn(),
                    console=Console(file=screen, force_terminal=True, width=80), auto_refresh=False)
    with live:
        with generation_progress("Generation", 3, live) as advance:
            row = live.tasks[-1]
            assert (row.description, row.completed, row.total) == ("Generation", 0, 3)
            before = screen.getvalue()
            advance(2)
            assert row.completed == 2
            assert "2/3" in screen.getvalue()[len(before):]  # drawn now, not at the next training step
        assert all(t.description != "Generation" for t in live.tasks)  # the row goes when generation ends


def test_progress_lines_give_percent_rate_and_time_left_in_minutes_or_hours():
    from llasmol.inference.progress import progress_line

    # 10 samples left at 0.5/s: 20 s; 2 left at 0.001/s: 2000 s; 7,230 left at 1/s: 2 h 0.5 min
    assert progress_line("g", 90, 100, 5, 10.0) == "g: 90/100 samples (90%), 0.50 samples/s, about 0m20s left"
    assert progress_line("g", 1, 3, 1, 1000.0) == "g: 1/3 samples (33%), 0.00 samples/s, about 33m20s left"
    assert progress_line("g", 0, 7230, 1, 1.0) == "g: 0/7230 samples (0%), 1.00 samples/s, about 2h00m left"
    assert progress_line("g", 0, 3661, 1, 1.0).endswith("about 1h01m left")
    assert progress_line("g", 0, 119, 2, 2.0).endswith("about 1m59s left")  # 119 s: minutes and padded seconds
    assert progress_line("g", 1, 1, 1, 2.0) == "g: 1/1 samples (100%), 0.50 samples/s, about 0m00s left"
    assert progress_line("g", 0, 0, 0, 0.0) == "g: 0/0 samples (0%)"  # nothing to do is no division by zero
    assert progress_line("g", 3, 9, 3, 0.0) == "g: 3/9 samples (33%)"  # no time has passed: no rate yet


def test_an_interval_of_zero_logs_every_advance_and_none_logs_nothing(caplog):
    import logging

    from llasmol.inference.progress import generation_progress

    with caplog.at_level(logging.INFO, logger="llasmol.inference.progress"):
        with generation_progress("Scoring", 4, log_every_s=0) as advance:
            advance()
            advance(2)
        assert [r.getMessage().split(",")[0] for r in caplog.records] == [
            "Scoring: 0/4 samples (0%)", "Scoring: 1/4 samples (25%)", "Scoring: 3/4 samples (75%)",
            "Scoring: 3/4 samples (75%)"]  # the first line, one an advance, and the closing one
        caplog.clear()
        with generation_progress("Scoring", 4) as advance:  # off a terminal, not asked: silent
            advance(4)
        assert caplog.records == []


def test_on_a_terminal_the_bar_shows_count_and_rate(monkeypatch):
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    from llasmol.inference import progress

    columns = progress._columns()
    assert [type(c) for c in columns[:3]] == [TextColumn, BarColumn, MofNCompleteColumn]
    assert isinstance(columns[4], TimeRemainingColumn)
    rate = columns[3]

    class Task:
        speed = 2.345

    assert str(rate.render(Task())) == "2.3 samples/s"
    Task.speed = None
    assert str(rate.render(Task())) == ""
    shown = []

    class Bar:  # rich's Progress, recording what the command asks of it
        def __init__(self, *cols, transient):
            shown.append(("columns", len(cols), transient))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            shown.append("closed")

        def add_task(self, description, total, completed):
            shown.append((description, total, completed))
            return 7

        def advance(self, task, n):
            shown.append(("advance", task, n))

    monkeypatch.setattr(progress.sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr("rich.progress.Progress", Bar)
    with progress.generation_progress("Generating", 10, done=4) as advance:
        advance()
        advance(3)
    assert shown == [("columns", 5, True), ("Generating", 10, 4), ("advance", 7, 1), ("advance", 7, 3), "closed"]


def _terminal_bars(monkeypatch) -> list:
    """Pretend stdout is a terminal and record what each rich bar is asked: (description, total, unit, advances)."""
    from llasmol.inference import progress

    bars = []

    class Bar:
        def __init__(self, *cols, transient):
            self.row = {"columns": cols, "advanced": 0}
            bars.append(self.row)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.row["closed"] = True

        def add_task(self, description, total, completed):
            self.row.update(description=description, total=total)
            return 0

        def advance(self, task, n):
            self.row["advanced"] += n

    monkeypatch.setattr(progress.sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr("rich.progress.Progress", Bar)
    return bars


def test_baseline_and_audit_show_a_bar_with_rate_on_a_terminal(monkeypatch, tmp_path):
    """`baseline` counts samples answered (a task at a time), `audit` the raw files read; each bar ends full."""
    from conftest import compose_config

    from llasmol.audit import run_audit
    from llasmol.baseline import baseline

    bars = _terminal_bars(monkeypatch)
    result = baseline(compose_config([f"paths.output_dir={tmp_path / 'b'}", "method=rdkit"], config_name="baseline"))
    (bar,) = bars
    samples = sum(m["num_samples"] for m in result["metrics"].values())
    assert (bar["description"], bar["total"], bar["advanced"], bar["closed"]) == ("method=rdkit on test", samples,
                                                                                 samples, True)
    assert str(bar["columns"][3].render(type("Task", (), {"speed": 4.0}))) == "4.0 samples/s"
    bars.clear()
    run_audit(compose_config([f"paths.output_dir={tmp_path / 'a'}", "workers=1"], config_name="audit"))
    (bar,) = bars
    from llasmol.data.source import SMolInstructSource

    # The bundled excerpt: 11 tasks in 3 splits, each file under a MiB, so one MiB counted per file.
    source = SMolInstructSource.from_config(compose_config([f"paths.output_dir={tmp_path}"], config_name="audit").data)
    small = [source.raw_file(split, task).stat().st_size < 2**20 for split in source.splits for task in source.task_names()]
    files = len(small)
    assert all(small) and files == 3 * len(source.task_names())
    assert (bar["description"], bar["total"], bar["advanced"]) == ("Auditing", files, files)
    assert str(bar["columns"][3].render(type("Task", (), {"speed": 2.0}))) == "2.0 MiB/s"
