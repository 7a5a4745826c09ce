"""One execution logged to MLflow: a parent run and a nested run per cell, found again by their `ragledger.execution`
tag when an earlier attempt created them, so a retried logging completes them instead of adding new ones."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from core.cell import Cell
from tracking.mlflow.log import EXECUTION_TAG
from tracking.mlflow.views import ExecutionViews, portable_manifest, store_of

# the execution's manifest on its parent run, store paths made relative to the store (tracking/mlflow/pull.py)
MANIFEST_ARTIFACT = "ragledger/manifest.json"
# the run statistics an experiment's parent run carries as metrics (from the run summary in the manifest)
RUN_STATS = ("llm_calls", "cache_hits", "retries", "tasks_total", "tasks_from_cache", "wall_time_s", "questions_sampled")


def log_execution(tracking_uri: str, execution: str, record: dict[str, Any],
                  store_root: str | Path | None = None) -> dict[str, Any]:
    """Log one execution (its manifest `record`) to MLflow: a parent run and a nested run per cell, found by their
    `ragledger.execution` tag when a previous attempt created them. Returns {"parent", "cells", "experiment_id"}.

    Besides metrics and record segments, so that MLflow can stand in for the store (tracking/mlflow/pull.py): the
    parent run gets provenance tags, the portable manifest, the spec, the closed-book filter's generations and the
    call pack; each cell run its per-example outcome table and the questions as its dataset input."""
    from schemas.spec import ExperimentSpec
    from tracking.mlflow.log import MlflowLogger, check_reachable

    check_reachable(tracking_uri)  # a stopped server: pending in seconds, not after MLflow's retries
    spec_dict, summary = record["spec"], record["summary"]
    spec = ExperimentSpec.model_validate(spec_dict)
    logger = MlflowLogger(tracking_uri, spec.tracking.mlflow_experiment or spec.name)
    logger.close_abandoned_runs()
    found = {(r.data.tags.get("ragledger.level"), r.data.tags.get("ragledger.cell", "")): r
             for r in logger.runs_with_tag(EXECUTION_TAG, execution)}
    parent_run = found.get(("experiment", ""))
    cells: dict[str, str] = {}
    if parent_run is not None and parent_run.info.status == "FINISHED":  # ended last: the execution is complete
        cells = {cell: r.info.run_id for (level, cell), r in found.items() if level == "cell"}
        return {"parent": parent_run.info.run_id, "cells": cells, "experiment_id": logger.experiment_id}

    store = Path(store_root) if store_root is not None else store_of(record)
    views = ExecutionViews(spec, record, store)
    common_tags = {"ragledger.experiment": spec.name, "ragledger.spec_hash": summary["spec_hash"],
                   "ragledger.dataset": f"{spec.dataset.name}:{spec.dataset.path}",
                   "ragledger.flow_run_id": summary.get("flow_run_id") or "", EXECUTION_TAG: execution,
                   **views.provenance()}

    def run_for(run: Any, name: str, tags: dict[str, str], parent: str | None = None) -> str:
        if run is None:
            return logger.start_run(name, tags, parent_run_id=parent)
        logger.log(run.info.run_id, tags=logger.owner_tags())  # completed by this process now
        return run.info.run_id

    parent = run_for(parent_run, spec.name, {**common_tags, "ragledger.level": "experiment"})
    params = _log_parent(logger, views, parent, spec_dict, summary)
    for cell, metrics in summary["cells"].items():
        run = found.get(("cell", cell))
        if run is not None and run.info.status == "FINISHED":
            cells[cell] = run.info.run_id
            continue
        parts = Cell.parse(cell)
        retriever, reader, model = parts.retriever, parts.reader, parts.model
        run_id = run_for(run, cell, {**common_tags, "ragledger.level": "cell", "ragledger.cell": cell,
                                     "retriever": retriever, "reader": reader, "model": model}, parent)
        cell_params = {k: v for k, v in params.items() if not k.startswith(("retrievers", "readers"))}
        cell_params.update({"retriever": retriever, "reader": reader, "model": model})
        logger.log(run_id, params=cell_params, metrics={k: v for k, v in metrics.items() if isinstance(v, int | float)},
                   tags=views.provenance())
        _log_segments(logger, run_id, record.get("segments", {}).get(cell, {}))
        views.log_dataset(logger, run_id)
        views.log_outcomes(logger, run_id, cell)
        logger.end(run_id)
        cells[cell] = run_id
    _finish_parent(logger, views, parent, cells, execution)
    return {"parent": parent, "cells": cells, "experiment_id": logger.experiment_id}


def _log_parent(logger: Any, views: ExecutionViews, parent: str, spec_dict: dict, summary: dict) -> dict[str, str]:
    """The parent run's params (the spec flattened, credentials redacted), run statistics, provenance, spec and
    dataset input; returns the params, which its cell runs share."""
    from tracking.mlflow.log import flatten, safe_spec

    spec = views.spec
    params: dict[str, str] = {}
    shown = safe_spec(spec_dict)
    for key in ("dataset", "corpus", "model", "execution"):
        flatten(key, shown[key], params)
    params["retrievers"] = ",".join(spec.retrievers)
    params["readers"] = ",".join(e.key for e in spec.reader_entries())
    run_stats = {k: summary[k] for k in RUN_STATS if k in summary}
    if summary.get("closed_book_dropped") is not None:
        run_stats["closed_book_dropped"] = summary["closed_book_dropped"]
    logger.log(parent, params=params, metrics={**run_stats, "questions": summary["questions"]},
               tags=views.provenance())  # a run created before provenance existed gets it too
    logger.log_spec(parent, shown)
    views.log_dataset(logger, parent, context="experiment")
    return params


def _log_segments(logger: Any, run_id: str, segments: dict[str, list[str]]) -> None:
    """A run's record segments as artifacts, `records/<kind>/seg-*.parquet`; a compacted experiment's are written
    out of their packs for the upload (tracking/store/compaction.segment_files)."""
    from tracking.store.compaction import segment_files

    for kind, files in segments.items():
        with segment_files(files) as paths:
            logger.log_artifacts(run_id, paths, f"records/{kind}")


def _finish_parent(logger: Any, views: ExecutionViews, parent: str, cells: dict[str, str], execution: str) -> None:
    """The parent run's views once every cell run is logged (traces link to the cell runs), then its manifest and
    its end."""
    record, store = views.record, views.store_root
    logger.log_text(parent, json.dumps(record["summary"]["cells"], indent=2, default=str), "analysis/summary.json")
    logger.log_artifacts(parent, record.get("analysis_files") or [], "analysis")
    _log_segments(logger, parent, {"generations": record.get("closed_book_filter_segments") or []})
    views.log_callpack(logger, parent, execution)
    views.log_traces(logger, parent, cells, execution)
    # the manifest last: a pull takes an execution whose parent run is FINISHED and has it
    logger.log_text(parent, json.dumps(portable_manifest(record, store), indent=2, default=str), MANIFEST_ARTIFACT)
    logger.end(parent)


def already_logged(tracking_uri: str, execution: str, record: dict[str, Any]) -> bool:
    """A manifest without a marker is in MLflow when runs carry its execution tag, or (logged before the tag
    existed) when the parent run id it recorded is at that URI."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from schemas.spec import ExperimentSpec
    from tracking.mlflow.log import MlflowLogger, check_reachable

    check_reachable(tracking_uri)
    spec = ExperimentSpec.model_validate(record["spec"])
    name = spec.tracking.mlflow_experiment or spec.name
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return False
    parent = record.get("summary", {}).get("mlflow_parent_run_id")
    if parent:
        with contextlib.suppress(MlflowException):
            if client.get_run(parent).info.experiment_id == exp.experiment_id:
                return True
    return bool(MlflowLogger(tracking_uri, name).runs_with_tag(EXECUTION_TAG, execution))
