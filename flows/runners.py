"""How Prefect runs a flow's tasks: the task runner (threads, or Dask processes), the check that a named Dask scheduler
takes this client, and the heartbeat settings."""

from __future__ import annotations

import contextlib
import os
import sys


def task_runner_for(runner: str, workers: int, scheduler_address: str | None = None):
    """None = Prefect's default thread pool; "dask" = prefect-dask on a LocalCluster of worker processes (or an
    existing scheduler). Workers need PREFECT_API_URL in their environment (ragledger.prefect_server sets it)."""
    if runner == "thread":
        return None
    if runner != "dask":
        raise ValueError(f"execution.runner: unknown runner {runner!r} (thread, dask)")
    from prefect_dask import DaskTaskRunner

    if scheduler_address:
        return DaskTaskRunner(address=scheduler_address)
    # processes: retrieval (JVM, FAISS) and parsing are CPU work; a few threads each for model-call waits. Each
    # worker bounds its own model calls with its share of model.concurrency (the whole run's bound: `task_processes`)
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 4, "processes": True,
                                          "dashboard_address": None})


def _flows_dask_runner():
    """Inside the flow: its Dask task runner, or None for threads (whose runs never import prefect_dask)."""
    if "prefect_dask" not in sys.modules:
        return None
    from prefect.context import get_run_context
    from prefect.exceptions import MissingContextError
    from prefect_dask import DaskTaskRunner

    try:
        runner = get_run_context().task_runner
    except MissingContextError:  # not in a flow (flows/direct.py): its tasks run in this process's threads
        return None
    return runner if isinstance(runner, DaskTaskRunner) else None


def task_processes() -> int:
    """Inside the flow: how many processes run its tasks, each with its share of model.concurrency
    (engines/concurrency.py): the flow's own, or the Dask workers the scheduler has when the flow starts (a local
    cluster's, or a long-lived one's, wherever they run). A worker that joins later takes the same share."""
    runner = _flows_dask_runner()
    return 1 if runner is None else max(1, len(runner.client.nthreads()))


def task_progress(run_token: str) -> contextlib.AbstractContextManager:
    """Inside the flow: the progress of its tasks reaching this process's display. Tasks in threads report to it
    directly; tasks on Dask workers through the scheduler (flows/dask_workers.py `progress_from_workers`)."""
    runner = _flows_dask_runner()
    if runner is None:
        return contextlib.nullcontext()
    from flows.dask_workers import progress_from_workers

    return progress_from_workers(runner, run_token)


class DaskSchedulerError(ConnectionError):
    """The Dask scheduler a run names cannot be reached with this process's Dask security settings."""


TLS_CONFIG = ("Dask's TLS settings: DASK_DISTRIBUTED__COMM__TLS__CA_FILE, ...__TLS__CLIENT__CERT and "
              "...__TLS__CLIENT__KEY, printed by `bash infra/dask_cluster.sh certs`")


def check_scheduler(address: str, timeout_s: float = 10.0) -> None:
    """Connect to the scheduler once, TLS handshake included, before the run writes anything: a scheduler that is
    down, or that refuses this client's certificate (or its lack of one), is one error line after at most
    `timeout_s`, not a traceback from inside the flow."""
    import asyncio

    from distributed.comm import connect
    from distributed.security import Security

    async def handshake() -> None:
        comm = await connect(address, timeout=timeout_s, **Security().get_connection_args("client"))
        await comm.close()

    try:
        asyncio.run(handshake())
    except Exception as exc:  # OSError, TimeoutError, ssl errors, "TLS expects a ssl_context": all the same to a user
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = f"; {TLS_CONFIG}" if address.startswith("tls://") else ""
        raise DaskSchedulerError(f"the Dask scheduler at {address} refused or did not answer: {reason}{hint}") from None


HEARTBEAT_SETTINGS = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")


def without_default_heartbeats() -> contextlib.AbstractContextManager:
    """Run a flow without Prefect's default flow-run heartbeats unless the user set a frequency.

    Prefect 3.8 sends one every 180 s by default from a thread that sleeps in 1 s steps and is joined when the
    flow ends, so every flow run waits 0-1 s (0.45 s on average, measured with py-spy over 8 cached reruns) at
    its end: a sixth of an identical rerun's time here. Heartbeats serve only Prefect's zombie-run automations,
    which ragledger does not configure; a lab that uses them sets PREFECT_FLOWS_HEARTBEAT_FREQUENCY and keeps
    them. The served `ragledger-scheduled` parent flow runs under Prefect's runner and keeps its default."""
    if any(name in os.environ for name in HEARTBEAT_SETTINGS):
        return contextlib.nullcontext()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
