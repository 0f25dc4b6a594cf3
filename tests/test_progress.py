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
