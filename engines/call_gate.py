"""An endpoint's bound on requests in flight, and the order in which queued calls get a slot.

A server that answers one request at a time and keeps the previous prompt in its KV cache (the embedded llama.cpp
server) evaluates only the part of the next prompt that differs from the last one. So when such an endpoint's slot
frees, the waiting call whose prompt shares the longest prefix with the prompt its server was sent last goes next
(the embedded backend's log-probability server shares the main server's slot and keeps its own KV cache): the
self-consistency samples of one prompt, the two candidate-conditioned summaries of one SuRe question, the calls of
several readers over the same passages go back to back instead of in submission order. A shared prefix shorter
than MIN_SHARED_CHARS (a chat template's header, a one-line instruction) counts as none. Among the calls that share
none, the one with the most rounds of its strategy still to come goes first (`rounds_after`, from the generate
stage): its answer lets the next round's calls join the queue while the calls they share a prefix with still wait
there (SuRe's conditional summaries share the passages with the generic summary of Sum-and-pred, its MCQ call and
the summaries-appended prediction share them with Base), instead of arriving after those have gone. Then the call
that waited longest. With more than one slot (vLLM, OpenAI: batching servers with their own prefix caches) calls are
admitted first come, first served. Ordering changes when a call is made, never its request or cache key; on
llama.cpp its text can change with it, as the logits of a prompt depend slightly on which of its prefixes came from
the KV cache (in arrival order too; docs/performance.md, The embedded model).

`RAGLEDGER_PREFIX_ORDER=0` turns the prefix order off (first come, first served), to measure what it saves
(tests/benchmarks/test_prefix_order.py). `RAGLEDGER_GATE_LOG=<file>` appends one JSON line per admitted call:
the process, the gate, the calls waiting at that moment (the admitted one included; 0 when the slot was free and
nobody waited), the characters the prompt shares with the one its server was sent before, its length and a digest of it
(sha256 of "system\x00prompt", first 16 hex digits).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import json
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

# A shared prefix shorter than this (~64 tokens) saves less than moving a multi-round strategy on
MIN_SHARED_CHARS = 256


def prefix_order_enabled() -> bool:
    return os.environ.get("RAGLEDGER_PREFIX_ORDER", "1") != "0"


def admission_log_from_env() -> Callable[[dict], None] | None:
    """The `on_admit` hook that appends each admission to the file named by RAGLEDGER_GATE_LOG; None if unset."""
    path = os.environ.get("RAGLEDGER_GATE_LOG")
    if not path:
        return None

    def write(entry: dict) -> None:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    return write


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix of a and b, by bisection over slice comparisons (done in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(eq=False)  # compared by identity: removed from the queue as itself
class _Waiter:
    seq: int
    text: str
    server: str
    rounds_after: int
    admitted: asyncio.Future


class CallGate:
    """At most `slots` calls in flight; with one slot and `prefix_order`, the longest-shared-prefix call goes next."""

    def __init__(self, slots: int, prefix_order: bool = True, on_admit: Callable[[dict], None] | None = None,
                 min_shared: int = MIN_SHARED_CHARS) -> None:
        if slots < 1:
            raise ValueError(f"a call gate needs at least one slot, got {slots}")
        self.slots = slots
        self.prefix_order = prefix_order and slots == 1
        self._free = slots
        # in arrival order (seq ascending): the first comes next in arrival order, at O(1) however many calls wait
        # (thousands, when a shard's calls are queued at once)
        self._waiting: collections.deque[_Waiter] = collections.deque()
        # per server behind the gate (the embedded backend's log-probability server shares its bound): the prompt
        # admitted to it last, what its KV cache holds next
        self._last: dict[str, str] = {}
        self._seq = itertools.count()
        self._on_admit = on_admit  # called with each admission's record (admission_log_from_env)
        self._min_shared = min_shared

    @contextlib.asynccontextmanager
    async def slot(self, text: str, server: str = "", rounds_after: int = 0) -> AsyncIterator[None]:
        """Hold one slot for the duration of the block; `text` is the call's full prompt (system + user), `server`
        the server it goes to, where one gate bounds several (each keeps its own previous prompt); `rounds_after`
        how many rounds of the calling strategy follow this call's."""
        await self._acquire(text, server, rounds_after)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, text: str, server: str, rounds_after: int) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            self._admit(text, server, 0)
            return
        waiter = _Waiter(next(self._seq), text, server, rounds_after, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        try:
            await waiter.admitted
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.admitted.done() and not waiter.admitted.cancelled():
                self._release()  # it was handed the slot as it was cancelled: pass the slot on
            raise

    def _release(self) -> None:
        if not self._waiting:
            self._free += 1
            return
        queued = len(self._waiting)
        if self.prefix_order:
            best = max(self._waiting, key=self._priority)
            self._waiting.remove(best)
        else:
            best = self._waiting.popleft()
        self._admit(best.text, best.server, queued)
        best.admitted.set_result(None)

    def _priority(self, w: _Waiter) -> tuple[int, int, int]:
        shared = common_prefix_len(self._last.get(w.server, ""), w.text)
        return (shared if shared >= self._min_shared else 0), w.rounds_after, -w.seq

    def _admit(self, text: str, server: str, queued: int) -> None:
        last = self._last.get(server, "")
        if self._on_admit is not None:
            self._on_admit({"t": round(time.time(), 3), "pid": os.getpid(), "gate": id(self),
                            "order": "prefix" if self.prefix_order else "arrival", "queued": queued,
                            "shared": common_prefix_len(last, text), "chars": len(text),
                            "digest": hashlib.sha256(text.encode()).hexdigest()[:16]})
        self._last[server] = text
