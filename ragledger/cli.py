"""The `ragledger` command line. Heavy imports live inside commands so `--help` stays instant."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from ragledger.cli_common import CORPUS_HELP, console, err, fail, stage_progress, usage_error, user_errors
from ragledger.run_report import print_run_header, print_summary

if TYPE_CHECKING:
    from schemas.spec import AnySpec

app = typer.Typer(
    name="ragledger",
    help="Event-sourced experiment tracker for retrieval-augmented QA research.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _report(exc: BaseException, errors: tuple[type[BaseException], ...]) -> NoReturn:
    """End a command that failed after it started: the traceback goes to the run log (ragledger.runlog), the
    terminal gets one `error:` line naming the log. Exit 2 for what the user or the machine must fix (their
    errors name the culprit; an OSError names its path: disk full, permission denied), 1 for a defect."""
    from core.secrets import scrub
    from ragledger import runlog

    log = runlog.write_traceback(exc)
    lines = str(exc).strip().splitlines() or [type(exc).__name__]  # the rest of a long message is in the log
    if isinstance(exc, errors):  # no log yet: an input the run checks before it starts (flows/launch.py), said whole
        message, code = lines[0] if log else "\n".join(lines), 2
    elif isinstance(exc, OSError):
        message, code = f"{type(exc).__name__}: {lines[0]}", 2
    else:
        message, code = f"unexpected {type(exc).__name__}: {lines[0]} (a defect in ragledger: please report it)", 1
    where = f"; traceback in {runlog.shown(log)}" if log else ""
    fail(scrub(message) + where, code)


class _RunHost:
    """What this command gives the run's route (flows/launch.py `Host`): its terminal, its run log and Prefect's
    home, and the Prefect API server it starts."""

    def say(self, line: str) -> None:
        err.print(line, highlight=False)

    @contextlib.contextmanager
    def running(self, spec: AnySpec) -> Iterator[None]:
        from ragledger import runlog
        from ragledger.prefect_env import configure_prefect_home

        runlog.start(Path.cwd(), "run")
        configure_prefect_home(Path.cwd())
        print_run_header(spec)
        with stage_progress():
            yield

    def prefect_api(self, meanwhile: Callable[[], None]) -> contextlib.AbstractContextManager[str]:
        from ragledger.prefect_server import prefect_api

        return prefect_api(meanwhile=meanwhile)


@app.command()
def run(
    spec_path: Annotated[Path, typer.Argument(help="experiment spec (YAML)", metavar="SPEC")],
    store: Annotated[str | None, typer.Option(help="event store directory (overrides tracking.store)")] = None,
    base_url: Annotated[str | None, typer.Option(help="use this OpenAI-compatible endpoint instead of the spec's")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the run summary as JSON here")] = None,
    runner: Annotated[str | None, typer.Option(help="task runner: thread (default) or dask (overrides execution.runner)")] = None,
    workers: Annotated[int | None, typer.Option(help="Dask worker processes of the local cluster")] = None,
    scheduler: Annotated[str | None, typer.Option(help="an existing Dask scheduler's address instead of a local cluster "
                                                  "(implies --runner dask)")] = None,
    limit: Annotated[int | None, typer.Option(help="questions per dataset (overrides dataset.limit)")] = None,
    embedded: Annotated[bool, typer.Option("--embedded", help="use the embedded CPU model instead of the spec's endpoint "
                                           "(e.g. a paper config written for a vLLM server)")] = False,
    corpus: Annotated[str | None, typer.Option(help=CORPUS_HELP)] = None,
) -> None:
    """Run an experiment: retrieve -> generate -> vote -> evaluate, tracked in the store and MLflow."""
    from flows.launch import RunOptions, launch
    from ragledger.prefect_server import PrefectServerError

    errors = user_errors()
    try:  # every input is checked before anything is written (no .ragledger/ is created on bad input)
        spec = _checked_spec(spec_path, store, base_url, json_out, runner, workers, scheduler, limit, embedded, corpus)
    except errors as exc:
        fail(str(exc))
    options = RunOptions(store or spec.tracking.store, base_url, "dask" if scheduler else runner, workers, scheduler)
    try:
        summary = launch(spec, options, _RunHost())
    except typer.Exit:
        raise
    except Exception as exc:  # user errors, the machine's (OSError), defects: one line, traceback in the log
        pending = getattr(exc, "summary", None)
        if pending is not None:  # MLflow did not take the logging: the results are stored, show them first
            print_summary(pending)
        _report(exc, (*errors, PrefectServerError))
    print_summary(summary)
    if json_out:
        json_out.write_text(json.dumps(summary, indent=2, default=str))


def _checked_spec(spec_path: Path, store: str | None, base_url: str | None, json_out: Path | None, runner: str | None,
                  workers: int | None, scheduler: str | None, limit: int | None, embedded: bool,
                  corpus: str | None) -> AnySpec:
    """The spec, parsed once with the command's overrides; the options and every place the run writes checked (a
    user error raised naming it) before anything is written. Its inputs are checked by the run (flows/launch.py)."""
    from core.secrets import refuse_credentials
    from ragledger.locations import check_run_locations
    from schemas.overrides import with_overrides
    from schemas.spec import load_spec

    spec = with_overrides(load_spec(spec_path), limit=limit, embedded=embedded, corpus=corpus, source=str(spec_path))
    if runner not in (None, "thread", "dask"):
        raise usage_error(f"--runner: unknown runner {runner!r} (thread, dask)")
    if scheduler and runner == "thread":
        raise usage_error("--scheduler is a Dask scheduler: use it with --runner dask (or without --runner)")
    if workers is not None and workers <= 0:
        raise usage_error("--workers must be a positive integer")
    refuse_credentials(base_url, "--base-url", "put the API key in an environment variable and name it in "
                       "model.api_key_env")
    # every place the run writes (store, call cache, MLflow, Prefect home, logs, indexes, --json), before the inputs
    # are read (flows/launch.py): a mistyped store is named before a large corpus is read for its hash
    check_run_locations(spec, store or spec.tracking.store, "--store" if store else "tracking.store", Path.cwd(), json_out)
    return spec


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
    tracking_uri: Annotated[str | None, typer.Option(help="default: the embedded SQLite store under .ragledger/")] = None,
) -> None:
    """Open the MLflow UI on the embedded tracking store (127.0.0.1 only)."""
    from tracking.mlflow.log import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    console.print(f"MLflow UI for {uri} at http://127.0.0.1:{port}  (Ctrl-C to stop)")
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)]
    raise typer.Exit(subprocess.call(cmd))


# indexes, retrieval-only recall, scoring predictions, the store's check, the bundled models (ragledger/cli_data.py)
from ragledger.cli_data import register as _register_data  # noqa: E402

_register_data(app)
# analyses over stored records: query, errors, flips, hardest, analyze, trace (ragledger/cli_analysis.py)
from ragledger.cli_analysis import register as _register_analysis  # noqa: E402

_register_analysis(app)
# operating it: the local Prefect server, schedules, flow runs (ragledger/cli_ops.py)
# across experiments: history, leaderboard, diff (ragledger/cli_history.py)
from ragledger.cli_history import register as _register_history  # noqa: E402

_register_history(app)
from ragledger.cli_ops import register as _register_ops  # noqa: E402

_register_ops(app)

from ragledger.cli_share import register as _register_share  # noqa: E402

_register_share(app)


_exit_status: int | None = None  # the command's exit status, once it returned or failed with SystemExit


def main() -> None:
    """The `ragledger` command (pyproject.toml [project.scripts])."""
    global _exit_status
    atexit.register(_exit_without_teardown)  # runs after the atexit handlers the command's imports register
    try:
        app()
    except SystemExit as exc:
        code = exc.code
        _exit_status = code if isinstance(code, int) else (0 if code is None else 1)
        raise


def _exit_without_teardown() -> None:
    """End the process once the other atexit handlers ran, without the interpreter's teardown: its last garbage
    collections walked every object a run created (2.6 s measured after a 2,000-question run) only to free what
    the OS frees anyway. Non-daemon threads were joined before atexit; logging is flushed here, stdout and stderr
    too (a failed flush ends with status 120, as the interpreter's own exit would), and C's stdio buffers (native
    libraries' output). An uncaught exception (no status) ends the usual way."""
    if _exit_status is None:
        return
    status = _exit_status
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a full disk or a closed pipe: the output is cut short, which the status must say
            status = status or 120
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)
    os._exit(status)


if __name__ == "__main__":
    main()
