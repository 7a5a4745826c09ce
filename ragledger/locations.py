"""Preflight of the places a run writes: each must exist or be creatable, be a directory (or, for a database
file, a file in a writable directory), and be writable, checked before anything is written or started.

Without it a store path naming a file surfaced as a NotADirectoryError from inside the flow, after Prefect and
MLflow had started. Writability is tested by creating (and at once removing) a nameless file in the directory,
or in its nearest existing ancestor when the directory is still to be created: permission bits say nothing for
root, a read-only mount or a full disk, and the check must leave nothing behind on bad input
(tests/test_reliability.py checks that no .ragledger/ appears).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from schemas.spec import AnySpec


class LocationError(ValueError):
    """A location a run would write is not usable; the message names the setting and the path."""


@dataclass(frozen=True)
class Location:
    what: str  # the setting or option that chose it, as the user knows it
    path: Path
    kind: Literal["dir", "file"]


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    return p


def _probe_writable(directory: Path, what: str, target: Path) -> None:
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        shown = target if directory == target else f"{target} (in {directory})"
        raise LocationError(f"{what}: {shown} is not writable: {why}") from None


def _check_dir(what: str, path: Path, target: Path | None = None) -> None:
    """`path` must be a writable directory or creatable; `target` (default `path`) is what the messages name:
    the file to be created in it, when there is one."""
    target = target or path
    if path.exists():
        if not path.is_dir():
            if target != path:
                raise LocationError(f"{what}: cannot create {target}: {path} is a file, not a directory")
            raise LocationError(f"{what}: {path} is a file, not a directory")
        _probe_writable(path, what, target)
        return
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise LocationError(f"{what}: cannot create {target}: {existing} is a file, not a directory")
    _probe_writable(existing, what, target)


def check_location(loc: Location) -> None:
    """Raise LocationError if `loc` cannot be written."""
    path = Path(os.path.abspath(loc.path.expanduser()))
    if loc.kind == "dir":
        _check_dir(loc.what, path)
        return
    if path.is_dir():
        raise LocationError(f"{loc.what}: {path} is a directory, not a file")
    if path.exists():
        try:  # r+ opens for writing without creating or truncating anything
            with open(path, "r+b"):
                pass
        except OSError as exc:
            raise LocationError(f"{loc.what}: {path} is not writable: {exc.strerror or type(exc).__name__}") from None
    # the file's directory: created if missing, and SQLite writes its journal beside the file
    _check_dir(loc.what, path.parent, path)


def mlflow_locations(spec_uri: str | None) -> list[Location]:
    """The local files an MLflow tracking URI writes: a SQLite database and the artifacts beside it
    (tracking.mlflow.log), or a file store directory. Server URIs (http, postgresql) have none here."""
    if spec_uri:
        uri, what = spec_uri, "tracking.mlflow_uri"
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri, what = os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    else:  # tracking.mlflow.log.default_tracking_uri, computed without creating .ragledger/
        uri, what = f"sqlite:///{(Path.cwd() / '.ragledger' / 'mlflow.db').resolve()}", "MLflow database"
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        return [Location(what, db, "file"), Location(f"{what} (artifacts)", db.parent / "mlartifacts", "dir")]
    if uri.startswith("file:"):
        return [Location(what, Path(uri.removeprefix("file://").removeprefix("file:")), "dir")]
    if "://" not in uri:  # a plain path is a file store
        return [Location(what, Path(uri), "dir")]
    return []


def run_locations(spec: AnySpec, store_root: str, store_what: str, workdir: Path,
                  json_out: Path | None = None) -> list[Location]:
    """Every place `ragledger run` writes: the store and its call cache, MLflow's database and artifacts, Prefect's
    home (database, task results), the run logs, the retrieval indexes, a bundled model still to be fetched, and
    the --json summary."""
    from core.paths import cache_home
    from ragledger.prefect_env import default_prefect_home
    from strategies.retrievers import parse_retriever

    store = Path(store_root)
    found = [Location(store_what, store, "dir"),
             Location(f"{store_what} (LLM-call cache)", store / "llm_cache.sqlite", "file"),
             *mlflow_locations(spec.tracking.mlflow_uri)]
    prefect_home = os.environ.get("PREFECT_HOME")
    found.append(Location("PREFECT_HOME" if prefect_home else "Prefect home",
                          Path(prefect_home) if prefect_home else default_prefect_home(workdir), "dir"))
    if os.environ.get("PREFECT_LOCAL_STORAGE_PATH"):
        found.append(Location("PREFECT_LOCAL_STORAGE_PATH", Path(os.environ["PREFECT_LOCAL_STORAGE_PATH"]), "dir"))
    found.append(Location("run logs", workdir / ".ragledger" / "logs", "dir"))
    if any(parse_retriever(r).needs_corpus for r in spec.retrievers):
        # tasks.context.index_root_for, without importing it: it imports prefect, whose settings must be read
        # after ragledger.prefect_env has set PREFECT_HOME
        index_dir = os.environ.get("RAGLEDGER_INDEX_DIR")
        found.append(Location("RAGLEDGER_INDEX_DIR" if index_dir else "retrieval indexes",
                              Path(index_dir) if index_dir else cache_home() / "indexes", "dir"))
    if spec.model.backend == "embedded":
        from engines.models import BUNDLED_MODELS

        model = BUNDLED_MODELS.get(spec.model.embedded_model)
        if model is not None and not model.path.exists():
            found.append(Location("bundled models (RAGLEDGER_HOME)", cache_home() / "models", "dir"))
    if json_out is not None:
        found.append(Location("--json", json_out, "file"))
    return found


def check_run_locations(spec: AnySpec, store_root: str, store_what: str, workdir: Path,
                        json_out: Path | None = None) -> None:
    """Every place the run writes can be written, and its store is a store or a new or empty folder
    (tracking/store/identity.py: NotAStoreError otherwise)."""
    from tracking.store.identity import require_store

    for loc in run_locations(spec, store_root, store_what, workdir, json_out):
        check_location(loc)
    require_store(store_root, store_what, creating=True)


def checked_run_store(spec: AnySpec, store: str | None, json_out: Path | None = None) -> str:
    """The folder a run of `spec` writes its store in (`store`, the command's --store, else tracking.store): the
    folder itself, or an s3:// store's mirror brought up to date with the credentials checked for writing; and every
    place the run writes checked (`check_run_locations`), before anything is written or any input read."""
    from tracking.store.remote import local_root

    what = "--store" if store else "tracking.store"
    root = local_root(store or spec.tracking.store, what, creating=True)
    check_run_locations(spec, root, what, Path.cwd(), json_out)
    return root


def write_summary(path: Path, text: str) -> None:
    """The run summary of `ragledger run --json`, written where it was checked with the run's other locations
    (`run_locations`): its folder made when missing, as the store's and the MLflow database's are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
