"""Shards retrieved before the flow's tasks ran (flows/warmup.py), handed to their retrieve tasks (tasks/retrieve.py).

Apart from tasks/retrieve.py so that `ragledger run` opens the hand-over without importing pandas and the stages:
the warm-up thread, which starts the JVM, starts before those imports (~0.7 s on a 2-core machine), not after them.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strategies.retrievers import Hit
    from tasks.stages import RetrieveStage

# Shards retrieved before the flow's tasks ran (flows/warmup.py): stage key -> a future of its hits, filled by the
# warm-up and taken once by that stage's task instead of searching again. Claims are taken only between open_prefetch
# and close_prefetch (the flow starting), so a retrieve task either finds its shard claimed and waits for it, or
# retrieves it alone: never both at once.
_prefetched: dict[str, concurrent.futures.Future] = {}
_prefetch_open = False
_prefetch_lock = threading.Lock()


def open_prefetch() -> None:
    global _prefetch_open
    with _prefetch_lock:
        _prefetched.clear()
        _prefetch_open = True


def close_prefetch() -> None:
    global _prefetch_open
    with _prefetch_lock:
        _prefetch_open = False


def claim_prefetch(stage: RetrieveStage) -> concurrent.futures.Future | None:
    """A future for the hits of `stage`, for the warm-up to fill; None once the flow has started."""
    with _prefetch_lock:
        if not _prefetch_open or stage.key in _prefetched:
            return None
        future = _prefetched[stage.key] = concurrent.futures.Future()
        return future


def take_prefetched(stage: RetrieveStage) -> dict[str, list[Hit]] | None:
    """The hits the warm-up retrieved for `stage` (waiting for them if it is on it), or None."""
    with _prefetch_lock:
        future = _prefetched.pop(stage.key, None)
    if future is None:
        return None
    try:
        return future.result()
    except Exception:  # the warm-up failed on it: the task retrieves and meets the error itself
        return None
