"""Progress for generation and evaluation: a rich bar (samples done / total, rate) on a terminal only."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator


def _columns():
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed:.1f} samples/s" if task.speed else "")

    return TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeRemainingColumn()


@contextmanager
def generation_progress(description: str, total: int, live=None) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`. Given a `live` rich display (a training run's progress bar), adds a row to it
    (rich allows one live display at a time); elsewhere opens its own bar; off a terminal it does nothing."""
    if live is not None:
        task = live.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            live.advance(task, n)
            # Lightning's bar redraws only on its own steps; generation holds the loop for minutes.
            live.refresh()

        try:
            yield advance
        finally:
            live.remove_task(task)
        return
    if not sys.stdout.isatty():
        yield lambda n=1: None
        return
    from rich.progress import Progress

    with Progress(*_columns(), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)
