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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from ragledger.cli_common import CORPUS_HELP, console, err, fail, stage_progress
from ragledger.run_report import print_run_header, print_summary
from ragledger.running import RunHost

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
    """End a command that failed after it started with one `error:` line naming the run log, and its exit status
    (ragledger/running.py `failure_line`)."""
    from ragledger.running import failure_line

    fail(*failure_line(exc, errors))


class _RunHost(RunHost):
    """What this command gives the run's route (flows/launch.py `Host`): the run log, Prefect's home and the Prefect
    API server as any run in this process (ragledger/running.py `RunHost`), with its terminal: lines to stderr, the
    run's header and its stage progress bars."""

    def say(self, line: str) -> None:
        err.print(line, highlight=False)

    @contextlib.contextmanager
    def running(self, spec: AnySpec) -> Iterator[None]:
        with super().running(spec):
            print_run_header(spec)
            with stage_progress():
                yield


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
    foreground: Annotated[bool, typer.Option("--foreground", help="record the run in Prefect and MLflow before the "
                                             "command returns (also RAGLEDGER_FOREGROUND=1), not after its table")] = False,
) -> None:
    """Run an experiment: retrieve -> generate -> vote -> evaluate, tracked in the store and MLflow."""
    from flows.launch import launch
    from ragledger.running import checked_run, run_errors

    errors = run_errors()
    try:  # every input is checked before anything is written (no .ragledger/ is created on bad input)
        record_after = not foreground and os.environ.get("RAGLEDGER_FOREGROUND") != "1"
        spec, options = checked_run(spec_path, store, base_url, json_out, runner, workers, scheduler, limit, embedded,
                                    corpus, record_after)
    except errors as exc:
        fail(str(exc))
    try:
        summary = launch(spec, options, _RunHost())
    except typer.Exit:
        raise
    except Exception as exc:  # user errors, the machine's (OSError), defects: one line, traceback in the log
        pending = getattr(exc, "summary", None)
        if pending is not None:  # MLflow did not take the logging: the results are stored, show them first
            print_summary(pending)
        _report(exc, run_errors())
    print_summary(summary)
    if json_out:
        from ragledger.locations import write_summary

        write_summary(json_out, json.dumps(summary, indent=2, default=str))  # its folder made, as checked


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 5000,
    tracking_uri: Annotated[str | None, typer.Option(help="default: the embedded SQLite store under .ragledger/")] = None,
) -> None:
    """Open the MLflow UI on the embedded tracking store (127.0.0.1 only)."""
    from core.exposure import port_in_use
    from core.processes import die_with_parent
    from core.secrets import redact_url
    from ragledger.mlflow_server import without_job_runner
    from tracking.mlflow.log import given_tracking_uri, is_tracking_server, resolve_tracking_uri

    server = given_tracking_uri(tracking_uri)
    if is_tracking_server(server):  # a lab's MLFLOW_TRACKING_URI, say
        shown = redact_url(server)  # a URL's password stays off the terminal
        console.print(f"MLflow UI for {shown}: the server serves it; open {shown} in a browser")
        return
    if port_in_use("127.0.0.1", port):
        fail(f"--port {port}: 127.0.0.1:{port} is in use by another process (another MLflow UI?); choose another port")
    uri = resolve_tracking_uri(tracking_uri)
    console.print(f"MLflow UI for {redact_url(uri)} at http://127.0.0.1:{port}  (Ctrl-C to stop)")
    # one researcher's browser: one worker, not MLflow's default of four (each ~200 MB)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port),
           "--workers", "1"]
    # the UI ends with this command, however it ends (killed, too): no MLflow UI left holding the port
    raise typer.Exit(subprocess.call(cmd, env=without_job_runner(dict(os.environ)), preexec_fn=die_with_parent))


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
        _exit_status = exit_status(exc)
        raise


def exit_status(exc: SystemExit) -> int:
    """The process's exit status for a SystemExit, as the interpreter gives it (a message: 1)."""
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


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
