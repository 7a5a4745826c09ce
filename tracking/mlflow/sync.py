"""MLflow as a projection of the store: an execution's MLflow runs are logged from its run manifest
(`<store>/runs/<experiment>/<execution>.json`, tracking/store/ledger.py), exactly once, whenever MLflow takes them.

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
- An execution whose recording is queued (ragledger/recorder.py) is left to its recorder by the loggings a run or
  another recording makes on the side (`leave=recordings_queued()`): the recorder notes the flow run and the recall
  curve on the manifest before it logs, and an execution logged already is not noted again. `ragledger sync` logs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.diskfull import write_text_atomically
from core.paths import cache_home
from core.secrets import redact_url
from tracking.mlflow.runs import already_logged, log_execution

PENDING_DIR = "mlflow-pending"
RECORDINGS = "recordings"  # the recorders' queue under the cache home (ragledger/recorder.py): <time_ns>-<pid>.json


def queued_recordings() -> list[tuple[Path, dict[str, Any] | None]]:
    """The recorders' queue (ragledger/recorder.py), oldest first: each recording's file and its job (None when
    unreadable). <time_ns>-<pid>.json: not a recording still being written (core/atomic.py, `.tmp-...`)."""
    queue = cache_home() / RECORDINGS
    out: list[tuple[Path, dict[str, Any] | None]] = []
    for path in sorted(queue.glob("[0-9]*-[0-9]*.json"), key=lambda p: int(p.stem.split("-")[0])):
        try:
            job = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            job = None
        out.append((path, job if isinstance(job, dict) else None))
    return out


def recordings_queued() -> set[str]:
    """The executions (their manifests' names) whose recording is queued for a recorder."""
    return {Path(job["manifest"]).stem for _, job in queued_recordings()
            if job is not None and isinstance(job.get("manifest"), str)}


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


def logged_now(store_root: str | Path, experiment: str, execution: str, wait_s: float = 300.0,
               say: Callable[[str], None] | None = None) -> None:
    """An execution's MLflow logging done, for what needs its runs (an analysis logged on its parent run): a
    recording queued for it is waited for (up to `wait_s`: a recorder waits while runs work), else it is logged
    here. Raises MlflowLoggingPending when MLflow does not take it."""
    marker = marker_path(store_root, experiment, execution)
    if marker.exists() and execution in recordings_queued():
        if say is not None:
            say(f"waiting for the run's recorder to log {experiment} execution {execution} to MLflow "
                "(ragledger/recorder.py; seconds once no run works)")
        deadline = time.monotonic() + wait_s
        while marker.exists() and time.monotonic() < deadline:
            time.sleep(0.25)
    if not marker.exists():
        return
    with execution_lock(store_root, experiment, execution, wait=True):  # a recorder logging it finishes first
        pass
    result = sync(store_root, leave={m.stem for m in pending_markers(store_root)} - {execution})
    if result.pending:
        first = result.pending[0]
        raise pending_error(first["tracking_uri"], store_root, ConnectionError(first["error"]))


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
        _write_pending(marker, manifest, record, tracking_uri)
        try:
            logged = log_execution(tracking_uri, execution, record, store_root)
        except Exception as exc:  # MLflow down, or refusing: the store has everything; logging is retried later
            raise pending_error(tracking_uri, store_root, exc) from None
        record = _with_ids(record, logged)
        write_text_atomically(manifest, json.dumps(record, indent=2, default=str))
        marker.unlink()
    return record


def leave_pending(store_root: str | Path, manifest: Path, record: dict[str, Any], tracking_uri: str) -> None:
    """A finished execution whose logging is left to `sync` (another process's, ragledger/recorder.py): its pending
    marker and its manifest written, nothing logged."""
    experiment, execution = record["summary"]["experiment"], manifest.stem
    with execution_lock(store_root, experiment, execution, wait=True):
        _write_pending(marker_path(store_root, experiment, execution), manifest, record, tracking_uri)


def note_recording(store_root: str | Path, manifest: Path, flow_run_ids: tuple[str | None, str | None],
                   analysis_files: list[str]) -> None:
    """What the recorder of a pending execution made (ragledger/recorder.py) noted on its manifest, so its MLflow
    runs carry it: the Prefect flow run, and analysis files (the recall curve). An execution logged already is left
    as it is."""
    experiment, execution = json.loads(manifest.read_text())["summary"]["experiment"], manifest.stem
    with execution_lock(store_root, experiment, execution, wait=True):
        if not marker_path(store_root, experiment, execution).exists():
            return
        record = json.loads(manifest.read_text())
        record["summary"]["flow_run_id"], record["summary"]["root_flow_run_id"] = flow_run_ids
        record["analysis_files"] = list(dict.fromkeys(analysis_files + record.get("analysis_files", [])))
        write_text_atomically(manifest, json.dumps(record, indent=2, default=str))


def _write_pending(marker: Path, manifest: Path, record: dict[str, Any], tracking_uri: str) -> None:
    # the marker before the manifest: a kill between the two leaves a marker without a manifest (dropped by sync),
    # never a manifest that nothing would log
    summary = record["summary"]
    write_text_atomically(marker, json.dumps({"experiment": summary["experiment"], "execution": manifest.stem,
                                              "manifest": str(manifest), "tracking_uri": tracking_uri}))
    write_text_atomically(manifest, json.dumps(record, indent=2, default=str))


def sync(store_root: str | Path, tracking_uri: str | None = None, only_uri: str | None = None,
         everything: bool = False, log=None, leave: Collection[str] = ()) -> SyncResult:
    """Log the store's pending executions to MLflow (to `tracking_uri`, else each marker's own URI; with `only_uri`,
    only the markers for that URI), except the executions named in `leave`. `everything`: also every manifest whose
    execution has no runs at the URI."""
    result = SyncResult()
    work: list[tuple[str, str, Path, str | None]] = []  # (experiment, execution, manifest, marker's URI)
    for marker in pending_markers(store_root):
        if marker.stem in leave:
            continue
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
            if not pending and already_logged(uri, execution, record):
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
