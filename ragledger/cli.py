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
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.table import Table

from ragledger.cli_common import CORPUS_HELP, console, fail, preflight, stage_progress, usage_error, user_errors

if TYPE_CHECKING:
    from flows.head_start import HeadStart
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
    if isinstance(exc, errors):
        message, code = lines[0], 2
    elif isinstance(exc, OSError):
        message, code = f"{type(exc).__name__}: {lines[0]}", 2
    else:
        message, code = f"unexpected {type(exc).__name__}: {lines[0]} (a defect in ragledger: please report it)", 1
    where = f"; traceback in {runlog.shown(log)}" if log else ""
    fail(scrub(message) + where, code)


def _begin_head_start(spec: AnySpec, store_root: str, runner: str | None, base_url: str | None) -> HeadStart | None:
    """The run begun in a thread before Prefect is up (flows/head_start.py)."""
    from flows.head_start import HeadStart

    return HeadStart.begin(spec, store_root, runner, base_url)


def _import_flow_modules() -> None:
    """The flow modules' imports (Prefect, pandas, pandera: seconds on a cold start), done while Prefect's temporary
    server starts in its own process (ragledger/prefect_server.py `prefect_api`). Nothing heavier is imported before
    the first model call: torch, transformers and sentence-transformers never, MLflow inside the functions that use it
    (tests/test_cold_start_imports.py)."""
    import flows.sweep  # noqa: F401


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
    from core.secrets import mark_secret_env
    from ragledger import runlog

    errors = user_errors()
    try:  # every input is checked before anything is written (no .ragledger/ is created on bad input)
        spec, runner = _checked_run(spec_path, store, base_url, json_out, runner, workers, scheduler, limit, embedded, corpus)
    except errors as exc:
        fail(str(exc))
    store_root = store or spec.tracking.store
    if base_url is None and runner is None and (cached := _answered_from_store(spec, store_root)):
        _print_summary(cached)
        console.print(f"answered from the store: every cell's outcome is there (run manifest {cached['answered_from']}); "
                      "no flow run, model endpoint or index was started, and nothing new was logged")
        if json_out:
            json_out.write_text(json.dumps(cached, indent=2, default=str))
        return
    runlog.start(Path.cwd(), "run")
    mark_secret_env(spec.model.api_key_env)
    from ragledger.prefect_env import configure_prefect_home
    from ragledger.prefect_server import PrefectServerError, prefect_api

    configure_prefect_home(Path.cwd())
    _print_run_header(spec)
    with stage_progress():
        try:
            head_start = _begin_head_start(spec, store_root, runner, base_url)
            with prefect_api(meanwhile=_import_flow_modules):
                from flows.sweep import run_spec

                summary = run_spec(spec, store_root, base_url=base_url, runner=runner, workers=workers,
                                   scheduler_address=scheduler, head_start=head_start)
        except typer.Exit:
            raise
        except Exception as exc:  # user errors, the machine's (OSError), defects: one line, traceback in the log
            pending = getattr(exc, "summary", None)
            if pending is not None:  # MLflow did not take the logging: the results are stored, show them first
                _print_summary(pending)
            _report(exc, (*errors, PrefectServerError))
    _print_summary(summary)
    if json_out:
        json_out.write_text(json.dumps(summary, indent=2, default=str))


def _checked_run(spec_path: Path, store: str | None, base_url: str | None, json_out: Path | None, runner: str | None,
                 workers: int | None, scheduler: str | None, limit: int | None, embedded: bool,
                 corpus: str | None) -> tuple[AnySpec, str | None]:
    """The spec, parsed once with the command's overrides, and the runner; every input checked (a user error raised
    naming it) before anything is written."""
    from core.secrets import refuse_credentials
    from ragledger.locations import check_run_locations
    from schemas.spec import load_spec, with_overrides

    spec = with_overrides(load_spec(spec_path), limit=limit, embedded=embedded, corpus=corpus, source=str(spec_path))
    # every place the run writes (store, call cache, MLflow, Prefect home, logs, indexes, --json), before the inputs
    # are read: a mistyped store is named before a large corpus is read for its hash
    check_run_locations(spec, store or spec.tracking.store, "--store" if store else "tracking.store", Path.cwd(), json_out)
    preflight(spec)
    if runner not in (None, "thread", "dask"):
        raise usage_error(f"--runner: unknown runner {runner!r} (thread, dask)")
    if scheduler and runner == "thread":
        raise usage_error("--scheduler is a Dask scheduler: use it with --runner dask (or without --runner)")
    if workers is not None and workers <= 0:
        raise usage_error("--workers must be a positive integer")
    refuse_credentials(base_url, "--base-url", "put the API key in an environment variable and name it in "
                       "model.api_key_env")
    return spec, "dask" if scheduler else runner


def _print_run_header(spec: AnySpec) -> None:
    from schemas.spec import SweepSpec

    sweep = isinstance(spec, SweepSpec)
    datasets = ", ".join(f"{e.name + ': ' if sweep else ''}{e.dataset.name} (limit {e.dataset.limit})" for e in spec.expand())
    console.print(f"[bold]ragledger[/] {'sweep' if sweep else 'experiment'} [cyan]{spec.name}[/]: {len(spec.retrievers)} "
                  f"retriever(s) × {len(spec.readers)} reader(s) on {datasets}, model {spec.model.display_name}")


def _answered_from_store(spec: AnySpec, store_root: str) -> dict | None:
    """The run summary when this exact run is already in the store (flows/cached.py: every planned outcome segment
    exists and a manifest lists exactly them), logged to the MLflow the run would log to, with no MLflow logging
    pending: then a rerun through the flow would only read its caches, and answering here skips starting Prefect,
    the model endpoint, the JVM and the embedding model. None otherwise (the flow runs as usual)."""
    if os.environ.get("RAGLEDGER_CACHED_ANSWER", "1") == "0":
        return None
    from core.paths import StoreLayout

    if not StoreLayout.of(store_root).manifests(spec.name):  # a first run, told before the plan imports pandas
        return None
    from flows.cached import cached_result
    from tracking.mlflow.log import resolve_tracking_uri
    from tracking.mlflow.sync import pending_markers

    try:
        if pending_markers(store_root):
            return None
        summary = cached_result(spec, store_root)
    except Exception:  # the fast path is an optimisation: in any doubt the flow decides (and reports errors)
        return None
    if summary is None or summary.get("tracking_uri") != resolve_tracking_uri(spec.tracking.mlflow_uri):
        return None
    return summary


def _print_summary(summary: dict) -> None:
    """A run's readers table and model calls; for a sweep (summary["experiments"]), one table per dataset."""
    from tracking.analysis.readers_table import display_rows, headers, readers_table

    experiments = summary.get("experiments", [summary])
    for s in experiments:
        table = Table(title=f"{s['experiment']} — {s['questions']} questions", show_lines=False)
        for i, title in enumerate(headers()):
            table.add_column(title, no_wrap=True, justify="left" if i < 2 else "right", min_width=len(title) if i >= 2 else None)
        for row in display_rows(readers_table(s["cells"])):
            table.add_row(*row)
        console.print(table)
        if s.get("closed_book_dropped") is not None:
            console.print(f"closed-book filter (seed 001): dropped {s['closed_book_dropped']} of "
                          f"{s['questions_sampled']} sampled questions answered correctly without context; "
                          f"{s['questions']} remain")
        if "experiments" in summary:
            console.print(f"{s['experiment']}: model calls {s['llm_calls']}, {s['wall_time_s']:.1f} s, "
                          f"MLflow parent run {s['mlflow_parent_run_id']}")
    console.print("EM 95% CI: bootstrap over questions (1,000 resamples, seed 0); the same table is on the MLflow parent run "
                  "as analysis/readers_table.{csv,md,html}")
    what = f"this sweep ({len(experiments)} experiments)" if "experiments" in summary else "this run"
    tasks = ("no task ran" if summary.get("answered_from") else
             f"{summary['tasks_from_cache']}/{summary['tasks_total']} tasks from Prefect's cache")
    console.print(
        f"model calls {what}: [bold]{summary['llm_calls']}[/] (LLM-cache hits {summary['cache_hits']}, "
        f"retries {summary['retries']}; {tasks}) in {summary['wall_time_s']:.1f} s"
    )
    if summary.get("prompt_tokens_evaluated") is not None and summary.get("prompt_tokens_sent"):
        sent, evaluated = summary["prompt_tokens_sent"], summary["prompt_tokens_evaluated"]
        console.print(f"prompt tokens: {sent:,} sent, {evaluated:,} evaluated by the embedded server "
                      f"({100 * evaluated / sent:.0f}%: it reuses the previous prompt's prefix)")
    if any(s.get("mlflow_parent_run_id") is None for s in experiments):
        return  # MLflow did not take the logging: the error line after the table says so
    parents = ", ".join(s["mlflow_parent_run_id"] for s in experiments)
    console.print(f"MLflow: {summary['tracking_uri']}  experiment id {summary['mlflow_experiment_id']}, "
                  f"parent run{'s' if len(experiments) > 1 else ''} {parents}")
    console.print("open it with: [bold]ragledger ui[/]   (then http://127.0.0.1:5000)")


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
