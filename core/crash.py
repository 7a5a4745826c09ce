"""Crash points for the crash-and-resume tests: `RAGLEDGER_CRASH_AT=<point>:<n>` kills the process
with SIGKILL the n-th time it passes <point>. Unset (always, outside those tests) it costs one dict
lookup. Points: retrieve.done, generate.call, events.before_rename, mlflow.log."""

from __future__ import annotations

import os
import signal
import threading

_counts: dict[str, int] = {}
_lock = threading.Lock()


def crashpoint(name: str) -> None:
    target = os.environ.get("RAGLEDGER_CRASH_AT")
    if not target:
        return
    point, _, nth = target.partition(":")
    if point != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        hit = _counts[name] == int(nth or 1)
    if hit:
        os.kill(os.getpid(), signal.SIGKILL)
