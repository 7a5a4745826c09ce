"""Progress from inside tasks to whoever shows it (the CLI's rich progress bars).

Tasks call `advance(stage, n)`; with no listener registered (tests, Dask workers) it does nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

_listener: Callable[[str, int], None] | None = None
_total_listener: Callable[[str, int], None] | None = None
_lock = threading.Lock()


def set_listener(fn: Callable[[str, int], None] | None, total_fn: Callable[[str, int], None] | None = None) -> None:
    global _listener, _total_listener
    _listener, _total_listener = fn, total_fn


def set_total(stage: str, total: int) -> None:
    fn = _total_listener
    if fn is not None:
        with _lock:
            fn(stage, total)


def advance(stage: str, n: int = 1) -> None:
    fn = _listener
    if fn is not None:
        with _lock:
            fn(stage, n)


class PlainProgress:
    """Progress as plain lines, for output that is not a terminal (a log file of an hours-long run, CI):
    each stage's count at most every `every_s` seconds and when it completes, with elapsed time and time left."""

    def __init__(self, emit: Callable[[str], None], every_s: float = 30.0, clock: Callable[[], float] | None = None):
        self.emit, self.every_s, self.clock = emit, every_s, clock or time.monotonic
        self.totals: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.started: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def total(self, stage: str, n: int) -> None:
        """A stage's total is set once per experiment, before it advances: each experiment of a sweep restarts it
        (as the rich bars are reset)."""
        self.totals[stage] = n
        self.done[stage] = 0
        self.started[stage] = self.last[stage] = self.clock()

    def advance(self, stage: str, n: int) -> None:
        now = self.clock()
        started = self.started.setdefault(stage, now)
        done = self.done[stage] = self.done.get(stage, 0) + n
        total = self.totals.get(stage)
        finished = total is not None and done >= total
        if not finished and now - self.last.get(stage, started) < self.every_s:
            return
        self.last[stage] = now
        elapsed = now - started
        line = f"progress: {stage} {done:,}/{total:,}" if total else f"progress: {stage} {done:,}"
        line += f", {elapsed:.0f} s"
        if total and not finished and done and elapsed > 0:
            line += f", ~{(total - done) * elapsed / done:.0f} s left"
        self.emit(line + (" (done)" if finished else ""))
