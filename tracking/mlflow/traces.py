"""Per-example lineage as MLflow traces, for a bounded sample of an execution's questions.

One trace per sampled question, attached to the execution's MLflow experiment: a root span for the question, one
span per cell, and under each the cell's retrieval (its passages as documents), every generation (prompt, raw
output, parse status), the vote and the outcome (tracking/analysis/lineage.py's chain, as `ragledger trace` shows it). The
trace's source run is the execution's parent run and it is linked to every cell run, so the experiment's and each
cell run's Traces tab list it. Every span carries the attribute `ragledger.qid`.

The sample: RAGLEDGER_MLFLOW_TRACES questions (default 10; 0 turns traces off), the hardest first: those the most
cells get wrong (EM), then the lowest mean F1.

Traces are written to the logger's own tracking URI, never the process-wide one: MLflow's tracing APIs (fluent, and
MlflowClient.start_trace) export through a process-global tracer provider bound to mlflow.get_tracking_uri(), and
ragledger never sets that (tracking/mlflow/log.py MlflowLogger). The spans are built on a private OpenTelemetry tracer
provider with no exporter, then written by a TracingClient bound to the URI, as MLflow's own exporter writes a
finished trace (spans, then the trace info; span data as an artifact where the store keeps no spans). Nothing
global is set or read, so concurrent logging to other URIs in the same process is unaffected.

Span times are laid out in sequence from the question's first record (records carry no start times): a generation
lasts its recorded latency, every other step a millisecond.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pandas as pd

from tracking.mlflow.internals import otel_span, upload_trace_data
from tracking.mlflow.log import EXECUTION_TAG

TRACES_ENV = "RAGLEDGER_MLFLOW_TRACES"
DEFAULT_TRACES = 10
QID_ATTRIBUTE = "ragledger.qid"
PREVIEW_CHARS = 1000  # request/response previews in the traces table
TEXT_CHARS = 20000  # one passage, prompt or output in a span: bounded, so one odd record cannot bloat a trace
LINK_BATCH = 100  # MlflowClient.link_traces_to_run takes at most 100 trace ids


def sample_size(environ: dict[str, str] | None = None) -> int:
    """How many questions get a trace: RAGLEDGER_MLFLOW_TRACES (0 = none), else DEFAULT_TRACES."""
    value = (os.environ if environ is None else environ).get(TRACES_ENV, "").strip()
    if not value:
        return DEFAULT_TRACES
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(f"{TRACES_ENV}={value!r}: expected a number of questions (0 = no traces)") from None


def hardest_qids(outcomes: pd.DataFrame, n: int) -> list[str]:
    """The n questions the most cells get wrong (EM < 1), then the lowest mean F1, then by id. EoR cells choose
    among their members' answers over held-out questions only: they do not count."""
    from core.cell import is_ensemble_retriever

    if n <= 0 or outcomes.empty:
        return []
    own = outcomes[~outcomes["retriever"].astype(str).map(is_ensemble_retriever)]
    df = own if not own.empty else outcomes
    per_q = df.groupby("qid").agg(wrong=("em", lambda s: int((s < 1).sum())), f1=("f1", "mean")).reset_index()
    per_q = per_q.sort_values(["wrong", "f1", "qid"], ascending=[False, True, True])
    return [str(q) for q in per_q["qid"].head(n)]


def _cut(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + f" … [{len(text) - TEXT_CHARS} more chars]"


def _preview(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:PREVIEW_CHARS]


class _SpanBuilder:
    """Finished MLflow spans of one trace, on a private tracer: nothing is exported while they are built."""

    def __init__(self, tracer: Any, qid: str, start_ns: int):
        self.tracer, self.qid, self.now = tracer, qid, start_ns
        self.spans: list[Any] = []  # LiveSpans, in start order
        self.trace_id: str | None = None

    def open(self, name: str, span_type: str, parent: Any | None, inputs: Any = None,
             attributes: dict[str, Any] | None = None) -> Any:
        from mlflow.entities import LiveSpan
        from mlflow.tracing.utils import generate_trace_id_v3
        from opentelemetry import trace as otel

        context = otel.set_span_in_context(otel_span(parent)) if parent is not None else None
        raw = self.tracer.start_span(name, context=context, start_time=self.now)
        if self.trace_id is None:
            self.trace_id = generate_trace_id_v3(raw)
        span = LiveSpan(raw, self.trace_id, span_type)
        if inputs is not None:
            span.set_inputs(inputs)
        span.set_attributes({QID_ATTRIBUTE: self.qid, **(attributes or {})})
        self.spans.append(span)
        return span

    def close(self, span: Any, outputs: Any = None, duration_ms: float = 1.0, status: str = "OK") -> None:
        from mlflow.entities import SpanStatus

        self.now += max(1_000_000, int(duration_ms * 1_000_000))
        if outputs is not None:
            span.set_outputs(outputs)
        span.set_status(SpanStatus(status))
        otel_span(span).end(end_time=self.now)

    def step(self, name: str, span_type: str, parent: Any, inputs: Any, outputs: Any,
             attributes: dict[str, Any] | None = None, duration_ms: float = 1.0, status: str = "OK") -> None:
        self.close(self.open(name, span_type, parent, inputs, attributes), outputs, duration_ms, status)


def _cell_spans(b: _SpanBuilder, root: Any, chain: Any, question: str, golds: list[str]) -> None:
    """One cell's span and, under it, its retrieval, generations, vote and outcome."""
    from mlflow.entities import SpanType

    from tracking.analysis.lineage import passage_has_gold

    o = chain.outcome
    cell = b.open(str(o.cell), SpanType.CHAIN, root, {"question": question},
                  {"ragledger.cell": str(o.cell), "retriever": str(o.retriever), "reader": str(o.reader)})
    if chain.is_ensemble:
        cell.set_attribute("ragledger.note", "EoR cell: the answer was chosen among its member cells' answers")
    elif not chain.passages.empty:
        docs = [{"page_content": _cut(p.text), "id": str(p.pid),
                 "metadata": {"doc_uri": str(p.pid), "title": str(p.title), "rank": int(p.rank),
                              "score": None if pd.isna(p.score) else float(p.score),
                              "has_gold": passage_has_gold(str(p.text), golds)}}
                for p in chain.passages.itertuples()]
        b.step("retrieval", SpanType.RETRIEVER, cell, {"query": question, "retriever": str(o.retriever)}, docs)
    for g in chain.generations.itertuples():
        attributes = {"round": int(g.round), "role": str(g.role), "call_index": int(g.call_index),
                      "sample_index": int(g.sample_index), "parse_status": str(g.parse_status),
                      "model": str(g.model), "from_cache": bool(g.from_cache), "call_id": str(g.call_id),
                      "prompt_version": str(g.prompt_version), "tokens_in": int(g.tokens_in),
                      "tokens_out": int(g.tokens_out)}
        b.step(f"generation r{g.round}·{g.role}·{g.call_index}.{g.sample_index}", SpanType.LLM, cell,
               {"system": _cut(g.system_prompt), "prompt": _cut(g.prompt)},
               {"output": _cut(g.output), "parsed_answer": str(g.parsed_answer), "parse_status": str(g.parse_status)},
               attributes, float(g.latency_ms or 0), "ERROR" if g.parse_status == "error" else "OK")
    for v in chain.votes.itertuples():
        scores = [float(x) for x in v.scores] if v.scores is not None else []
        b.step(f"vote · {v.method}", SpanType.CHAIN, cell, {"candidates": [str(x) for x in v.candidates],
                                                            "scores": scores}, {"chosen": str(v.chosen)},
               {"method": str(v.method)})
    verdict = {"em": float(o.em), "f1": float(o.f1), "error_type": str(o.error_type),
               "gold_in_context": bool(o.gold_in_context)}
    b.step("outcome", SpanType.EVALUATOR, cell, {"prediction": str(o.prediction), "gold": golds}, verdict)
    b.close(cell, {"prediction": str(o.prediction), **verdict})


def build_trace(tracer: Any, question: pd.Series, chains: list[Any], start_ns: int, experiment_id: str,
                execution: str, parent_run_id: str) -> tuple[Any, list[Any]]:
    """The TraceInfo and finished spans of one question's lineage through `chains` (one per cell)."""
    from mlflow.entities import SpanType, TraceInfo, TraceState
    from mlflow.entities.trace_location import TraceLocation
    from mlflow.tracing.constant import TRACE_SCHEMA_VERSION, TRACE_SCHEMA_VERSION_KEY, TraceMetadataKey, TraceTagKey

    qid, text = str(question["qid"]), str(question["question"])
    golds = [str(a) for a in question["answers"]]
    wrong = sum(1 for c in chains if float(c.outcome.em) < 1)
    b = _SpanBuilder(tracer, qid, start_ns)
    inputs = {"qid": qid, "question": text, "gold": golds}
    root = b.open(f"question {qid}", SpanType.CHAIN, None, inputs,
                  {"ragledger.cells_wrong": wrong, "ragledger.cells": len(chains)})
    for chain in chains:
        _cell_spans(b, root, chain, text, golds)
    outputs = {str(c.outcome.cell): str(c.outcome.prediction) for c in chains}
    b.close(root, outputs, duration_ms=0)
    spans = [s.to_immutable_span() for s in b.spans]
    info = TraceInfo(
        trace_id=b.trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start_ns // 1_000_000, execution_duration=(b.now - start_ns) // 1_000_000, state=TraceState.OK,
        request_preview=_preview(text), response_preview=_preview(outputs),
        trace_metadata={TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION), TraceMetadataKey.SOURCE_RUN: parent_run_id,
                        TraceMetadataKey.INPUTS: _preview(inputs), TraceMetadataKey.OUTPUTS: _preview(outputs)},
        tags={TraceTagKey.TRACE_NAME: f"question {qid}", EXECUTION_TAG: execution, QID_ATTRIBUTE: qid,
              "ragledger.cells_wrong": str(wrong)})
    return info, spans


def write_trace(tracing_client: Any, info: Any, spans: list[Any]) -> str:
    """Write a finished trace to the client's store as MLflow's exporter does; returns its trace id."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracing.constant import SpansLocation, TraceTagKey

    try:
        tracing_client.log_spans(info.experiment_id, spans)
    except NotImplementedError:  # a store without span logging: the spans go as the trace's data artifact below
        pass
    except MlflowException as exc:  # a server whose store takes no spans over REST says so (as MLflow's exporter reads it)
        if "not supported" not in str(exc):
            raise
    stored = tracing_client.start_trace(info)
    if stored.tags.get(TraceTagKey.SPANS_LOCATION) != SpansLocation.TRACKING_STORE.value:
        upload_trace_data(tracing_client, stored, spans)
    return stored.trace_id


def logged_qids(client: Any, experiment_id: str, execution: str) -> set[str]:
    """Questions of this execution that already have a trace (a retried logging adds no second one)."""
    quoted = execution.replace("'", "\\'")
    found = client.search_traces(locations=[experiment_id], filter_string=f"tag.`{EXECUTION_TAG}` = '{quoted}'",
                                 max_results=1000, include_spans=False)
    return {t.info.tags.get(QID_ATTRIBUTE) for t in found} - {None}


def log_traces(logger: Any, execution: str, read: Callable[[str], pd.DataFrame | None], questions: pd.DataFrame,
               parent_run_id: str, cell_runs: dict[str, str], n: int) -> list[str]:
    """Log the lineage of the execution's n hardest questions as traces to the logger's tracking URI and
    experiment; `read(kind)` gives the execution's records of a kind. Returns the trace ids written."""
    from mlflow.tracing.client import TracingClient
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from tracking.analysis.lineage import CHAIN_KINDS, cell_chain

    outcomes = read("outcomes")
    if outcomes is None or outcomes.empty or n <= 0:
        return []
    done = logged_qids(logger.client, logger.experiment_id, execution)
    qids = [q for q in hardest_qids(outcomes, n) if q not in done]
    if not qids:
        return []
    records = {}
    for kind in CHAIN_KINDS:
        df = read(kind)
        records[kind] = df[df["qid"].isin(qids)] if df is not None else pd.DataFrame(
            columns=["qid", "retriever", "reader", "rank", "call_id", "round", "call_index", "sample_index",
                     "event_id"])
    by_q = questions.sort_values("created_at").drop_duplicates("qid", keep="last").set_index("qid", drop=False)
    tracer = TracerProvider(resource=Resource.create({"service.name": "ragledger"})).get_tracer("ragledger")
    tracing_client = TracingClient(logger.tracking_uri)
    written: list[str] = []
    for qid in qids:
        rows = outcomes[outcomes["qid"] == qid].sort_values(["cell", "created_at"]).drop_duplicates("cell", keep="last")
        chains = [cell_chain(o, records) for o in rows.itertuples()]
        first = min([pd.Timestamp(t) for t in rows["created_at"]])
        question = by_q.loc[qid] if qid in by_q.index else pd.Series({"qid": qid, "question": "", "answers": []})
        info, spans = build_trace(tracer, question, chains, int(first.value), logger.experiment_id, execution,
                                  parent_run_id)
        written.append(write_trace(tracing_client, info, spans))
    for run_id in {cell_runs[c] for c in outcomes["cell"].unique() if c in cell_runs}:
        for i in range(0, len(written), LINK_BATCH):
            logger.client.link_traces_to_run(written[i : i + LINK_BATCH], run_id)
    return written
