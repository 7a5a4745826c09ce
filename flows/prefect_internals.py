"""Every use ragledger makes of Prefect's private internals, in one place (tests/test_library_internals.py fails
loudly when a Prefect release changes one of them; the pinned version is in constraints.txt).

- `validate_cron_string`: the check Prefect applies to a deployment's cron schedule, made before anything is
  written (`ragledger schedule --cron`), so a bad expression is one `error:` line instead of a failure at serve time.
- `route_events_by_api_url`: Prefect keeps one events worker per process, keyed without the API's URL. Task runs
  report their states as events, so a Dask worker that outlives one run's temporary Prefect server kept sending
  every later run's task-run events to that first server, long gone ("Unable to connect to 'ws://127.0.0.1:<old
  port>/api/events/in' ... event data (including task run data) may be lost", in the worker's log): those runs' task
  runs never reached their own server. Keyed by the URL the calling task's settings name, each run's events reach
  the server that run started (flows/dask_workers.py installs it on a long-lived cluster's workers;
  tests/test_operations.py).
"""

from __future__ import annotations

from typing import Any


def validate_cron_string(cron: str) -> None:
    """ValueError naming what is wrong with a cron expression, as Prefect's schedule would refuse it."""
    from prefect._internal.schemas.validators import validate_cron_string as prefect_validate

    prefect_validate(cron)


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
