"""A run's Dask workers. Those of a long-lived cluster (`ragledger run --scheduler`) are made ready for the run about
to use them: each routes its Prefect events by the API URL of the run that sent them (flows/prefect_internals.py
says why), installed on every worker of the cluster, present and future, through a Dask worker plugin
(tests/test_operations.py). Any worker's progress reaches the run's display through the scheduler
(`progress_from_workers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from core import progress
from tasks.stage_runs import progress_topic


class PrefectEventsByApiUrl(WorkerPlugin):
    name = "ragledger-prefect-events-by-api-url"  # registered again by every run: replaced, not added

    def setup(self, worker: Any) -> None:
        from flows.prefect_internals import route_events_by_api_url

        route_events_by_api_url()


def ready_long_lived_workers(scheduler_address: str) -> None:
    """Install PrefectEventsByApiUrl on the cluster's workers before the run submits its first task."""
    from distributed import Client

    with Client(scheduler_address, timeout=30) as client:
        client.register_plugin(PrefectEventsByApiUrl())


@contextlib.contextmanager
def progress_from_workers(task_runner: Any, run_token: str) -> Iterator[None]:
    """Inside: the progress reports of this run's tasks on Dask workers (tasks/stage_runs.py `progress_to_run`,
    Dask events through the scheduler) replayed into this process's listener as they come, so the run's bars and
    lines move with its workers' calls, on this host or another. Nothing without a listener to show them."""
    if not progress.listening():
        yield
        return
    client, topic = task_runner.client, progress_topic(run_token)
    client.subscribe_topic(topic, lambda event: progress.replay(list(event[1])))
    try:
        yield
    finally:
        client.unsubscribe_topic(topic)
