"""The recorder of runs made without Prefect's flow (flows/direct.py): a process of its own, started once a run's
table is printed, that records the run in Prefect and MLflow.

It runs the experiment's Prefect flow over the same plan (flows/execute.py `record_in_prefect`): every stage task is
answered by the result the store keeps under its key, so Prefect holds the flow run and its task runs as a run in
the flow would have left them; then it notes the flow run on the execution's manifest and logs the execution to
MLflow from the manifest (tracking/mlflow/sync.py, exactly once). Killed or failed, it leaves the execution's
pending marker: the next run that logs to the same MLflow, or `ragledger sync`, logs it. Its output and any
traceback go to the log of the run that started it.

Recording costs seconds of CPU (Prefect's temporary server and imports, MLflow's: ~13 CPU-seconds for a 20-question
run, more than the run), which a run started meanwhile on the same cores would wait for: so recorders keep out of the
way of runs, and runs made one after another are recorded together. A run queues what it asks to be recorded, a
file under `<cache home>/recordings/`, and starts a recorder; the recorder that holds `<cache home>/recorder.lock`
(one at a time) records every queued recording of its working directory (whose Prefect home they share) in one
process, with one temporary Prefect server, and the recorders waiting behind it find their recordings done and end.
A recording is removed from the queue once recorded, so a killed recorder's is recorded by the next. Every run of this
machine holds a shared lock on `<cache home>/active-runs.lock` while it works (`run_active`); a recorder begins each
recording only once no run has held it for QUIET_S seconds, at the lowest CPU priority, and waits again at each of
its steps while a run works.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

QUIET_S = 3.0  # a recorder begins once no run has been working for this long


def _in_cache_home(name: str) -> Path:
    """A lock file or the recordings folder of this machine, its cache home made if need be."""
    from core.paths import cache_home

    path = cache_home() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def run_active() -> Iterator[None]:
    """Held while a run works: recorders wait (the lock is the kernel's, released when the process ends however)."""
    with open(_in_cache_home("active-runs.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


def _runs_active() -> bool:
    with open(_in_cache_home("active-runs.lock"), "a") as lock:
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


def _give_way_to_runs() -> None:
    """At a recording's steps (each stage task it submits, its logging, its compaction): at once when no run works,
    else once runs have been quiet for QUIET_S. The steps in flight go on; none holds what a run waits for."""
    if _runs_active():
        _wait_for_quiet()


STALE_AFTER_S = 7 * 24 * 3600  # a recording queued this long ago (its recorders all failed or were killed) is dropped


def start_recorder(store_root: str, tracking_uri: str, manifest: str | None = None, spec_json: str | None = None) -> int:
    """Queue the recording of the execution whose manifest is `manifest` (of spec `spec_json`) and start a recorder,
    detached from this process (it outlives the command and takes no signal from its terminal); its pid, which ends
    once the recording is done. Without them: the logging of the store's pending executions for `tracking_uri` to
    MLflow only (a cached answer's, flows/launch.py)."""
    import ragledger.runlog as runlog
    from core.atomic import atomic_write_text
    from tracking.mlflow.sync import RECORDINGS

    job = {"store_root": store_root, "tracking_uri": tracking_uri, "manifest": manifest, "spec_json": spec_json,
           "cwd": os.getcwd()}
    queued = _in_cache_home(RECORDINGS) / f"{time.time_ns()}-{os.getpid()}.json"
    queued.parent.mkdir(exist_ok=True)
    atomic_write_text(queued, json.dumps(job))
    path = runlog.current()
    out = subprocess.DEVNULL
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        out = open(path, "a", encoding="utf-8")  # noqa: SIM115  (the child's; closed here once it has it)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ragledger.recorder", str(queued)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    finally:
        if out is not subprocess.DEVNULL:
            out.close()
    return proc.pid


def record(queued: str) -> None:
    """Once this recorder holds the recorder lock: unless another recorder has recorded `queued` meanwhile, every
    recording queued from this working directory, oldest first, each begun once runs are quiet."""
    _yield_the_cores()
    with open(_in_cache_home("recorder.lock"), "a") as one_at_a_time:
        fcntl.flock(one_at_a_time, fcntl.LOCK_EX)
        here = _here()
        if not Path(queued).exists() or here is None:  # recorded already; or its directory gone, nothing to record
            return
        with _PrefectApi() as prefect:
            while jobs := _queued_here(here):
                for path, job in jobs:
                    _wait_for_quiet()
                    try:
                        _record_one(job, prefect)
                    except Exception:  # a store gone, an MLflow that refuses: said, and not retried by every recorder
                        log.exception("the recording of %s failed", job.get("manifest") or job.get("store_root"))
                    path.unlink(missing_ok=True)


def _here() -> str | None:
    """This process's working directory, or None once it is deleted."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def _queued_here(here: str) -> list[tuple[Path, dict]]:
    """The recordings queued from the working directory `here`, oldest first; one stale, unreadable or with nothing
    left to record (of any directory) is dropped."""
    from tracking.mlflow.sync import queued_recordings

    jobs = []
    for path, job in queued_recordings():
        try:
            stale = time.time() - path.stat().st_mtime > STALE_AFTER_S
        except OSError:  # recorded and removed meanwhile
            stale = True
        if stale or job is None or _gone(job):
            path.unlink(missing_ok=True)
        elif job.get("cwd") == here:
            jobs.append((path, job))
    return jobs


def _gone(job: dict) -> bool:
    """A recording whose directory, store folder or manifest no longer exists: nothing to record (a store at a URL
    is asked by the recording itself). Paths are the run's, relative to its working directory."""
    cwd, store, manifest = Path(str(job.get("cwd", ""))), str(job.get("store_root", "")), job.get("manifest")
    if not cwd.is_dir():
        return True
    if "://" in store:
        return False
    return not (cwd / store).exists() or (manifest is not None and not (cwd / manifest).exists())


class _PrefectApi(contextlib.ExitStack):
    """The Prefect API a recorder's flow runs record in, entered at its first flow run (a queue of MLflow loggings
    alone needs none) and left when the queue is done: one temporary server for the whole queue."""

    entered = False

    def enter(self) -> None:
        if not self.entered:
            from ragledger.prefect_env import configure_prefect_home
            from ragledger.prefect_server import prefect_api

            configure_prefect_home(Path.cwd())
            self.enter_context(prefect_api())
            self.entered = True


def _record_one(job: dict, prefect: _PrefectApi) -> None:
    """A run's Prefect flow run (the Prefect API entered into `prefect` the first time: one for the whole queue),
    then the MLflow logging of its store's pending executions for its tracking URI, tried even when Prefect fails.
    Without a manifest: the logging only."""
    from tracking.mlflow.sync import recordings_queued, sync

    own = Path(job["manifest"]).stem if job.get("manifest") else None
    if job.get("manifest") and job.get("spec_json"):
        _record_flow_run(job["store_root"], job["manifest"], job["spec_json"], prefect)
    # the run's own execution is logged already; those queued behind it are left to their own recordings
    result = sync(job["store_root"], job["tracking_uri"], only_uri=job["tracking_uri"],
                  leave=recordings_queued() - {own})
    for pending in result.pending:
        log.error("MLflow logging of %s still pending (`ragledger sync` logs it): %s", pending["execution"],
                  pending["error"])


def _yield_the_cores() -> None:
    """This process and those it starts (the temporary Prefect server) run only when the cores are otherwise idle
    (Linux's SCHED_IDLE; elsewhere the lowest priority): recording must not slow the user's next command.

    A recorder has a session of its own (`start_recorder`), and Linux's autogroup scheduling (on by default, e.g.
    Debian's and Ubuntu's kernels) gives each session an equal share of the CPU whatever the policy or niceness of its
    processes: so its session's autogroup is made the lowest priority too (what it costs a run otherwise:
    docs/performance.md, "The fixed cost of a small run")."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)
    lowest_autogroup_priority()


def lowest_autogroup_priority() -> None:
    """The autogroup of this process's session at niceness 19, when the process leads a session of its own (not
    the user's terminal's, whose commands share its autogroup); nothing where there is none. Raising it takes no
    privilege."""
    if os.getsid(0) != os.getpid():
        return
    try:
        with open("/proc/self/autogroup", "w") as autogroup:
            autogroup.write("19")
    except OSError:  # not Linux, autogroup scheduling off (the file refuses writes), or no /proc
        pass


def _record_flow_run(store_root: str, manifest: str, spec_json: str, prefect: _PrefectApi) -> None:
    from schemas.spec import ExperimentSpec

    spec = ExperimentSpec.model_validate_json(spec_json)
    try:
        prefect.enter()
        from flows.execute import record_in_prefect

        record_in_prefect(spec, store_root, manifest, give_way=_give_way_to_runs)
    except Exception:
        log.exception("the run's Prefect flow run was not recorded")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s recorder %(levelname)s %(message)s")
    record(sys.argv[1])
