"""A fully cached rerun answered from the store, without Prefect, the model endpoint, the JVM or the embedding model.

The plan (flows/plan.py) names every evaluate task's key, and a segment is named by its events (EventStore.write),
whose ids hash the experiment, that key and the question: so the plan alone says where each cell's outcome segments
are. When every one exists and a run manifest lists exactly those segments, that run's summary is the answer: a
rerun through the flow would read every stage from the cache and compute the same cells from the same segments.
`ragledger run` asks here with the plan it then runs when there is no answer (flows/launch.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from core.paths import StoreLayout
from flows.plan import ExperimentPlan, plan, questions_segment_for
from schemas.spec import AnySpec, ExperimentSpec, parse_spec
from tracking.store.catalog import segment_exists
from tracking.store.events import event_id

# what a rerun served from the caches reports (it made no call and ran no task)
NOTHING_RAN = {"llm_calls": 0, "cache_hits": 0, "retries": 0, "prompt_tokens_sent": 0, "prompt_tokens_evaluated": None,
               "task_processes": 0, "mlflow_pending": None, "mlflow_synced": [], "flow_run_id": None,
               "root_flow_run_id": None}


def outcome_segments(the_plan: ExperimentPlan) -> dict[str, list[str]]:
    """Cell name -> the paths of its outcome segments, in shard order, as the evaluate tasks write them."""
    layout, name = StoreLayout.of(the_plan.store_root), the_plan.spec.name
    out: dict[str, list[str]] = {}
    for cell in the_plan.cells:
        out[cell.name] = [
            str(layout.segment("outcomes", name, [event_id("outcomes", name, ev.key, q) for q in ev.qids]))
            for ev in (the_plan.evaluates[(cell, s.id)] for s in the_plan.shards)
        ]
    return out


def matching_manifest(store_root: str, the_plan: ExperimentPlan, expected: dict[str, list[str]]) -> dict | None:
    """The newest run manifest of this spec whose cells are exactly the planned ones on the planned outcomes."""
    from tracking.store.ledger import Ledger

    planned = {cell: resolved(paths) for cell, paths in expected.items()}
    spec_hash = the_plan.spec.spec_hash()
    for path in reversed(Ledger(store_root).manifests(the_plan.spec.name)):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        segments = record.get("segments", {})
        if record.get("summary", {}).get("spec_hash") != spec_hash or set(segments) != set(planned):
            continue
        if all(resolved(segments[c].get("outcomes", [])) == paths for c, paths in planned.items()):
            return {**record, "manifest_path": str(path)}
    return None


def resolved(paths: list[str]) -> list[Path]:
    """Paths as the same files, however the store root was spelled (relative, absolute, through a link)."""
    return [Path(p).resolve() for p in paths]


def answered(the_plan: ExperimentPlan, started: float) -> dict[str, Any] | None:
    """The run summary of the planned run when every cell's outcome is already in the store, logged to the MLflow
    the run would log to; else None: then run the flow. The summary is the matching run's, with its manifest and
    MLflow runs, reporting that nothing ran (no task, no model call) in the seconds since `started`."""
    from tracking.mlflow.log import resolve_tracking_uri

    tasks = sum(the_plan.stage_totals().values())
    expected = outcome_segments(the_plan)
    if not all(segment_exists(p) for paths in expected.values() for p in paths):
        return None
    record = matching_manifest(the_plan.store_root, the_plan, expected)
    if record is None or record["summary"].get("tracking_uri") != resolve_tracking_uri(the_plan.spec.tracking.mlflow_uri):
        return None
    summary = {**record["summary"], **NOTHING_RAN, "answered_from": record["manifest_path"]}
    summary["tasks_from_cache"] = summary["tasks_total"] = tasks
    summary["stage_seconds"] = {}
    summary["wall_time_s"] = round(time.perf_counter() - started, 2)
    return summary


def cached_result(spec: dict[str, Any] | AnySpec, store: str | Path | None = None) -> dict[str, Any] | None:
    """The run summary of `spec` when every cell's outcome is already in the store (`store`, default the spec's
    tracking.store), else None (`answered`). Reads the dataset and, for a retriever with an index, the corpus (its
    hash enters the keys); starts nothing. None for a sweep and for a spec with the closed-book filter."""
    started = time.perf_counter()
    if isinstance(spec, dict):
        spec = parse_spec(spec)
    if not isinstance(spec, ExperimentSpec) or spec.dataset.closed_book_filter:  # a sweep, or the filter
        return None
    store_root = str(store or spec.tracking.store)
    questions = spec.dataset.sampled_questions()
    if not segment_exists(questions_segment_for(spec, questions, store_root)):
        return None  # a first run: decided before the plan reads the corpus for its hash
    return answered(plan(spec, questions, store_root=store_root), started)
