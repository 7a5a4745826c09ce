"""Running a spec from the command line (`ragledger run`, ragledger/cli.py) and from Python (`ragledger.run`): the
spec parsed with its overrides and the options and every place the run writes checked before anything is written,
then the one route below both (flows/launch.py `launch`), and a failure as one line. Imports nothing heavy at the top:
`ragledger --help` and a first run's way to its head start load no pandas (tests/test_cold_start_imports.py)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from flows.launch import RunOptions
    from schemas.spec import AnySpec

    SpecGiven = str | os.PathLike[str] | dict[str, Any] | AnySpec  # a YAML file's path, a mapping, a parsed spec


def spec_of(spec: SpecGiven) -> tuple[AnySpec, str]:
    """The typed spec and the name its errors go by: a YAML file's path, a mapping (as a YAML file would hold), or a
    parsed spec."""
    from schemas.spec import ExperimentSpec, SweepSpec, load_spec, parse_spec

    if isinstance(spec, ExperimentSpec | SweepSpec):
        return spec, "<spec>"
    if isinstance(spec, dict):
        return parse_spec(spec), "<spec>"
    return load_spec(spec), str(spec)


def checked_run(spec_given: SpecGiven, store: str | None, base_url: str | None, json_out: Path | None,
                runner: str | None, workers: int | None, scheduler: str | None, limit: int | None, embedded: bool,
                corpus: str | None, record_after: bool = False) -> tuple[AnySpec, RunOptions]:
    """The spec, parsed once with the command's overrides, and the run's options (`record_after`: flows/launch.py
    `RunOptions`); the options, every place the run writes and the servers it talks to checked (a user error raised
    naming it) before anything is written. Its inputs are checked by the run (flows/launch.py `preflight`)."""
    from core.secrets import refuse_credentials
    from engines.llm_types import endpoint_url_problem
    from flows.launch import RunOptions
    from ragledger.cli_common import usage_error
    from ragledger.locations import checked_run_store
    from schemas.overrides import with_overrides

    parsed, source = spec_of(spec_given)
    spec = with_overrides(parsed, limit=limit, embedded=embedded, corpus=corpus, source=source)
    if runner not in (None, "thread", "dask"):
        raise usage_error(f"--runner: unknown runner {runner!r} (thread, dask)")
    if scheduler and runner == "thread":
        raise usage_error("--scheduler is a Dask scheduler: use it with --runner dask (or without --runner)")
    if workers is not None and workers <= 0:
        raise usage_error("--workers must be a positive integer")
    refuse_credentials(base_url, "--base-url", "put the API key in an environment variable and name it in "
                       "model.api_key_env")
    if base_url is not None and (problem := endpoint_url_problem(base_url)):  # not told at the first model call
        raise usage_error(f"--base-url: {problem}")
    # every place the run writes (store, call cache, MLflow, Prefect home, logs, indexes, --json), before the inputs
    # are read (flows/launch.py): a mistyped store is named before a large corpus is read for its hash
    root = checked_run_store(spec, store, json_out)  # an s3:// store: its mirror, up to date
    if (scheduler or spec.execution.scheduler_address) and "://" not in root:
        root = str(Path(root).resolve())  # a long-lived cluster's workers each run in a folder of their own
    options = RunOptions(root, base_url, "dask" if scheduler else runner, workers, scheduler, record_after, source)
    check_services(spec, options)
    return spec, options


def check_services(spec: AnySpec, options: RunOptions) -> None:
    """The servers the run would talk to that it does not start, each asked once, in bounded time, whether it answers
    and takes this process's credentials: a Prefect API (PREFECT_API_URL or `ragledger server`), an MLflow server, a
    Dask scheduler. A refusal is one error line naming the service before anything is written."""

    from flows.runners import check_scheduler
    from ragledger.prefect_server import check_access, persistent_server_url
    from tracking.mlflow.log import check_credentials

    prefect = os.environ.get("PREFECT_API_URL") or persistent_server_url()
    if prefect:
        check_access(prefect)
    tracking_uri = spec.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if tracking_uri:
        check_credentials(tracking_uri)
    scheduler = options.scheduler or spec.execution.scheduler_address
    if scheduler:
        check_scheduler(scheduler)


class RunHost:
    """What a run started in this process gives its route (flows/launch.py `Host`): the run log and Prefect's home
    beside the working directory, and the Prefect API (a temporary server, or `ragledger server`'s). Lines for the
    user go to logging; the command's host (ragledger/cli.py) prints them and adds its header and progress bars."""

    def say(self, line: str) -> None:
        logging.getLogger("ragledger").info(line)

    @contextlib.contextmanager
    def running(self, spec: AnySpec) -> Iterator[None]:
        import ragledger.runlog as runlog
        from ragledger.prefect_env import configure_prefect_home
        from ragledger.recorder import run_active

        runlog.start(Path.cwd(), "run")
        configure_prefect_home(Path.cwd())
        with run_active():  # recorders of earlier runs wait (ragledger/recorder.py)
            yield

    def prefect_api(self, meanwhile: Callable[[], None]) -> contextlib.AbstractContextManager[str]:
        from ragledger.prefect_server import prefect_api

        return prefect_api(meanwhile=meanwhile)

    def start_recorder(self, store_root: str, tracking_uri: str, manifest: str | None = None,
                       spec_json: str | None = None) -> int:
        from ragledger.recorder import start_recorder

        return start_recorder(store_root, tracking_uri, manifest, spec_json)


def failure_line(exc: BaseException, errors: tuple[type[BaseException], ...]) -> tuple[str, int]:
    """A run that failed, as one `error:` line's text and an exit status: the traceback goes to the run log
    (ragledger.runlog), the line names the log. 2 for what the user or the machine must fix (their errors name the
    culprit; an OSError names its path: disk full, permission denied), 1 for a defect."""
    import ragledger.runlog as runlog
    from core.secrets import scrub

    log = runlog.write_traceback(exc)
    lines = str(exc).strip().splitlines() or [type(exc).__name__]  # the rest of a long message is in the log
    if isinstance(exc, errors):  # no log yet: an input the run checks before it starts (flows/launch.py), said whole
        message, code = lines[0] if log else "\n".join(lines), 2
    elif isinstance(exc, OSError):
        message, code = f"{type(exc).__name__}: {lines[0]}", 2
    else:
        message, code = f"unexpected {type(exc).__name__}: {lines[0]} (a defect in ragledger: please report it)", 1
    where = f"; traceback in {runlog.shown(log)}" if log else ""
    return scrub(message) + where, code


def run_errors() -> tuple[type[BaseException], ...]:
    """The errors of a run the user or the machine must fix (ragledger/cli_common.py `user_errors`), a Prefect
    server that would not start or refuses the credentials, and a Dask scheduler that refuses or does not answer."""
    from flows.runners import DaskSchedulerError
    from ragledger.cli_common import user_errors
    from ragledger.prefect_server import PrefectServerError

    return (*user_errors(), PrefectServerError, DaskSchedulerError)


@dataclass(frozen=True)
class RunResult:
    """One experiment's run (`ragledger.run`): its execution (the run manifest's name), its readers table, its MLflow
    parent run, and the whole run summary as `ragledger run --json` writes it."""

    experiment: str
    execution: str | None
    readers_table: pd.DataFrame
    mlflow_run_id: str | None  # None while its MLflow logging is pending (`ragledger sync` logs it)
    store: str
    summary: dict[str, Any]


def run(spec: SpecGiven, *, store: str | os.PathLike[str] | None = None, base_url: str | None = None,
        limit: int | None = None, embedded: bool = False, corpus: str | None = None, runner: str | None = None,
        workers: int | None = None, scheduler: str | None = None) -> RunResult | list[RunResult]:
    """Run a spec as `ragledger run` does (the same options, checked the same way before anything is written, the
    same route: flows/launch.py): a YAML file's path, a mapping, or a parsed spec (schemas/spec.py). An experiment
    gives its RunResult, a sweep one per dataset, in order. A bad input or a failed run raises RagledgerError with
    the command's `error:` line; a defect in ragledger is raised as it is."""
    from flows.launch import launch
    from ragledger.api import RagledgerError
    from ragledger.runlog import RUN_LOG_ENV

    try:
        checked, options = checked_run(spec, None if store is None else _named(store), base_url, None,
                                       runner, workers, scheduler, limit, embedded, corpus)
    except run_errors() as exc:
        raise RagledgerError(str(exc)) from None
    previous_log = os.environ.get(RUN_LOG_ENV)
    try:
        summary = launch(checked, options, RunHost())
    except (*run_errors(), OSError) as exc:
        raise RagledgerError(failure_line(exc, run_errors())[0]) from exc
    finally:  # the run log is this run's, not the process's
        if previous_log is None:
            os.environ.pop(RUN_LOG_ENV, None)
        else:
            os.environ[RUN_LOG_ENV] = previous_log
    results = [_result(s, options.store_root) for s in summary.get("experiments", [summary])]
    return results if "experiments" in summary else results[0]


def _named(store: str | os.PathLike[str]) -> str:
    """A store as `ragledger run --store` takes it: a URL as it is (checked_run opens it), a path or file:// as a path."""
    from ragledger.api import store_root

    text = os.fspath(store)
    return text if text.startswith("s3://") else str(store_root(text))


def _result(summary: dict[str, Any], root: str) -> RunResult:
    from tracking.analysis.readers_table import readers_table

    manifest = summary.get("manifest") or summary.get("answered_from")
    return RunResult(summary["experiment"], Path(manifest).stem if manifest else None, readers_table(summary["cells"]),
                     summary.get("mlflow_parent_run_id"), root, summary)
