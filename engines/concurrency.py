"""The one owner of a run's bound on model calls in flight (`model.concurrency`): how it is divided, and what keeps
each part. Nothing else divides it. The bound holds for the whole run:

1. over the processes that run its tasks (the flow's own, or each worker of its Dask cluster, local or long-lived),
   an even share each (`process_share`; the run counts its task processes when its flow starts, flows/runners.py
   `task_processes`, and its tasks take their share from tasks/stages.py `RunContext.task_processes`);
2. within one such process, over its model-call processes (engines/call_processes.py): one per
   REQUESTS_PER_CALL_PROCESS requests, at most one per core (`call_processes_for`), each taking `call_process_share`;
   the parent hands out at most `outstanding_bound` calls at once;
3. each model-call process keeps its share with the call gate of its endpoint (engines/call_gate.py, opened in
   engines/llm_http.py with the share as its slots).
"""

from __future__ import annotations

import os

# One model-call process per this many requests in flight, and at most one per core. One process's CPU per
# request in the openai client bounds it at hundreds of requests a second: answers arrive in waves and wait for
# each other; P1 runs faster with two processes than with one (docs/performance.md).
REQUESTS_PER_CALL_PROCESS = 32
MAX_CALL_PROCESSES = os.cpu_count() or 1
# Calls a model-call process may hold beyond its share: queued there, they go out the moment a slot frees, even
# while task threads hold this process's GIL. The rest wait in the parent, so the processes finish together: handed
# out all at once when queued, a shard's calls left one process to make the last of them alone while the other idled
# (docs/performance.md).
BACKLOG_PER_CALL_PROCESS = 128


def process_share(concurrency: int, processes: int) -> int:
    """One task process's share of the run's bound, when `processes` run its tasks."""
    return max(1, concurrency // max(1, processes))


def call_processes_for(concurrency: int) -> int:
    """How many model-call processes share a task process's bound of `concurrency` requests in flight."""
    return max(1, min(MAX_CALL_PROCESSES, concurrency // REQUESTS_PER_CALL_PROCESS))


def call_process_share(concurrency: int, i: int, n: int) -> int:
    """Model-call process i of n's share of `concurrency` (the first ones take the rest): the shares add up to it."""
    return concurrency // n + (1 if i < concurrency % n else 0)


def outstanding_bound(concurrency: int, n: int) -> int:
    """Calls n model-call processes with `concurrency` between them may hold at once: in flight, or queued there."""
    return concurrency + n * BACKLOG_PER_CALL_PROCESS
