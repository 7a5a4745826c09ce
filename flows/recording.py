"""What a run leaves once its stages are done: metrics per cell (projections of its segments), and the run manifest
logged to MLflow exactly once (tracking/mlflow/sync.py), by the flow's logging task (flows/execute.py) or, for a run
without Prefect's flow, by the process that records it afterwards (ragledger/recorder.py). Nothing here imports Prefect."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import Any

from core.paths import StoreLayout
from flows.executor import Executed, PlanExecution
from flows.run_summary import Accounting, RunSummary, StageClock
from tasks.stages import RunContext
from tracking.analysis.metrics import METRICS_VERSION, cached_cell_metrics, cell_metrics
from tracking.analysis.readers_table import readers_table
from tracking.mlflow.log import safe_spec
from tracking.report.readers_table import write_readers_table
from tracking.store.compaction import compact_experiment
from tracking.store.events import EventStore, stable_hash

# what writes an execution's manifest and logs it (or leaves it pending): (store root, manifest, record, tracking
# URI) -> {"pending": a reason or None, "synced": executions logged besides, and when logged "parent", "cells",
# "experiment_id"}
Logger = Callable[[str, str, dict[str, Any], str], dict[str, Any]]


def cell_summaries(done: Executed) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, list[str]]]]:
    """Metrics per cell (a projection of its segments) and the segments the manifest lists per cell."""
    p = done.plan
    store = EventStore(p.store_root)
    questions_df = store.read("questions", paths=[p.questions_segment])
    metrics_dir = StoreLayout.of(p.store_root).metrics_projection
    cells, segments = {}, {}
    for cell in p.cells:
        segs = done.execution.cell_segments(cell)
        segments[cell.name] = {**segs, "questions": [p.questions_segment]}
        key = stable_hash(METRICS_VERSION, segs["outcomes"], segs["retrievals"], segs["generations"], p.questions_segment)
        cells[cell.name] = cached_cell_metrics(
            metrics_dir, key,
            partial(compute_cell_metrics, store, segs, questions_df))
    return cells, segments


def compute_cell_metrics(store: EventStore, segs: dict[str, list[str]], questions_df) -> dict[str, Any]:
    return cell_metrics(store.read("outcomes", paths=segs["outcomes"]), store.read("retrievals", paths=segs["retrievals"]),
                        questions_df, store.read("generations", paths=segs["generations"]))


def recall_curve_files(execution: PlanExecution) -> list[str]:
    """The run's recall curve files: drawn meanwhile, or now; none when the execution leaves them to its recorder
    (flows/direct.py: matplotlib's import alone is most of a second)."""
    if not execution.draws_recall_curve:
        return []
    return execution.recall_curve.result() if execution.recall_curve else execution.recall_curve_files()


def record_run(done: Executed, run: RunContext, accounting: Accounting, clock: StageClock, tracking_uri: str,
               log: Logger, flow_run_ids: tuple[str | None, str | None] = (None, None), compact: bool = True) -> RunSummary:
    """The run's summary: metrics per cell, the recall curve and readers table, the run manifest written and logged
    to MLflow by `log`, then the store compacted when the spec asks (`compact` False: by the run's recorder,
    flows/direct.py). `flow_run_ids`: the Prefect flow run's and its root's, when it runs in one."""
    clock.restart()  # metrics per cell, from the stored records of this run: closing the endpoint is not a stage
    p, spec, store_root = done.plan, run.spec, run.store_root
    summary = RunSummary(spec.name, spec.spec_hash(), len(p.qids), p.questions_sampled,
                         None if p.closed_book_dropped is None else len(p.closed_book_dropped))
    summary.flow_run_id, summary.root_flow_run_id = flow_run_ids
    summary.cells, cell_segments = cell_summaries(done)
    accounting.fill(summary)
    summary.prompt_tokens_evaluated = done.prompt_tokens_evaluated
    summary.tracking_uri = tracking_uri
    summary.wall_time_s = clock.total()
    execution = done.execution
    analysis_files = recall_curve_files(execution)
    layout = StoreLayout.of(store_root)
    analysis_files += write_readers_table(readers_table(summary.cells),
                                          layout.readers_table_dir(spec.name, stable_hash(summary.cells, length=12)),
                                          f"{spec.name} — {summary.questions} questions")
    clock.lap("metrics")
    summary.stage_seconds = clock.seconds
    # the execution id names the manifest and tags its MLflow runs (written aside and renamed: a full disk or a kill
    # never leaves half a manifest, which latest_execution would refuse)
    manifest = layout.manifest(spec.name, time.strftime("%Y%m%dT%H%M%S"), run.run_token)
    summary.manifest = str(manifest)
    record = {"summary": asdict(summary), "segments": cell_segments, "closed_book_filter_segments": done.filter_segments,
              "spec": safe_spec(spec.model_dump()), "analysis_files": analysis_files, "corpus_hash": p.corpus_hash}
    logged = log(store_root, str(manifest), record, summary.tracking_uri)
    clock.lap("mlflow")
    summary.mlflow_pending, summary.mlflow_synced = logged["pending"], logged["synced"]
    if not logged["pending"]:
        summary.mlflow_parent_run_id = logged["parent"]
        summary.mlflow_cell_run_ids = logged["cells"]
        summary.mlflow_experiment_id = logged["experiment_id"]
    if compact and spec.tracking.compact:  # the execution is complete: its segments become one pack per kind
        compact_experiment(EventStore(store_root), spec.name)
        clock.lap("compact")
    return summary
