"""Workers of a long-lived Dask cluster (`ragledger run --scheduler`), made ready for the run about to use them:
each routes its Prefect events by the API URL of the run that sent them (flows/prefect_internals.py says why),
installed on every worker of the cluster, present and future, through a Dask worker plugin
(tests/test_operations.py).
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin


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
