"""The recorder of a run made without Prefect's flow (flows/direct.py): a process of its own, started once the run's
table is printed, that records the run in Prefect and MLflow.

It runs the experiment's Prefect flow over the same plan (flows/execute.py `recorded_flow`): every stage task is
answered by the result the store keeps under its key, so Prefect holds the flow run and its task runs as a run in
the flow would have left them; then it notes the flow run on the execution's manifest and logs the execution to
MLflow from the manifest (tracking/mlflow/sync.py, exactly once). Killed or failed, it leaves the execution's
pending marker: the next run that logs to the same MLflow, or `ragledger sync`, logs it. Its output and any
traceback go to the run's log.

Recording costs seconds of CPU (Prefect's temporary server and imports, MLflow's), which a run started meanwhile on
the same cores would wait for: so recorders keep out of the way of runs. Every run of this machine holds a shared
lock on `<cache home>/active-runs.lock` while it works (`run_active`), and a recorder begins only once no run has
held it for QUIET_S seconds, at the lowest CPU priority, one recorder at a time (`<cache home>/recorder.lock`). A
series of runs started back to back is recorded after its last run.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

QUIET_S = 3.0  # a recorder begins once no run has been working for this long


def _lock_file(name: str) -> Path:
    from core.paths import cache_home

    path = cache_home() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def run_active() -> Iterator[None]:
    """Held while a run works: recorders wait (the lock is the kernel's, released when the process ends however)."""
    with open(_lock_file("active-runs.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


def _runs_active() -> bool:
    with open(_lock_file("active-runs.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at once, with the file
        except BlockingIOError:
            return True
    return False


def _wait_for_quiet() -> None:
    """Until no run has been working for QUIET_S seconds."""
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S:
        time.sleep(0.25)
        if _runs_active():
            quiet_since = time.monotonic()


def start_recorder(store_root: str, tracking_uri: str, manifest: str | None = None, spec_json: str | None = None) -> int:
    """Start the recorder of the execution whose manifest is `manifest` (of spec `spec_json`), detached from this
    process (it outlives the command and takes no signal from its terminal); its pid. Without them: a recorder that
    only logs the store's pending executions for `tracking_uri` to MLflow (a cached answer's, flows/launch.py)."""
    import ragledger.runlog as runlog

    path = runlog.current()
    out = subprocess.DEVNULL
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = open(path, "a", encoding="utf-8")  # noqa: SIM115  (the child's; closed here once it has it)
    try:
        args = [store_root, tracking_uri] + ([] if manifest is None or spec_json is None else [manifest, spec_json])
        proc = subprocess.Popen([sys.executable, "-m", "ragledger.recorder", *args],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    finally:
        if out is not subprocess.DEVNULL:
            out.close()
    return proc.pid


def record(store_root: str, tracking_uri: str, manifest: str | None = None, spec_json: str | None = None) -> None:
    """The run's Prefect flow run, then the MLflow logging of the store's pending executions for `tracking_uri` (the
    run's among them); the logging is tried even when Prefect fails. Without a manifest: the logging only."""
    from tracking.mlflow.sync import sync

    _yield_the_cores()
    with open(_lock_file("recorder.lock"), "a") as one_at_a_time:
        fcntl.flock(one_at_a_time, fcntl.LOCK_EX)
        _wait_for_quiet()
        if manifest is not None and spec_json is not None:
            _record_flow_run(store_root, manifest, spec_json)
        result = sync(store_root, tracking_uri, only_uri=tracking_uri)  # the run's: logged by its flow already
    for pending in result.pending:
        log.error("MLflow logging of %s still pending (`ragledger sync` logs it): %s", pending["execution"],
                  pending["error"])


def _yield_the_cores() -> None:
    """This process and those it starts (the temporary Prefect server) run only when the cores are otherwise idle
    (Linux's SCHED_IDLE; elsewhere the lowest priority): recording must not slow the user's next command."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def _record_flow_run(store_root: str, manifest: str, spec_json: str) -> None:
    from ragledger.prefect_env import configure_prefect_home
    from schemas.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate_json(spec_json)
    configure_prefect_home(Path.cwd())
    try:
        from ragledger.prefect_server import prefect_api

        with prefect_api():
            from flows.execute import recorded_flow

            recorded_flow(spec, store_root, manifest)
    except Exception:
        log.exception("the run's Prefect flow run was not recorded")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s recorder %(levelname)s %(message)s")
    record(*sys.argv[1:5])
