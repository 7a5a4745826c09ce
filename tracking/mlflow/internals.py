"""Every use ragledger makes of MLflow's private internals, in one place (tests/test_library_internals.py fails
loudly when an MLflow release changes one of them; the pinned version is in constraints.txt).

ragledger writes a question's trace after the fact, with the times its records carry (tracking/mlflow/traces.py),
where MLflow's public API only traces code as it runs: it opens OpenTelemetry spans itself, and uploads the trace
data the way MLflow's own exporter does. A run's Dataset input is logged by the client (no active run), which takes
the entity form of a dataset.
"""

from __future__ import annotations

from typing import Any


def otel_span(span: Any) -> Any:
    """The OpenTelemetry span inside an MLflow LiveSpan: a child span is opened in its context, and it is ended at
    the time the record says."""
    return span._span


def upload_trace_data(tracing_client: Any, stored_info: Any, spans: list[Any]) -> None:
    """Upload a trace's spans as its data artifact (a tracking store that keeps no spans itself), as MLflow's
    exporter does."""
    from mlflow.entities import TraceData

    tracing_client._upload_trace_data(stored_info, TraceData(spans))


def dataset_entity(dataset: Any) -> Any:
    """The entity form of an MLflow dataset, which `MlflowClient.log_inputs` takes."""
    return dataset._to_mlflow_entity()
