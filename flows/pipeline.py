"""Submit each stage task the moment its upstream result is in, instead of one stage layer after another.

The experiment's stages form a chain per (cell, shard): retrieve -> generate round 1..n -> vote -> evaluate. Run as
layers, every shard waits for the slowest shard of the previous stage, and the CPU work of retrieval, voting and
evaluation sits in series with generation. Here each finished task hands its result to a continuation that submits
the next task of its chain, so shard i is voted and evaluated while later shards still generate.

Continuations run in the flow's own thread (the one that called `run`), so they may keep plain dicts and counters
without locks; futures only report completion through a queue. Works for any Prefect future with
`add_done_callback` (the thread pool's and prefect-dask's).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from tasks.stages import StageResult


class Pipeline:
    def __init__(self, on_result: Callable[[str, StageResult], None] | None = None):
        self._done: queue.Queue = queue.Queue()
        self._pending = 0
        self._on_result = on_result  # called for every accepted result (accounting, progress)
        self.started = time.perf_counter()
        self.last_done: dict[str, float] = {}  # stage -> seconds from start when its latest task finished

    def submit(self, stage: str, task_obj: Any, params: dict, then: Callable[[StageResult], None]) -> None:
        """Submit `task_obj(**params)`; when it finishes, `then(result)` runs in the thread that calls `run`."""
        future = task_obj.submit(**params)
        self._pending += 1
        future.add_done_callback(lambda f: self._done.put((f, stage, task_obj, params, then)))

    def run(self) -> None:
        """Drive every submitted chain to its end. A task's error is raised here, ending the run."""
        while self._pending:
            future, stage, task_obj, params, then = self._done.get()
            self._pending -= 1
            result: StageResult = future.result()
            if not result.segment_exists():
                # a persisted result whose segment was deleted (store removed under a warm Prefect cache): recompute
                self.submit(stage, task_obj.with_options(refresh_cache=True), params, then)
                continue
            self.last_done[stage] = time.perf_counter() - self.started
            if self._on_result is not None:
                self._on_result(stage, result)
            then(result)

    def stage_spans(self, stages: list[str]) -> dict[str, float]:
        """Wall time split at the moment each stage's last task finished (stages in chain order): the figures add
        up to the pipeline's wall time, and each says how long the run waited for that stage after the one before."""
        spans, previous = {}, 0.0
        for stage in stages:
            end = max(self.last_done.get(stage, previous), previous)
            spans[stage] = round(end - previous, 2)
            previous = end
        return spans
