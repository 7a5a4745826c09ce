"""Workers of a long-lived Dask cluster (`ragledger run --scheduler`), made ready for the run about to use them.

Prefect keeps one events worker per process, keyed without the API's URL. Task runs report their states as events,
so a Dask worker that outlives one run's temporary Prefect server kept sending every later run's task-run events to
that first server, long gone ("Unable to connect to 'ws://127.0.0.1:<old port>/api/events/in' ... event data
(including task run data) may be lost", in the worker's log): those runs' task runs never reached their own server.
`route_events_by_api_url` keys the events worker by the URL the calling task's settings name, so each run's events
reach the server that run started; `ready_long_lived_workers` installs it on every worker of the cluster, present
and future, through a Dask worker plugin (tests/test_operations.py).
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin


def route_events_by_api_url() -> None:
    """One Prefect events worker per API URL in this process (idempotent)."""
    from prefect._internal.concurrency.services import _QueueServiceBase
    from prefect.events import worker as events

    cls = events.EventsWorker
    if getattr(cls, "_ragledger_by_api_url", False):
        return
    original = cls.instance.__func__

    def instance(klass: type, client_type: Any = None) -> Any:
        # only the case Prefect keys without a URL: a self-hosted server named by PREFECT_API_URL
        if (client_type is None and klass._client_override is None and not events.emit_events_to_cloud()
                and events.should_emit_events_to_running_server()):
            url = events.PREFECT_API_URL.value()
            return _QueueServiceBase.instance.__func__(klass, events.PrefectEventsClient, (("api_url", url),))
        return original(klass, client_type)

    cls.instance = classmethod(instance)
    cls._ragledger_by_api_url = True


class PrefectEventsByApiUrl(WorkerPlugin):
    name = "ragledger-prefect-events-by-api-url"  # registered again by every run: replaced, not added

    def setup(self, worker: Any) -> None:
        route_events_by_api_url()


def ready_long_lived_workers(scheduler_address: str) -> None:
    """Install PrefectEventsByApiUrl on the cluster's workers before the run submits its first task."""
    from distributed import Client

    with Client(scheduler_address, timeout=30) as client:
        client.register_plugin(PrefectEventsByApiUrl())
