"""CLI commands that share experiments between machines: `pull` (an experiment's store from its MLflow runs) and
`cache export` / `cache import` (LLM calls as a call pack, without MLflow). Registered on the main Typer app by
`register(app)`."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ragledger.cli_common import DEFAULT_STORE, checked_store, console, err, fail

StoreOpt = Annotated[str, typer.Option("--store", help="event store directory (its call cache is llm_cache.sqlite in it)")]
MlflowUriOpt = Annotated[str | None, typer.Option(
    "--mlflow-uri", envvar="MLFLOW_TRACKING_URI", show_envvar=True,
    help="MLflow tracking URI to pull from (default: the embedded store .ragledger/mlflow.db)")]


# for the commands over stored records (query, errors, flips, hardest, analyze, trace): where to pull an experiment
# from when the local store lacks it; no default, so without it (or MLFLOW_TRACKING_URI) nothing is pulled
MlflowPullOpt = Annotated[str | None, typer.Option(
    "--mlflow-uri", envvar="MLFLOW_TRACKING_URI", show_envvar=True,
    help="pull the experiment from this MLflow first when the store lacks it (ragledger pull)")]


def over_records(command: Callable[..., None] | None = None, *, writes: bool = False) -> Any:
    """A command over stored records (query, errors, flips, hardest, analyze, trace): before its body runs, `--store`
    is checked (a new or empty folder too when the experiment may be pulled into it; for a command that `writes`,
    an s3:// store's credentials for writing too) and the experiment it names is
    brought from the MLflow at `--mlflow-uri` when the store lacks it (tracking.mlflow.pull.ensure_local); a read
    that fails (tracking.store.ledger.LedgerError, an AnalysisError too) is one error line. So the body only parses,
    reads and prints. What the pull did goes to stderr: a command's CSV or JSON on stdout stays clean."""
    if command is None:
        return functools.partial(over_records, writes=writes)
    signature = inspect.signature(command)

    @functools.wraps(command)
    def run(*args: object, **kwargs: object) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        # the folder the body reads: `--store` itself, or an s3:// store's mirror (tracking/store/remote.py)
        given["store"] = _pull_missing(str(given["store"]), given.get("experiment"), given.get("mlflow_uri"), writes)
        from tracking.store.ledger import LedgerError

        try:
            command(*bound.args, **bound.kwargs)
        except LedgerError as exc:
            fail(str(exc))

    return run


def _pull_missing(store: str, experiment: str | None, mlflow_uri: str | None, writes: bool = False) -> str:
    store = checked_store(store, creating=bool(experiment and mlflow_uri), writing=writes)
    if not experiment:
        return store
    from tracking.mlflow.pull import PullError, ensure_local

    try:
        r = ensure_local(experiment, store, mlflow_uri, log=lambda line: err.print(escape(line), highlight=False))
    except PullError as exc:
        fail(str(exc))
    if r is not None and r.pulled:
        err.print(f"pulled {escape(experiment)} from MLflow into {r.store} ({r.downloaded} artifact(s), "
                  f"{r.calls_added} LLM call(s) into the call cache)", highlight=False)
    return store


def pull_cmd(
    experiment: Annotated[str, typer.Argument(help="experiment name (the spec's name)")],
    mlflow_uri: MlflowUriOpt = None,
    store: StoreOpt = DEFAULT_STORE,
) -> None:
    """Rebuild an experiment's event store from its MLflow runs: every record segment (checksum and schema
    checked), run manifest, spec, and its LLM calls into the call cache. Resumable; a second pull downloads
    nothing."""
    from core.secrets import redact_url
    from tracking.mlflow.log import default_tracking_uri
    from tracking.mlflow.pull import PullError, pull
    from tracking.store.objects import StorageError

    store = checked_store(store, creating=True)
    uri = mlflow_uri or default_tracking_uri()
    try:
        r = pull(experiment, store, uri, log=lambda line: console.print(escape(line), highlight=False))
        from tracking.store.remote import push_up

        push_up(store)  # a store at an s3:// URL: the pulled records and manifests go to the bucket
    except (PullError, StorageError) as exc:
        fail(str(exc))
    if r.nothing_new:
        console.print(f"nothing new to pull: {len(r.present)} execution(s) of {escape(experiment)} already in "
                      f"{r.store} (0 downloaded)", highlight=False)
        return
    console.print(f"pulled {len(r.pulled)} execution(s) of {escape(experiment)} from {escape(redact_url(uri) or '')} "
                  f"into {r.store}: {r.downloaded} artifact(s) downloaded, {r.reused} segment(s) already there; "
                  f"{r.calls_added} LLM call(s) added to the call cache ({r.calls_present} already cached)",
                  highlight=False)



def cache_export(
    file: Annotated[Path, typer.Argument(help="call pack to write (.jsonl.gz)")],
    store: StoreOpt = DEFAULT_STORE,
    experiment: Annotated[str | None, typer.Option(
        help="only the calls this experiment's generation records made (default: the whole cache)")] = None,
) -> None:
    """Write the store's LLM calls (request identity, response, usage, log-probabilities) to a call pack."""
    from engines.llm_cache import LLMCallCache
    from tracking.store import callpack
    from tracking.store.events import EventStore, calls_of_segments

    store = checked_store(store)
    cache_file = callpack.cache_path(store)
    if not cache_file.is_file():
        fail(f"--store {store}: no call cache ({cache_file} does not exist)")
    try:
        cache = LLMCallCache(cache_file)
        try:
            if experiment:
                segments = EventStore(store).segments("generations", experiment)
                if not segments:
                    fail(f"--experiment {experiment}: no generation records under {Path(store) / 'generations'}")
                data, head = callpack.build(cache, calls_of_segments(segments), {"experiment": experiment})
            else:
                data, head = callpack.build_all(cache)
        finally:
            cache.close()
        callpack.write(file, data)
    except OSError as exc:
        fail(f"{file}: {exc}")
    missing = f" ({head['missing_from_cache']} of the experiment's calls are not in the cache)" \
        if head["missing_from_cache"] else ""
    console.print(f"{head['calls']} LLM call(s) written to {escape(str(file))}{missing}", highlight=False)



def cache_import(
    file: Annotated[Path, typer.Argument(help="call pack to read (.jsonl.gz)")],
    store: StoreOpt = DEFAULT_STORE,
) -> None:
    """Add a call pack's LLM calls to the store's call cache (calls already cached are kept as they are)."""
    from engines.llm_cache import LLMCallCache
    from tracking.store import callpack

    store = checked_store(store, creating=True)
    try:
        pack = callpack.read(file)
        os.makedirs(store, exist_ok=True)
        cache = LLMCallCache(callpack.cache_path(store))
        try:
            r = callpack.import_into(pack, cache)
        finally:
            cache.close()
    except callpack.CallPackError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--store {store}: {exc}")
    console.print(f"{r.calls} LLM call(s) in {escape(str(file))}: {r.added} added to "
                  f"{callpack.cache_path(store)}, {r.present} already cached", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("pull")(pull_cmd)
    cache_app = typer.Typer(help="Move LLM calls between call caches as a call pack (no MLflow needed).",
                            no_args_is_help=True)
    cache_app.command("export")(cache_export)
    cache_app.command("import")(cache_import)
    app.add_typer(cache_app, name="cache")
