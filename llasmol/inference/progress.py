"""Progress for generation and evaluation: a rich bar (samples done / total, rate) on a terminal; off a
terminal, when asked, a log line at a steady interval (a 7B evaluation runs for hours under nohup or SLURM)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

log = logging.getLogger(__name__)


def _columns(unit: str = "samples"):
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeRemainingColumn
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            return Text(f"{task.speed:.1f} {unit}/s" if task.speed else "")

    return TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(), TimeRemainingColumn()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def progress_line(description: str, done: int, total: Optional[int], new: int, elapsed: float,
                  unit: str = "samples") -> str:
    """'<description>: 120/330 samples (36%), 2.10 samples/s, about 1m40s left': the rate counts only the
    samples answered since this process started (`new` in `elapsed` seconds), not those a stopped run kept.
    `total` None: work with no end set ('training: 20 steps, 2.00 steps/s, no end set')."""
    line = f"{description}: {done} {unit}" if total is None else \
        f"{description}: {done}/{total} {unit} ({done / max(total, 1):.0%})"
    if new and elapsed > 0:
        rate = new / elapsed
        line += f", {rate:.2f} {unit}/s, " + ("no end set" if total is None else
                                                 f"about {_duration((total - done) / rate)} left")
    return line


@contextmanager
def _logged(description: str, total: int, done: int, every_s: float, unit: str) -> Iterator[Callable[[int], None]]:
    state = {"done": done}
    start, stop = time.monotonic(), threading.Event()

    def line() -> str:
        return progress_line(description, state["done"], total, state["done"] - done, time.monotonic() - start, unit)

    def tick() -> None:
        # A clock of its own: one batch of a 7B model can take longer than the interval.
        while not stop.wait(every_s):
            log.info("%s", line())

    def advance(n: int = 1) -> None:
        state["done"] += n
        if every_s == 0:
            log.info("%s", line())

    log.info("%s", line())
    ticker = threading.Thread(target=tick, daemon=True) if every_s > 0 else None
    if ticker is not None:
        ticker.start()
    try:
        yield advance
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
    log.info("%s", line())


@contextmanager
def generation_progress(description: str, total: int, live=None, done: int = 0,
                        log_every_s: Optional[float] = None, unit: str = "samples") -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`; `done` of `total` (counted in `unit`: samples, or the audit's MiB) are finished
    already. Given a `live` rich display (a training run's progress bar), adds a row to it (rich allows one live display at a time); elsewhere opens its own
    bar; off a terminal it logs a line every `log_every_s` seconds (0: at every advance) or, when None,
    says nothing."""
    if live is not None:
        task = live.add_task(description, total=total, completed=done)

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
        if log_every_s is None:
            yield lambda n=1: None
        else:
            with _logged(description, total, done, log_every_s, unit) as advance:
                yield advance
        return
    from rich.progress import Progress

    with Progress(*_columns(unit), transient=True) as bar:
        task = bar.add_task(description, total=total, completed=done)
        yield lambda n=1: bar.advance(task, n)
