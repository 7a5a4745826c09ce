"""Progress from inside tasks to whoever shows it (the CLI's rich progress bars).

Tasks call `advance(stage, n)`; with no listener registered (tests, Dask workers) it does nothing.
"""

from __future__ import annotations

import threading
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
