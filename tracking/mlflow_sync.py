"""MLflow as a projection of the store: an execution's MLflow runs are logged from its run manifest
(`<store>/runs/<experiment>/<execution>.json`, tracking/executions.py), exactly once, whenever MLflow takes them.

- Before logging, a pending marker `<store>/mlflow-pending/<experiment>/<execution>.json` is written; it is removed
  only once every run of the execution is logged and ended. A run whose MLflow is down (or that is killed while
  logging) keeps its marker, and `ragledger sync` or the next run that logs to that URI logs it.
- Every MLflow run of an execution carries the tag `ragledger.execution`; logging looks the runs up by it before
  creating any, so a retry after a partial log completes the runs it finds (a run already FINISHED is left as it is)
  instead of creating second ones.
- One process at a time logs an execution: an flock on `<execution>.lock` beside the marker. A process that finds it
  held skips that execution (its holder is logging it).
- `sync(..., everything=True)` logs every manifest in the store that has no runs at the URI: a lost or new MLflow
  database is rebuilt from the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragledger.cell import Cell
from ragledger.llm_types import model_identity
from ragledger.secrets import redact_url
from tracking.diskfull import write_text_atomically
from tracking.mlflow_log import EXECUTION_TAG

PENDING_DIR = "mlflow-pending"
# the run statistics an experiment's parent run carries as metrics (from the run summary in the manifest)
# the execution's manifest on its parent run, store paths made relative to the store (tracking/mlflow_pull.py)
MANIFEST_ARTIFACT = "ragledger/manifest.json"
RUN_STATS = ("llm_calls", "cache_hits", "retries", "tasks_total", "tasks_from_cache", "wall_time_s", "questions_sampled")


class MlflowLoggingPending(ConnectionError):
    """MLflow did not take an execution's logging; its events are stored and its marker says the logging is pending.
    A ConnectionError (an OSError): the machine's state, not a defect, for the CLI's error line (exit 2)."""


@dataclass
class SyncResult:
    logged: list[dict[str, Any]] = field(default_factory=list)  # {"experiment", "execution", "parent", "cells"}
    pending: list[dict[str, str]] = field(default_factory=list)  # {"experiment", "execution", "error"}
    skipped: list[str] = field(default_factory=list)  # executions another process was logging, or already logged


def marker_path(store_root: str | Path, experiment: str, execution: str) -> Path:
    return Path(store_root) / PENDING_DIR / experiment / f"{execution}.json"


def pending_markers(store_root: str | Path) -> list[Path]:
    base = Path(store_root) / PENDING_DIR
    return sorted(base.glob("*/*.json")) if base.is_dir() else []


@contextlib.contextmanager
def execution_lock(store_root: str | Path, experiment: str, execution: str, wait: bool) -> Iterator[bool]:
    """Hold the execution's logging lock (yields True), or yield False at once when another process holds it and
    `wait` is False. The lock file is removed by its holder once the marker is gone: a marker is never written again
    for an execution, so a process that then locks a stale or fresh lock file finds no marker and does nothing."""
    marker = marker_path(store_root, experiment, execution)
    marker.parent.mkdir(parents=True, exist_ok=True)
    lock = marker.with_suffix(".lock")
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            if not marker.exists():
                lock.unlink(missing_ok=True)
            fcntl.flock(fh, fcntl.LOCK_UN)


def _short(exc: BaseException) -> str:
    """A server that is down makes MLflow say so in a paragraph; its gist in a few words."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for needle, gist in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                         ("Max retries exceeded", "no answer after retries"), ("Name or service not known", "unknown host")):
        if needle in text:
            return gist
    return text[:200]


def pending_error(tracking_uri: str, store_root: str | Path, exc: BaseException, count: int = 1) -> MlflowLoggingPending:

    what = "the run's" if count == 1 else f"{count} executions'"
    return MlflowLoggingPending(
        f"MLflow at {redact_url(tracking_uri)} did not take the logging ({_short(exc)}): {what} events are stored in "
        f"{Path(store_root).resolve()} and the MLflow logging is pending; `ragledger sync` logs it once MLflow is back "
        "(the next run does too)")


def log_execution(tracking_uri: str, execution: str, record: dict[str, Any],
                  store_root: str | Path | None = None) -> dict[str, Any]:
    """Log one execution (its manifest `record`) to MLflow: a parent run and a nested run per cell, found by their
    `ragledger.execution` tag when a previous attempt created them. Returns {"parent", "cells", "experiment_id"}.

    Besides metrics and record segments, so that MLflow can stand in for the store (tracking/mlflow_pull.py): the
    parent run gets provenance tags, the portable manifest, the spec, the closed-book filter's generations and the
    call pack; each cell run its per-example outcome table and the questions as its dataset input."""
    from schemas.spec import ExperimentSpec
    from tracking.mlflow_log import MlflowLogger, check_reachable, flatten, safe_spec

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
        for kind, files in record.get("segments", {}).get(cell, {}).items():
            logger.log_artifacts(run_id, files, f"records/{kind}")
        views.log_dataset(logger, run_id)
        views.log_outcomes(logger, run_id, cell)
        logger.end(run_id)
        cells[cell] = run_id
    _finish_parent(logger, views, parent, cells, execution)
    return {"parent": parent, "cells": cells, "experiment_id": logger.experiment_id}


def _finish_parent(logger: Any, views: ExecutionViews, parent: str, cells: dict[str, str], execution: str) -> None:
    """The parent run's views once every cell run is logged (traces link to the cell runs), then its manifest and
    its end."""
    record, store = views.record, views.store_root
    logger.log_text(parent, json.dumps(record["summary"]["cells"], indent=2, default=str), "analysis/summary.json")
    logger.log_artifacts(parent, record.get("analysis_files") or [], "analysis")
    logger.log_artifacts(parent, record.get("closed_book_filter_segments") or [], "records/generations")
    views.log_callpack(logger, parent, execution)
    views.log_traces(logger, parent, cells, execution)
    # the manifest last: a pull takes an execution whose parent run is FINISHED and has it
    logger.log_text(parent, json.dumps(portable_manifest(record, store), indent=2, default=str), MANIFEST_ARTIFACT)
    logger.end(parent)


def _with_ids(record: dict[str, Any], logged: dict[str, Any]) -> dict[str, Any]:
    summary = {**record["summary"], "mlflow_parent_run_id": logged["parent"], "mlflow_cell_run_ids": logged["cells"],
               "mlflow_experiment_id": logged["experiment_id"]}
    return {**record, "summary": summary}


def publish(store_root: str | Path, manifest: Path, record: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """A finished execution: write its pending marker and its manifest, then log it to MLflow and clear the marker.
    Returns the record as written (with the MLflow run ids when logged); raises MlflowLoggingPending when MLflow
    did not take it (the marker stays)."""
    experiment, execution = record["summary"]["experiment"], manifest.stem
    marker = marker_path(store_root, experiment, execution)
    with execution_lock(store_root, experiment, execution, wait=True):
        # the marker before the manifest: a kill between the two leaves a marker without a manifest (dropped by
        # sync), never a manifest that nothing would log
        write_text_atomically(marker, json.dumps({"experiment": experiment, "execution": execution,
                                                  "manifest": str(manifest), "tracking_uri": tracking_uri}))
        write_text_atomically(manifest, json.dumps(record, indent=2, default=str))
        try:
            logged = log_execution(tracking_uri, execution, record, store_root)
        except Exception as exc:  # MLflow down, or refusing: the store has everything; logging is retried later
            raise pending_error(tracking_uri, store_root, exc) from None
        record = _with_ids(record, logged)
        write_text_atomically(manifest, json.dumps(record, indent=2, default=str))
        marker.unlink()
    return record


def sync(store_root: str | Path, tracking_uri: str | None = None, only_uri: str | None = None,
         everything: bool = False, log=None) -> SyncResult:
    """Log the store's pending executions to MLflow (to `tracking_uri`, else each marker's own URI; with `only_uri`,
    only the markers for that URI). `everything`: also every manifest whose execution has no runs at the URI."""
    result = SyncResult()
    work: list[tuple[str, str, Path, str | None]] = []  # (experiment, execution, manifest, marker's URI)
    for marker in pending_markers(store_root):
        try:
            data = json.loads(marker.read_text())
        except (OSError, ValueError):
            data = {}
        uri = data.get("tracking_uri")
        if only_uri is not None and uri != only_uri:
            continue
        manifest = Path(data.get("manifest") or Path(store_root) / "runs" / marker.parent.name / marker.name)
        work.append((marker.parent.name, marker.stem, manifest, uri))
    if everything:
        queued = {(e, x) for e, x, _, _ in work}
        runs = Path(store_root) / "runs"
        for manifest in sorted(runs.glob("*/*.json")) if runs.is_dir() else []:
            if (manifest.parent.name, manifest.stem) not in queued:
                work.append((manifest.parent.name, manifest.stem, manifest, None))
    for experiment, execution, manifest, marker_uri in work:
        _sync_one(store_root, experiment, execution, manifest, tracking_uri or marker_uri, result, log)
    return result


def _sync_one(store_root: str | Path, experiment: str, execution: str, manifest: Path, uri: str | None,
              result: SyncResult, log) -> None:
    marker = marker_path(store_root, experiment, execution)
    pending = marker.exists()
    with execution_lock(store_root, experiment, execution, wait=False) as held:
        if not held or (pending and not marker.exists()):  # being logged by another process, or just logged by one
            result.skipped.append(execution)
            return
        try:
            record = json.loads(manifest.read_text())
        except FileNotFoundError:
            if pending:  # killed between its marker and its manifest: that run never finished, nothing to log
                marker.unlink(missing_ok=True)
            return
        uri = uri or record.get("summary", {}).get("tracking_uri")
        if not uri:
            return
        try:
            if not pending and _already_logged(uri, execution, record):
                result.skipped.append(execution)
                return
            logged = log_execution(uri, execution, record, store_root)
        except Exception as exc:  # MLflow still down (or refusing): the marker stays for the next attempt
            result.pending.append({"experiment": experiment, "execution": execution, "tracking_uri": uri,
                                   "error": _short(exc)})
            return
        if pending:  # the manifest records where its pending logging went; a rebuild elsewhere leaves it as it is
            updated = _with_ids(record, logged)
            updated["summary"]["tracking_uri"] = uri
            write_text_atomically(manifest, json.dumps(updated, indent=2, default=str))
            marker.unlink()
        entry = {"experiment": experiment, "execution": execution, "tracking_uri": uri, **logged}
        result.logged.append(entry)
        if log is not None:
            log(entry)


def _already_logged(tracking_uri: str, execution: str, record: dict[str, Any]) -> bool:
    """A manifest without a marker is in MLflow when runs carry its execution tag, or (logged before the tag
    existed) when the parent run id it recorded is at that URI."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from schemas.spec import ExperimentSpec
    from tracking.mlflow_log import MlflowLogger, check_reachable

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



# ---- what makes MLflow the system of record: provenance, portable manifest, call pack, per-example views ----------

def store_of(record: dict[str, Any]) -> Path | None:
    """The store an execution was run on, from its manifest path (<store>/runs/<experiment>/<execution>.json)."""
    manifest = record.get("summary", {}).get("manifest")
    return Path(manifest).parents[2] if manifest else None


def store_relative(path: str | Path, store_root: Path | None) -> str:
    """A segment's path inside its store (<kind>/<experiment>/seg-*.parquet), whatever the store's location."""
    p = Path(path)
    if store_root is not None:
        try:
            return p.resolve().relative_to(store_root.resolve()).as_posix()
        except ValueError:
            pass
    return Path(*p.parts[-3:]).as_posix()


def portable_manifest(record: dict[str, Any], store_root: Path | None) -> dict[str, Any]:
    """The manifest as another machine can use it: segment paths relative to the store; no local file lists."""
    out = json.loads(json.dumps(record, default=str))
    out["segments"] = {cell: {kind: [store_relative(f, store_root) for f in files if f] for kind, files in kinds.items()}
                       for cell, kinds in record.get("segments", {}).items()}
    out["closed_book_filter_segments"] = [store_relative(f, store_root)
                                          for f in record.get("closed_book_filter_segments") or [] if f]
    out["analysis_files"] = []
    for key in ("manifest", "tracking_uri", "mlflow_parent_run_id", "mlflow_cell_run_ids", "mlflow_experiment_id"):
        out["summary"].pop(key, None)  # where it was logged and stored: set by whoever reads it back
    out["portable"] = 1
    return out


class ExecutionViews:
    """Provenance tags and MLflow-native views of one execution, read from its store (each read at most once).

    What they are made of is read best-effort: a store that lacks a segment or a call cache (a manifest synced from
    elsewhere), or a defect here, leaves that view out (logged as a warning in the run log) rather than keeping the
    execution's MLflow logging pending forever. The MLflow calls themselves raise as the rest of the logging does."""

    def __init__(self, spec: Any, record: dict[str, Any], store_root: Path | None):
        self.spec, self.record, self.store_root = spec, record, store_root
        self._provenance: dict[str, str] | None = None
        self._questions: Any = None
        self._dataset: Any = None

    def _segments(self, kind: str, cell: str | None = None) -> list[Path]:
        cells = [cell] if cell else list(self.record.get("segments", {}))
        found = {Path(f) for c in cells for f in self.record.get("segments", {}).get(c, {}).get(kind, []) if f}
        return sorted(p for p in found if p.exists())

    def _prepared(self, what: str, make: Callable[[], Any]) -> Any:
        try:
            return make()
        except Exception as exc:  # a view left out, not the execution's logging
            logging.getLogger(__name__).warning("MLflow %s of %s left out: %s: %s", what, self.spec.name,
                                                type(exc).__name__, exc)
            return None

    def questions(self):
        if self._questions is None:
            from tracking.events import EventStore

            def read():
                paths = self._segments("questions")
                return EventStore(self.store_root or ".").read("questions", paths=paths) if paths else None

            self._questions = self._prepared("questions", read)
        return self._questions

    def provenance(self) -> dict[str, str]:
        """ragledger version, schema version, code commit, spec hash, model identity, dataset and corpus hashes. No
        secrets: URLs are redacted (a URL with credentials is refused before a run starts), keys named by env var."""
        if self._provenance is None:
            import ragledger
            from schemas.records import SCHEMA_VERSION
            from tracking.mlflow_log import git_provenance, questions_digest

            spec = self.spec
            tags = {"ragledger.version": ragledger.__version__, "ragledger.schema_version": str(SCHEMA_VERSION),
                    "ragledger.spec_hash": self.record["summary"]["spec_hash"], "ragledger.model": spec.model.display_name,
                    "ragledger.sampling": json.dumps({"temperature": spec.model.temperature, "top_p": spec.model.top_p,
                                                      "max_tokens": spec.model.max_tokens, "seed": spec.model.seed})}
            identity = self._prepared("model identity", lambda: model_identity(spec.model))
            if identity:
                tags["ragledger.model_identity"] = identity
            q = self.questions()
            digest = self._prepared("dataset hash", lambda: questions_digest(q)) if q is not None and len(q) else None
            if digest:
                tags["ragledger.dataset_hash"] = digest
            corpus = self.record.get("corpus_hash")  # the run's plan (manifests written before it have none)
            if corpus:
                tags["ragledger.corpus_hash"] = corpus
            tags.update(self._prepared("git provenance", git_provenance) or {})
            self._provenance = tags
        return self._provenance

    def log_dataset(self, logger: Any, run_id: str, context: str = "eval") -> None:
        """The questions as the run's dataset input: the runs table's Dataset column (name, digest)."""
        from tracking.mlflow_log import log_dataset_input, questions_dataset

        if self._dataset is None:
            q, ds = self.questions(), self.spec.dataset
            if q is None or q.empty:
                return
            name = f"{ds.name}:{Path(ds.path).name if ds.path else 'default'}"
            self._dataset = self._prepared("dataset input", lambda: questions_dataset(q, name, str(ds.path or ds.name)))
        if self._dataset is not None:
            log_dataset_input(logger, run_id, self._dataset, context)

    def log_outcomes(self, logger: Any, run_id: str, cell: str) -> None:
        """The cell's per-example outcomes as an MLflow table (question, gold, prediction, EM, F1, error type)."""
        from tracking.events import EventStore
        from tracking.mlflow_log import log_table, outcomes_table

        paths, q = self._segments("outcomes", cell), self.questions()
        if not paths or q is None:
            return
        table = self._prepared(f"outcome table of {cell}", lambda: outcomes_table(
            EventStore(self.store_root or ".").read("outcomes", paths=paths), q))
        if table is not None:
            log_table(logger, run_id, table, "outcomes_table.json")

    def log_traces(self, logger: Any, parent: str, cells: dict[str, str], execution: str) -> None:
        """The lineage of a bounded sample of questions (the hardest) as MLflow traces (tracking/mlflow_traces.py).
        Best-effort as a whole, MLflow calls included: traces are a view, never a reason to keep logging pending."""
        from tracking import mlflow_traces

        def log() -> list[str]:
            n, q = mlflow_traces.sample_size(), self.questions()
            if n <= 0 or q is None or q.empty:
                return []
            return mlflow_traces.log_traces(logger, execution, self._records, q, parent, cells, n)

        self._prepared("traces", log)

    def _records(self, kind: str):
        """The execution's records of one kind (every cell), or None when the store lacks them."""
        from tracking.events import EventStore

        paths = self._segments(kind)
        return EventStore(self.store_root or ".").read(kind, paths=paths) if paths else None

    def log_callpack(self, logger: Any, run_id: str, execution: str) -> None:
        """The execution's LLM calls, from the store's call cache, as one artifact (tracking/callpack.py). Calls made
        by retrievers that call the model (compression, parametric) are not in it: their records carry no call id."""
        import tempfile

        from tracking import callpack

        cache_file = callpack.cache_path(self.store_root) if self.store_root is not None else None
        if cache_file is None or not cache_file.exists():
            return
        data = self._prepared("call pack", lambda: self._callpack(cache_file, execution))
        if data is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(callpack.ARTIFACT).name
            path.write_bytes(data)
            logger.log_artifacts(run_id, [path], str(Path(callpack.ARTIFACT).parent))

    def _callpack(self, cache_file: Path, execution: str) -> bytes | None:
        from tracking import callpack
        from tracking.llm_cache import LLMCallCache

        segs = self._segments("generations") + [Path(f) for f in self.record.get("closed_book_filter_segments") or []]
        calls = callpack.calls_of_segments(segs)
        if not calls:
            return None
        cache = LLMCallCache(cache_file)
        try:
            data, _ = callpack.build(cache, calls, {"experiment": self.spec.name, "execution": execution,
                                                    "model_identity": self.provenance().get("ragledger.model_identity")})
        finally:
            cache.close()
        return data
