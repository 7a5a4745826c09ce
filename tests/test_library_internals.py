"""The private internals of Prefect and MLflow that ragledger uses, each used from one adapter module
(flows/prefect_internals.py, tracking/mlflow/internals.py): these fail, naming the internal, when a release of the
library moves or changes one, before a run meets it. tests/test_operations.py and tests/test_mlflow_traces.py
exercise them end to end."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from tests.test_architecture import LAYERS

REPO = Path(__file__).resolve().parents[1]
ADAPTERS = {"prefect": "flows/prefect_internals.py", "mlflow": "tracking/mlflow/internals.py"}


def test_prefect_cron_validator_accepts_and_refuses():
    from flows.prefect_internals import validate_cron_string

    validate_cron_string("*/5 * * * *")
    with pytest.raises(ValueError, match="Invalid cron string"):
        validate_cron_string("every day")


def test_prefect_events_worker_is_keyed_as_the_routing_expects():
    from prefect._internal.concurrency.services import _QueueServiceBase
    from prefect.events import worker as events

    # the routing calls the base class's instance(klass, client_type, key) and reads the override and settings it does
    assert list(inspect.signature(_QueueServiceBase.instance.__func__).parameters)[:2] == ["cls", "args"], \
        "prefect._internal.concurrency.services._QueueServiceBase.instance changed its signature"
    assert list(inspect.signature(events.EventsWorker.instance.__func__).parameters)[:2] == ["cls", "client_type"]
    assert hasattr(events.EventsWorker, "_client_override"), "EventsWorker._client_override is gone"
    for name in ("emit_events_to_cloud", "should_emit_events_to_running_server", "PrefectEventsClient", "PREFECT_API_URL"):
        assert hasattr(events, name), f"prefect.events.worker.{name} is gone"


def test_prefect_events_routing_installs_once_and_keeps_other_clients():
    from prefect.events import worker as events

    from flows.prefect_internals import route_events_by_api_url

    route_events_by_api_url()
    patched = events.EventsWorker.instance
    route_events_by_api_url()
    assert events.EventsWorker.instance == patched and events.EventsWorker._ragledger_by_api_url


def test_mlflow_span_trace_and_dataset_internals(tmp_path):
    import pandas as pd
    from mlflow.entities import LiveSpan
    from mlflow.tracing.client import TracingClient

    from tracking.mlflow.internals import dataset_entity, otel_span

    assert callable(getattr(TracingClient, "_upload_trace_data", None)), "TracingClient._upload_trace_data is gone"
    assert list(inspect.signature(TracingClient._upload_trace_data).parameters)[1:3] == ["trace_info", "trace_data"]
    assert "_span" in inspect.getsource(LiveSpan.__init__), "mlflow's LiveSpan no longer holds its OpenTelemetry span"

    import mlflow.data

    dataset = mlflow.data.from_pandas(pd.DataFrame({"qid": ["q1"]}), name="questions")
    entity = dataset_entity(dataset)
    assert entity.name == "questions" and entity.digest

    from opentelemetry.sdk.trace import TracerProvider

    raw = TracerProvider().get_tracer("t").start_span("s")
    span = LiveSpan(raw, "tr-1", "UNKNOWN")
    assert otel_span(span) is raw


@pytest.mark.parametrize("library", sorted(ADAPTERS))
def test_private_internals_are_touched_only_in_their_adapter(library):
    """No other module imports a private module of the library or reaches a private attribute this one names."""
    adapter = REPO / ADAPTERS[library]
    private = set(re.findall(r"\._([a-z][a-z_]+)\b", adapter.read_text())) - {"ragledger_by_api_url"}
    offenders = []
    for path in sorted(REPO.glob("*/**/*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.split("/")[0] not in LAYERS or path == adapter:
            continue
        text = path.read_text()
        if re.search(rf"\bfrom {library}\._|\bimport {library}\._|\b{library}(\.\w+)*\._internal", text):
            offenders.append(f"{rel}: imports a private module of {library}")
        offenders += [f"{rel}: ._{name}" for name in private if re.search(rf"\._{name}\b", text)]
    assert not offenders, offenders
