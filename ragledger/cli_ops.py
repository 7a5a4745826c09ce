"""Operating ragledger: the local Prefect server, scheduled experiments, and the list of flow runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from flows.launch import preflight
from ragledger.cli_common import DEFAULT_STORE, checked_store, console, fail, usage_error, user_errors

if TYPE_CHECKING:
    from schemas.spec import AnySpec

server_app = typer.Typer(help="The long-running local Prefect server (schedules, flow-run history, Prefect UI).",
                         no_args_is_help=True)

EXPERIMENT_FLOWS = ["ragledger-experiment", "ragledger-sweep", "ragledger-scheduled"]


@server_app.command("start")
def server_start(port: Annotated[int, typer.Option(help="port")] = 4200,
                 host: Annotated[str, typer.Option(help="address to bind; beyond 127.0.0.1 it needs "
                                                        "PREFECT_SERVER_API_AUTH_STRING")] = "127.0.0.1") -> None:
    """Start the local Prefect server and the warm runner in the background (idempotent); `ragledger run` in this
    directory then uses both (ragledger/warm_runner.py)."""
    from core.exposure import ExposureError
    from ragledger import warm_runner
    from ragledger.prefect_env import configure_prefect_home
    from ragledger.prefect_server import PrefectServerError, prefect_home, start_persistent_server

    configure_prefect_home(Path.cwd())
    try:
        url, started = start_persistent_server(port, host)
        pid, runner_started = warm_runner.start(Path.cwd(), prefect_home() / "ragledger-runner.log")
    except (PrefectServerError, ExposureError, warm_runner.WarmRunnerError) as exc:
        fail(str(exc))
    console.print(f"Prefect server {'started' if started else 'already running'}: {url} "
                         f"(UI at {url.removesuffix('/api')}; stop with `ragledger server stop`)")
    console.print(f"warm runner {'started' if runner_started else 'already running'} (pid {pid}): `ragledger run` "
                  "here starts with its imports done")


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server and the warm runner started by `ragledger server start` (runs under way go on)."""
    from ragledger import warm_runner
    from ragledger.prefect_env import configure_prefect_home
    from ragledger.prefect_server import stop_persistent_server

    configure_prefect_home(Path.cwd())
    console.print("Prefect server stopped" if stop_persistent_server() else "no ragledger Prefect server was running")
    if warm_runner.stop():
        console.print("warm runner stopped")


@server_app.command("status")
def server_status() -> None:
    """Say whether the local Prefect server runs, and where, and whether the warm runner does."""
    from ragledger import warm_runner
    from ragledger.prefect_env import configure_prefect_home
    from ragledger.prefect_server import persistent_server_url

    configure_prefect_home(Path.cwd())
    url = os.environ.get("PREFECT_API_URL") or persistent_server_url()
    console.print(f"Prefect API: {url}" if url else "no Prefect server running (each `ragledger run` starts a "
                         "temporary one); start one with `ragledger server start`")
    pid = warm_runner.running_pid()
    console.print(f"warm runner: pid {pid}" if pid else "no warm runner (the next `ragledger run` here starts one "
                  "as it ends)")
    raise typer.Exit(0 if url else 1)


def schedule(
    spec_path: Annotated[Path, typer.Argument(help="experiment spec (YAML)", metavar="SPEC")],
    cron: Annotated[str | None, typer.Option(help='cron expression, e.g. "0 3 * * *" (03:00 every day)')] = None,
    interval: Annotated[float | None, typer.Option(help="or: every N seconds")] = None,
    name: Annotated[str | None, typer.Option(help="deployment name (default: the spec's name)")] = None,
    store: Annotated[str | None, typer.Option(help="event store directory or s3:// URL (overrides tracking.store)")] = None,
    runner: Annotated[str | None, typer.Option(help="task runner of the scheduled runs: thread or dask")] = None,
    workers: Annotated[int | None, typer.Option(help="Dask worker processes")] = None,
) -> None:
    """Create a Prefect deployment that runs SPEC on a schedule, and serve it (this process keeps running).

    The spec is read now and frozen into the deployment's parameters; relative store and MLflow paths are
    made absolute, so the scheduled runs write where `ragledger run` here would.
    """
    spec, store_location = _checked_schedule(spec_path, cron, interval, runner, store)
    from ragledger.prefect_env import configure_prefect_home
    from ragledger.prefect_server import PrefectServerError, check_access, start_persistent_server

    configure_prefect_home(Path.cwd())
    try:
        url = os.environ.get("PREFECT_API_URL") or start_persistent_server()[0]
        check_access(url)
    except PrefectServerError as exc:
        fail(str(exc))
    os.environ["PREFECT_API_URL"] = url
    from flows.experiment import scheduled_experiment
    from tracking.mlflow.log import resolve_tracking_uri

    params = {"spec_dict": spec.model_dump(), "store_root": store_location,
              "tracking_uri": resolve_tracking_uri(spec.tracking.mlflow_uri), "runner": runner, "workers": workers}
    deployment = name or spec.name
    when = f"cron {cron!r}" if cron else f"every {interval:g} s"
    console.print(f"serving deployment [cyan]ragledger-scheduled/{deployment}[/] ({when}) on {url}; "
                      "Ctrl-C stops the schedule; `ragledger runs` lists its runs")
    scheduled_experiment.serve(name=deployment, cron=cron, interval=interval, parameters=params,
                               tags=["ragledger", spec.name], print_starting_message=False,
                               limit=1)  # one run at a time: a slow run delays the next instead of overlapping it


def _checked_schedule(spec_path: Path, cron: str | None, interval: float | None, runner: str | None,
                      store: str | None) -> tuple[AnySpec, str]:
    """The spec and the store its scheduled runs write (an s3:// URL as it is, a folder made absolute), everything
    checked now, not at the first run: the inputs, the options, and where the runs write (`ragledger run`'s checks).
    A bad one ends the command with one error line."""
    from ragledger.locations import checked_run_store
    from schemas.spec import load_spec
    from tracking.store.objects import is_s3_url

    try:
        spec = load_spec(spec_path)
        preflight(spec, source=str(spec_path))
        if (cron is None) == (interval is None):
            raise usage_error("give exactly one of --cron or --interval")
        if interval is not None and interval <= 0:
            raise usage_error("--interval must be a positive number of seconds")
        if cron is not None:
            from flows.prefect_internals import validate_cron_string

            try:
                validate_cron_string(cron)
            except ValueError as exc:
                raise usage_error(f"--cron: {exc}") from None
        if runner not in (None, "thread", "dask"):
            raise usage_error(f"--runner: unknown runner {runner!r} (thread, dask)")
        checked_run_store(spec, store)
    except user_errors() as exc:
        fail(str(exc))
    given = store or spec.tracking.store
    return spec, given if is_s3_url(given) else str(Path(given).resolve())


def runs(
    limit: Annotated[int, typer.Option(help="how many flow runs, newest first")] = 20,
    experiment: Annotated[str | None, typer.Option(help="only this experiment (spec name)")] = None,
) -> None:
    """Recent experiment flow runs (manual and scheduled) with their state and MLflow parent run id."""
    from ragledger.prefect_env import configure_prefect_home
    from ragledger.prefect_server import PrefectServerError, check_access, persistent_server_url, prefect_api

    configure_prefect_home(Path.cwd())
    try:
        given = os.environ.get("PREFECT_API_URL") or persistent_server_url()
        if given:  # an API this command does not start: does it answer, and take this process's credentials?
            check_access(given)
        with prefect_api() as url:
            rows = _flow_runs(limit, experiment)
    except PrefectServerError as exc:
        fail(str(exc))
    table = Table(title=f"flow runs on {url}")
    for col in ("flow run", "flow", "state", "started (UTC)", "seconds", "experiment", "MLflow parent run"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(*(str(r[k]) for k in ("name", "flow", "state", "started", "seconds", "experiment", "mlflow_run")))
    console.print(table)
    if not rows:
        console.print("no experiment flow runs recorded in this Prefect database yet")


def _flow_runs(limit: int, experiment: str | None) -> list[dict[str, Any]]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows(flow_filter=FlowFilter(name=FlowFilterName(any_=EXPERIMENT_FLOWS)))}
        found = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=EXPERIMENT_FLOWS)),
                                      sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=limit * 4 + 100)
    # a schedule keeps future runs queued: show only the next of those, then what ran
    upcoming = [fr for fr in found if fr.state_name == "Scheduled"]
    found = upcoming[-1:] + [fr for fr in found if fr.state_name != "Scheduled"]
    rows = []
    for fr in found:
        if fr.parent_task_run_id:  # an experiment run as a scheduled run's subflow: its parent's row shows it
            continue
        # the parameter is the scheduled flow's `spec_dict`, an experiment or sweep flow's `spec`
        spec = fr.parameters.get("spec") or fr.parameters.get("spec_dict") or {}
        name = spec.get("name", "?")
        names = _experiment_names(spec)
        if experiment and experiment not in (name, *names):
            continue
        store = fr.parameters.get("store_root")
        mlflow_runs = [r for n in names if (r := _mlflow_run_of(store, n, str(fr.id)))]
        rows.append({"name": fr.name, "flow": flows.get(fr.flow_id, "?"), "state": fr.state_name or "?",
                     "started": fr.start_time.strftime("%Y-%m-%d %H:%M:%S") if fr.start_time else "-",
                     "seconds": f"{fr.total_run_time.total_seconds():.1f}" if fr.total_run_time else "-",
                     "experiment": name, "mlflow_run": ", ".join(mlflow_runs) or "-", "id": str(fr.id)})
    return rows[:limit]


def _experiment_names(spec_dict: dict) -> list[str]:
    """The experiments a flow run's spec runs: its name, or a sweep's `<name>.<label>` per dataset."""
    from schemas.spec import SpecError, parse_spec

    try:
        return [e.name for e in parse_spec(spec_dict).expand()]
    except SpecError:  # a spec recorded by an older version: its name is all we can go by
        return [spec_dict.get("name", "?")]


def _mlflow_run_of(store_root: str | None, experiment: str, flow_run_id: str) -> str | None:
    """The MLflow parent run id a flow run recorded in its run manifest (`<store>/runs/<experiment>/*.json`)."""
    if not store_root:
        return None
    for manifest in sorted((Path(store_root) / "runs" / experiment).glob("*.json"), reverse=True):
        try:
            summary = json.loads(manifest.read_text())["summary"]
        except (OSError, ValueError, KeyError):
            continue
        if flow_run_id in (summary.get("flow_run_id"), summary.get("root_flow_run_id")):
            return summary.get("mlflow_parent_run_id")
    return None


def sync(
    store: Annotated[str, typer.Option(help="event store directory")] = DEFAULT_STORE,
    tracking_uri: Annotated[str | None, typer.Option(help="log here instead of the URI each run was meant for")] = None,
    all_executions: Annotated[bool, typer.Option("--all", help="also every execution in the store that has no "
                                                 "runs at the URI (--tracking-uri, else MLFLOW_TRACKING_URI, else "
                                                 "each run's own): rebuild a lost or new MLflow database")] = False,
) -> None:
    """Log to MLflow the executions whose MLflow logging is pending (MLflow was down), each exactly once."""
    import os

    from tracking.mlflow import sync as mlflow_sync

    store = checked_store(store, writing=True)
    if all_executions and tracking_uri is None:  # a rebuild goes where the user's MLflow is now
        tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or None
    before = len(mlflow_sync.pending_markers(store))
    result = mlflow_sync.sync(store, tracking_uri, everything=all_executions, log=lambda e: console.print(
        f"logged {e['experiment']} execution {e['execution']} to MLflow {e['tracking_uri']}: parent run {e['parent']}, "
        f"{len(e['cells'])} cell run(s)", highlight=False))
    from tracking.store.objects import StorageError
    from tracking.store.remote import push_up

    try:
        push_up(store)  # a store at an s3:// URL: the manifests now naming their MLflow runs go to the bucket
    except StorageError as exc:
        fail(str(exc))
    console.print(f"{len(result.logged)} execution(s) logged to MLflow; {len(result.pending)} still pending "
                      f"(of {before} pending before)" + (f"; {len(result.skipped)} already logged or being logged by "
                                                         "another process" if result.skipped else ""))
    if result.pending:
        first = result.pending[0]
        error = mlflow_sync.pending_error(first["tracking_uri"], store, ConnectionError(first["error"]), len(result.pending))
        fail(str(error))


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")
    app.command()(schedule)
    app.command()(runs)
    app.command()(sync)
