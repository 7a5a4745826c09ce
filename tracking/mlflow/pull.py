"""Pull: rebuild an experiment's event store from its MLflow runs, so MLflow is the team's system of record and the
local store a cache of it.

An execution logged by tracking/mlflow/runs.py log_execution has, on its FINISHED parent run, the portable manifest
(`ragledger/manifest.json`), the spec (`spec.yaml`), the closed-book filter's generations and the call pack
(`callpack/calls.jsonl.gz`); its cell runs hold the record segments (`records/<kind>/seg-*.parquet`). Pulling one:

- every artifact is downloaded into `<store>/.pull/<experiment>/<execution>/` and checked there (a segment's
  checksum, record kind, schema, experiment and content-addressed name; the spec against the run's spec hash; the
  call pack's checksum) before it is kept; a bad or missing artifact stops the pull with one line naming the run
  and the artifact, and nothing of that execution enters the store;
- checked files stay staged, so an interrupted pull resumes where it stopped (it downloads only what is missing);
- once every execution is staged, records of another schema version than the ones already there are refused (the
  versions and runs named); then each execution's segments are renamed into the store, its call pack imported
  into the store's call cache, and its manifest written last (so `ensure_local` and the analyses see a whole one);
- an execution whose manifest is already in the store is not downloaded again: a second pull says nothing is new.

Runs logged before the manifest artifact existed are pulled too: the manifest is rebuilt from the cell runs'
record artifacts, `spec.yaml` and `analysis/summary.json`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.paths import StoreLayout
from core.secrets import redact_url
from tracking.mlflow.log import EXECUTION_TAG
from tracking.mlflow.runs import MANIFEST_ARTIFACT, RUN_STATS
from tracking.store import callpack
from tracking.store.catalog import segment_exists

PULL_DIR = StoreLayout.PULLS
SPEC_ARTIFACT = "spec.yaml"
SUMMARY_ARTIFACT = "analysis/summary.json"
STAGED_PACK = "calls.jsonl.gz"


class PullError(Exception):
    """A pull that cannot complete; one line naming the run, artifact or field. Nothing half-written is kept."""


@dataclass
class PullResult:
    experiment: str
    store: Path
    tracking_uri: str
    pulled: list[str] = field(default_factory=list)  # executions brought into the store by this pull
    present: list[str] = field(default_factory=list)  # executions the store had already
    downloaded: int = 0  # artifacts downloaded by this pull
    reused: int = 0  # segments already in the store or staged by an interrupted pull
    calls_added: int = 0  # call-pack entries new to the store's call cache
    calls_present: int = 0

    @property
    def nothing_new(self) -> bool:
        return not self.pulled


@dataclass
class _Execution:
    name: str
    parent: Any  # mlflow Run
    cells: dict[str, Any]  # cell name -> Run
    stage: Path
    manifest: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    # (kind, segment file name) -> (run id, artifact path); the store's copy or a staged one counts as present
    segments: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    pack: tuple[str, str] | None = None  # (run id, artifact path) of the call pack


def ensure_local(experiment: str, store: str | Path, mlflow_uri: str | None = None,
                 log: Callable[[str], None] | None = None) -> PullResult | None:
    """Pull `experiment` from MLflow (`mlflow_uri`, else MLFLOW_TRACKING_URI) only when the local store lacks it (no
    run manifest and no outcome segment). Returns the pull's result, or None when nothing was pulled (the store has
    the experiment, or no MLflow URI is given: the command then reports a missing experiment as it always did)."""
    from tracking.store.ledger import Ledger

    ledger = Ledger(store)
    if ledger.manifests(experiment) or ledger.store.segments("outcomes", experiment):
        return None
    uri = mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return None
    return pull(experiment, store, uri, log=log)


def pull(experiment: str, store_root: str | Path, tracking_uri: str,
         log: Callable[[str], None] | None = None) -> PullResult:
    """Rebuild `experiment`'s executions in the store at `store_root` from the MLflow at `tracking_uri`."""
    from mlflow.exceptions import MlflowException

    from core.secrets import CredentialsInURL, refuse_credentials
    from tracking.mlflow.sync import _short

    say = log or (lambda _line: None)
    try:
        refuse_credentials(tracking_uri, "MLflow URI", "put them in MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD")
    except CredentialsInURL as exc:
        raise PullError(str(exc)) from None
    store = Path(store_root).resolve()
    result = PullResult(experiment, store, tracking_uri)
    shown = redact_url(tracking_uri)
    try:
        with _pull_lock(store, experiment):
            _pull(experiment, store, tracking_uri, result, say)
    except PullError:
        raise
    except MlflowException as exc:
        raise PullError(f"MLflow at {shown}: {_short(exc)}") from None
    except (ConnectionError, TimeoutError) as exc:  # requests' and urllib's are OSErrors too, caught below
        raise PullError(f"MLflow at {shown}: {_short(exc)}") from None
    except OSError as exc:
        raise PullError(f"pulling {experiment!r} from {shown}: {exc}") from None
    return result


@contextlib.contextmanager
def _pull_lock(store: Path, experiment: str) -> Iterator[None]:
    """One pull of an experiment into a store at a time: a second waits, then finds the executions present. When
    the pull ends its lock file goes, and so do the `.pull` folder and the store folder (and its parents) if this
    pull made them and they are left empty: a failed pull leaves nothing behind but the checked downloads a second
    pull resumes from."""
    base = store / PULL_DIR
    made = []  # the folders still to be made, deepest first
    folder = base
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    try:
        with _locked(base / f"{experiment}.lock"):
            yield
    finally:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:  # not empty (another pull's lock, staged files, the pulled records), or gone
                break


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock on `path`, whose holder removes the file when done. A waiter that then holds the lock of
    the removed file opens `path` again (a new file, or one a third pull made meanwhile) and waits on that, so no two
    pulls ever hold the lock at once."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fh = open(path, "a")  # noqa: SIM115  (closed by the `with` below)
        except FileNotFoundError:  # the folder removed by a pull that just ended: make it again
            continue
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if _same_file(fh.fileno(), path):
                try:
                    yield
                finally:
                    path.unlink(missing_ok=True)  # while still locked: a waiter finds it gone and locks a new one
                return


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _client(tracking_uri: str):
    from mlflow import MlflowClient

    from tracking.mlflow.log import HTTP_RETRY_DEFAULTS, MlflowCredentialsError, check_credentials, check_reachable

    for name, value in HTTP_RETRY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # a progress bar per downloaded file would bury the pull's own lines (and its one error line)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # artifacts come through the server, byte for byte: a server whose artifacts are on S3 would otherwise hand out
    # presigned URLs, and an object MLflow stored with Content-Encoding: gzip (its guess for `calls.jsonl.gz`) comes
    # back decompressed into a file of the compressed size (MLflow's ranged download through requests); this way a
    # machine also needs no route to the bucket (tests/test_mlflow_s3_artifacts.py)
    os.environ.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD", "false")
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        if not db.is_file():  # MLflow would create an empty database there and find nothing
            raise PullError(f"MLflow URI {tracking_uri}: no such database file {db}")
    try:
        check_reachable(tracking_uri)
    except ConnectionError as exc:
        raise PullError(f"MLflow at {redact_url(tracking_uri)}: {exc}") from None
    try:
        check_credentials(tracking_uri)
    except MlflowCredentialsError as exc:
        raise PullError(str(exc)) from None
    return MlflowClient(tracking_uri=tracking_uri)


def _pull(experiment: str, store: Path, tracking_uri: str, result: PullResult, say: Callable[[str], None]) -> None:

    client = _client(tracking_uri)
    parents = _parent_runs(client, experiment, redact_url(tracking_uri))
    _check_run_schema_versions(parents)
    todo: list[_Execution] = []
    for parent in parents:
        name = parent.data.tags.get(EXECUTION_TAG) or _untagged_name(parent)
        if _complete_locally(store / "runs" / experiment / f"{name}.json"):
            result.present.append(name)
            continue
        todo.append(_Execution(name, parent, _cell_runs(client, parent), store / PULL_DIR / experiment / name))
    if not todo:
        say(f"nothing new: the {len(result.present)} execution(s) of {experiment} in MLflow are in {store} already")
        return
    for ex in todo:  # download and check everything first: nothing enters the store unless all of it is sound
        _plan(client, ex, experiment)
        _stage(client, ex, experiment, store, result, say)
    _check_schema_versions(todo, store, experiment)
    for ex in todo:
        _move_in(ex, store, experiment, tracking_uri, result)
        result.pulled.append(ex.name)
        say(f"{ex.name}: {len(ex.segments)} segment(s), {len(ex.cells)} cell(s) in {store}")
    with contextlib.suppress(OSError):
        (store / PULL_DIR / experiment).rmdir()  # empty once every execution moved in


def _untagged_name(parent: Any) -> str:
    """An execution logged before runs carried their execution id: named as the flow names manifests (start time
    first, so `latest_execution` orders it among the others) after its parent run."""
    import time

    started = time.strftime("%Y%m%dT%H%M%S", time.gmtime((parent.info.start_time or 0) / 1000))
    return f"{started}-mlflow-{parent.info.run_id[:8]}"


def _complete_locally(manifest: Path) -> bool:
    """The store has the execution: its manifest, and every segment the manifest lists (one deleted since, or
    never there, makes the execution pulled again; only what is missing is downloaded)."""
    if not manifest.is_file():
        return False
    try:
        record = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    files = [f for kinds in record.get("segments", {}).values() for fs in kinds.values() for f in fs]
    files += record.get("closed_book_filter_segments") or []
    return all(segment_exists(f) for f in files if f)  # as files, or compacted into packs


def _parent_runs(client: Any, experiment: str, shown_uri: str | None) -> list[Any]:
    """The experiment's finished parent runs, oldest first: in the MLflow experiment of its name, else in any."""
    wanted = f"tags.\"ragledger.level\" = 'experiment' and tags.\"ragledger.experiment\" = '{_quote(experiment)}'"
    exp = client.get_experiment_by_name(experiment)
    runs = _search(client, [exp.experiment_id], wanted) if exp is not None else []
    if not runs:  # logged under tracking.mlflow_experiment, another name
        ids = [e.experiment_id for e in client.search_experiments(max_results=50000)]
        runs = _search(client, ids, wanted) if ids else []
    if not runs:
        raise PullError(f"MLflow at {shown_uri} has no run of experiment {experiment!r}")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    if not finished:
        states = ", ".join(sorted({r.info.status for r in runs}))
        raise PullError(f"MLflow at {shown_uri}: no finished run of experiment {experiment!r} ({len(runs)} run(s): "
                        f"{states}; a run still logging or killed is pulled once `ragledger sync` has ended it)")
    return sorted(finished, key=lambda r: (r.info.start_time or 0, r.info.run_id))


def _search(client: Any, experiment_ids: list[str], filter_string: str) -> list[Any]:
    runs: list[Any] = []
    token = None
    while True:
        page = client.search_runs(experiment_ids, filter_string=filter_string, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _cell_runs(client: Any, parent: Any) -> dict[str, Any]:
    runs = _search(client, [parent.info.experiment_id],
                   f"tags.\"mlflow.parentRunId\" = '{_quote(parent.info.run_id)}'")
    cells = {r.data.tags.get("ragledger.cell") or r.info.run_name: r for r in runs
             if r.data.tags.get("ragledger.level") == "cell"}
    for cell, run in cells.items():
        if run.info.status != "FINISHED":
            raise PullError(f"run {run.info.run_id} (cell {cell!r} of parent run {parent.info.run_id}) is "
                            f"{run.info.status}, not FINISHED")
    return cells


def _check_run_schema_versions(parents: list[Any]) -> None:
    """Refuse, before downloading anything, runs that say their records have different schema versions."""
    from schemas.records import SCHEMA_VERSION

    by_version: dict[str, list[str]] = {}
    for run in parents:
        version = run.data.tags.get("ragledger.schema_version")
        if version:
            by_version.setdefault(version, []).append(run.info.run_id)
    _refuse_mixed({v: [f"run {r}" for r in runs] for v, runs in by_version.items()})
    newer = [v for v in by_version if v.isdigit() and int(v) > SCHEMA_VERSION]
    if newer:
        raise PullError(f"run {by_version[newer[0]][0]} holds records of schema version {newer[0]}; this ragledger "
                        f"reads schema version {SCHEMA_VERSION} (upgrade ragledger to pull it)")


def _refuse_mixed(where: dict[str, list[str]]) -> None:
    if len(where) > 1:
        parts = "; ".join(f"schema version {v}: {', '.join(sorted(w)[:3])}{' ...' if len(w) > 3 else ''}"
                          for v, w in sorted(where.items()))
        raise PullError(f"refusing to mix records of different schema versions ({parts})")


def _artifact_files(client: Any, run_id: str, path: str | None) -> list[str]:
    return [f.path for f in client.list_artifacts(run_id, path) if not f.is_dir]


def _download(client: Any, run_id: str, artifact: str, into: Path, what: str) -> Path:
    """One artifact into a fresh directory `into`; a missing one is a PullError naming the run and path."""
    from mlflow.exceptions import MlflowException

    into.mkdir(parents=True, exist_ok=True)
    try:
        local = Path(client.download_artifacts(run_id, artifact, dst_path=str(into)))
    except (MlflowException, OSError) as exc:
        raise PullError(f"run {run_id} ({what}): artifact {artifact} could not be downloaded: "
                        f"{' '.join(str(exc).split())[:200]}") from None
    if not local.is_file():
        raise PullError(f"run {run_id} ({what}): artifact {artifact} is missing")
    return local


def _plan(client: Any, ex: _Execution, experiment: str) -> None:
    """What the execution consists of: the manifest (or one rebuilt from the runs), the spec, every segment and the
    call pack, each with the run and artifact path it comes from."""
    import yaml

    from schemas.spec import ExperimentSpec

    parent_id = ex.parent.info.run_id
    root = set(_artifact_files(client, parent_id, None))
    tmp = ex.stage / f".partial-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        if SPEC_ARTIFACT not in root:
            raise PullError(f"run {parent_id} (experiment {experiment!r}): artifact {SPEC_ARTIFACT} is missing")
        spec_file = _download(client, parent_id, SPEC_ARTIFACT, tmp, f"experiment {experiment!r}")
        try:
            spec_dict = yaml.safe_load(spec_file.read_text())
            spec_hash = ExperimentSpec.model_validate(spec_dict).spec_hash()
        except Exception as exc:  # YAML or validation: name the artifact, not a traceback
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PullError(f"run {parent_id}: artifact {SPEC_ARTIFACT} is not a valid spec: {first}") from None
        expected = ex.parent.data.tags.get("ragledger.spec_hash")
        if expected and spec_hash != expected:
            raise PullError(f"run {parent_id}: artifact {SPEC_ARTIFACT} has spec hash {spec_hash}, the run's tag "
                            f"ragledger.spec_hash says {expected} (altered after logging)")
        ex.spec = spec_dict
        ragledger_dir = set(_artifact_files(client, parent_id, "ragledger"))
        if MANIFEST_ARTIFACT in ragledger_dir:
            manifest_file = _download(client, parent_id, MANIFEST_ARTIFACT, tmp, f"experiment {experiment!r}")
            try:
                ex.manifest = json.loads(manifest_file.read_text())
                _ = ex.manifest["summary"]["spec_hash"], ex.manifest["segments"]
            except (ValueError, KeyError, TypeError):
                raise PullError(f"run {parent_id}: artifact {MANIFEST_ARTIFACT} is not a run manifest") from None
            if ex.manifest["summary"]["spec_hash"] != spec_hash:
                raise PullError(f"run {parent_id}: artifact {MANIFEST_ARTIFACT} is of spec hash "
                                f"{ex.manifest['summary']['spec_hash']}, artifact {SPEC_ARTIFACT} of {spec_hash}")
            _plan_from_manifest(client, ex, experiment)
        else:
            _plan_from_runs(client, ex, experiment, spec_hash, tmp)
        packs = set(_artifact_files(client, parent_id, str(Path(callpack.ARTIFACT).parent)))
        if callpack.ARTIFACT in packs:
            ex.pack = (parent_id, callpack.ARTIFACT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _plan_from_manifest(client: Any, ex: _Execution, experiment: str) -> None:
    assert ex.manifest is not None
    listed: dict[str, set[str]] = {}  # run id -> its record artifacts

    def source(run_id: str, kind: str, rel: str, what: str) -> None:
        name = Path(rel).name
        artifact = f"records/{kind}/{name}"
        if run_id not in listed:
            listed[run_id] = {p for k in _artifact_files_dirs(client, run_id, "records")
                              for p in _artifact_files(client, run_id, k)}
        if artifact not in listed[run_id]:
            raise PullError(f"run {run_id} ({what}): artifact {artifact} is missing (the manifest lists it)")
        ex.segments.setdefault((kind, name), (run_id, artifact))

    for cell, kinds in ex.manifest["segments"].items():
        run = ex.cells.get(cell)
        if run is None:
            raise PullError(f"parent run {ex.parent.info.run_id} of experiment {experiment!r} has no cell run for "
                            f"cell {cell!r} (the manifest lists it)")
        for kind, files in kinds.items():
            for rel in files:
                source(run.info.run_id, kind, rel, f"cell {cell!r}")
    for rel in ex.manifest.get("closed_book_filter_segments") or []:
        source(ex.parent.info.run_id, "generations", rel, "closed-book filter")


def _artifact_files_dirs(client: Any, run_id: str, path: str) -> list[str]:
    return [f.path for f in client.list_artifacts(run_id, path) if f.is_dir]


def _plan_from_runs(client: Any, ex: _Execution, experiment: str, spec_hash: str, tmp: Path) -> None:
    """A run logged before the manifest artifact: the manifest from the cell runs' records and the summary."""
    from schemas.records import RECORD_MODELS

    parent = ex.parent
    cells: dict[str, Any] = {}
    segments: dict[str, dict[str, list[str]]] = {}
    for cell, run in ex.cells.items():
        kinds = segments.setdefault(cell, {})
        for kind_dir in _artifact_files_dirs(client, run.info.run_id, "records"):
            kind = Path(kind_dir).name
            if kind not in RECORD_MODELS:
                continue
            for artifact in _artifact_files(client, run.info.run_id, kind_dir):
                name = Path(artifact).name
                kinds.setdefault(kind, []).append(f"{kind}/{experiment}/{name}")
                ex.segments.setdefault((kind, name), (run.info.run_id, artifact))
        cells[cell] = dict(run.data.metrics)
    if SUMMARY_ARTIFACT in set(_artifact_files(client, parent.info.run_id, "analysis")):
        with contextlib.suppress(ValueError, OSError):
            cells.update(json.loads(_download(client, parent.info.run_id, SUMMARY_ARTIFACT, tmp, "summary").read_text()))
    metrics = parent.data.metrics
    summary: dict[str, Any] = {"experiment": experiment, "spec_hash": spec_hash,
                               "questions": int(metrics.get("questions", 0)), "cells": cells,
                               **{k: metrics[k] for k in RUN_STATS if k in metrics}}
    ex.manifest = {"summary": summary, "segments": segments, "closed_book_filter_segments": [], "spec": ex.spec,
                   "analysis_files": [], "portable": 1, "rebuilt_from_runs": True}


def _stage(client: Any, ex: _Execution, experiment: str, store: Path, result: PullResult, say) -> None:
    """Download what neither the store nor the staging area has; check each file before it is kept (staged)."""
    ex.stage.mkdir(parents=True, exist_ok=True)
    for stale in ex.stage.glob(".partial-*"):  # left by an interrupted pull (the pull lock is ours)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = ex.stage / f".partial-{os.getpid()}-{uuid.uuid4().hex}"
    try:
        for (kind, name), (run_id, artifact) in sorted(ex.segments.items()):
            staged = ex.stage / kind / name
            if segment_exists(store / kind / experiment / name) or staged.exists():
                result.reused += 1
                continue
            local = _download(client, run_id, artifact, tmp, _what(ex, run_id))
            problem = segment_problem(local, kind, experiment)
            if problem:
                raise PullError(f"run {run_id} ({_what(ex, run_id)}): artifact {artifact}: {problem}")
            staged.parent.mkdir(parents=True, exist_ok=True)
            os.replace(local, staged)
            result.downloaded += 1
        if ex.pack is not None and not (ex.stage / STAGED_PACK).exists():
            run_id, artifact = ex.pack
            local = _download(client, run_id, artifact, tmp, "call pack")
            try:
                callpack.read(local)
            except callpack.CallPackError as exc:
                raise PullError(f"run {run_id}: artifact {artifact}: {str(exc).split(': ', 1)[-1]}") from None
            os.replace(local, ex.stage / STAGED_PACK)
            result.downloaded += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"{ex.name}: {len(ex.segments)} segment(s) checked")


def _what(ex: _Execution, run_id: str) -> str:
    if run_id == ex.parent.info.run_id:
        return "parent run"
    return next((f"cell {c!r}" for c, r in ex.cells.items() if r.info.run_id == run_id), "run")


def segment_problem(path: Path, kind: str, experiment: str) -> str | None:
    """Why a downloaded segment must not enter the store (None: sound): unreadable, checksum, record kind, schema,
    experiment, or a name that is not the hash of its events."""
    import pyarrow.parquet as pq

    from schemas.records import RecordValidationError, validate_records
    from tracking.store.events import CHECKSUM_KEY, KIND_KEY, _table_checksum, stable_hash

    try:
        table = pq.read_table(path)
    except Exception as exc:  # a truncated or overwritten file; the message without our temp path
        reason = " ".join(str(exc).replace(str(path), "").split())
        return f"unreadable Parquet, truncated or not a segment ({reason[-120:]})"
    meta = table.schema.metadata or {}
    stored = meta.get(CHECKSUM_KEY, b"").decode()
    if not stored:
        return "no checksum in its metadata"
    if _table_checksum(table) != stored:
        return "checksum mismatch (altered after it was written)"
    if meta.get(KIND_KEY, kind.encode()).decode() != kind:
        return f"holds {meta[KIND_KEY].decode()} records, not {kind}"
    df = table.to_pandas()
    try:
        validate_records(kind, df)
    except RecordValidationError as exc:
        return f"schema: {' '.join(str(exc).split())[:300]}"
    experiments = sorted(set(df["experiment"].astype(str)))
    if experiments != [experiment]:
        return f"holds records of experiment(s) {', '.join(experiments)}, not {experiment}"
    if path.name != f"seg-{stable_hash(kind, sorted(df['event_id'].tolist()), length=24)}.parquet":
        return "its name is not the hash of the events it holds"
    return None


def _schema_versions(path: Path) -> set[int]:
    import pyarrow.parquet as pq

    return {int(v) for v in pq.read_table(path, columns=["schema_version"]).column(0).unique().to_pylist()}


def _check_schema_versions(todo: list[_Execution], store: Path, experiment: str) -> None:
    """Every record the experiment would hold after this pull has one schema version, or the pull is refused."""
    from schemas.records import RECORD_MODELS, SCHEMA_VERSION
    from tracking.store.events import EventStore

    where: dict[str, list[str]] = {}
    for ex in todo:
        for (kind, name), (run_id, artifact) in ex.segments.items():
            staged = ex.stage / kind / name
            if staged.exists():
                for v in _schema_versions(staged):
                    where.setdefault(str(v), []).append(f"run {run_id} {artifact}")
    local = EventStore(store)
    for kind in RECORD_MODELS:
        for seg in local.segments(kind, experiment):
            for v in _schema_versions(seg):
                where.setdefault(str(v), []).append(str(seg))
    _refuse_mixed({v: sorted(set(w)) for v, w in where.items()})
    newer = [v for v in where if int(v) > SCHEMA_VERSION]
    if newer:
        raise PullError(f"{where[newer[0]][0]} holds records of schema version {newer[0]}; this ragledger reads "
                        f"schema version {SCHEMA_VERSION} (upgrade ragledger to pull it)")


def _move_in(ex: _Execution, store: Path, experiment: str, tracking_uri: str, result: PullResult) -> None:
    """Staged segments renamed into the store, the call pack imported, then the manifest written (last)."""
    from core.diskfull import write_text_atomically
    from engines.llm_cache import LLMCallCache

    dirs: set[Path] = set()
    for kind, name in sorted(ex.segments):
        staged, target = ex.stage / kind / name, store / kind / experiment / name
        if not staged.exists():
            continue  # the store had it
        if segment_exists(target):  # the same name holds the same events (as a file, or compacted)
            staged.unlink()
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, target)
        dirs.add(target.parent)
    for d in dirs:  # the renames survive a crash before the manifest says they are there
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    pack = ex.stage / STAGED_PACK
    if pack.exists():
        cache = LLMCallCache(callpack.cache_path(store))
        try:
            imported = callpack.import_file(pack, cache)
        finally:
            cache.close()
        result.calls_added += imported.added
        result.calls_present += imported.present
    manifest = store / "runs" / experiment / f"{ex.name}.json"
    record = _local_manifest(ex, store, experiment, manifest, tracking_uri)
    write_text_atomically(manifest, json.dumps(record, indent=2, default=str))
    shutil.rmtree(ex.stage, ignore_errors=True)


def _local_manifest(ex: _Execution, store: Path, experiment: str, manifest: Path, tracking_uri: str) -> dict[str, Any]:
    """The portable manifest with this store's paths and the MLflow runs it came from: analyses read it, and log
    to the same parent run (the team's record), as on the machine that ran it."""

    assert ex.manifest is not None
    record = json.loads(json.dumps(ex.manifest))
    # a segment's rows name the experiment it is stored under (checked when it was staged)
    record["segments"] = {cell: {kind: [str(store / kind / experiment / Path(rel).name) for rel in files]
                                 for kind, files in kinds.items()}
                          for cell, kinds in record.get("segments", {}).items()}
    record["closed_book_filter_segments"] = [str(store / "generations" / experiment / Path(rel).name)
                                             for rel in record.get("closed_book_filter_segments") or []]
    record["spec"] = record.get("spec") or ex.spec
    record["analysis_files"] = []
    summary = record.setdefault("summary", {})
    summary.update({"manifest": str(manifest), "tracking_uri": tracking_uri,
                    "mlflow_parent_run_id": ex.parent.info.run_id,
                    "mlflow_cell_run_ids": {c: r.info.run_id for c, r in ex.cells.items()},
                    "mlflow_experiment_id": ex.parent.info.experiment_id})
    record["pulled_from"] = {"tracking_uri": redact_url(tracking_uri), "parent_run_id": ex.parent.info.run_id}
    return record

