"""A run whose answer is printed before Prefect or MLflow is imported, then recorded in both by a process of its own.

`ragledger run` of one experiment on the thread runner into a store in a folder takes this route unless asked to
record in the foreground (flows/launch.py `takes_direct_route`). The run is planned and executed as the flow would
(flows/prepare.py, flows/executor.py `execute`: the same plan, stage keys, tasks, events and call cache), its stage
bodies (tasks/stage_runs.py) on a plain thread pool instead of Prefect's task runner, each stage answered by the
result the store keeps under its key when an earlier run ran it. Then its metrics, recall curve, readers table and
run manifest are written as the flow's recording writes them (flows/recording.py), the manifest with its MLflow
logging pending (tracking/mlflow/sync.py `leave_pending`). The command prints the table
and starts the recorder (ragledger/recorder.py), which runs the experiment's Prefect flow over the same plan (every task
answered by its kept result), draws the recall curve, adds it to the manifest, logs the execution to MLflow
from its manifest and compacts the experiment's segments. Killed before it logged, the
recorder leaves the marker: the next run that logs to the same MLflow, or `ragledger sync`, logs it.

What the route saves is Prefect's imports, its temporary API server's start and its task runs, and MLflow's import
and logging, before the answer (docs/performance.md, "The fixed cost of a small run").
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flows.executor import StageTasks, execute
from flows.prepare import PreparedRun, plan_run, store_run
from flows.recording import record_run
from flows.run_summary import Accounting, StageClock
from schemas.spec import ExperimentSpec
from tasks.stage_runs import is_kept, stage_body, stage_functions
from tasks.stages import StageResult

# what the run summary's mlflow_pending says until the recorder has logged the execution
RECORDED_AFTER = "logged to MLflow by the run's recorder, started once the table is printed (ragledger/recorder.py)"


class PlainTask:
    """A stage's body submitted to a thread pool, as flows/pipeline.py submits a Prefect task."""

    def __init__(self, body: Any, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self._body, self._pool = body, pool

    def submit(self, **params: Any) -> concurrent.futures.Future[StageResult]:
        return self._pool.submit(self._body, **params)

    def with_options(self, **options: Any) -> PlainTask:
        """The same task: a kept result is taken only with its segment in the store (tasks/stage_runs.py)."""
        return self


def plain_tasks(pool: concurrent.futures.ThreadPoolExecutor) -> StageTasks:
    return StageTasks(**{name: PlainTask(stage_body(fn), pool) for name, (_, fn) in stage_functions().items()})


def run_direct(spec: ExperimentSpec, store_root: str, base_url: str | None = None,
               planned: PreparedRun | None = None) -> dict[str, Any]:
    """The run summary of `spec`, run into `store_root` without Prefect, its MLflow logging left pending for the
    recorder. `planned`: the run, when it was planned already (flows/launch.py asked the store for it)."""
    from core.diskfull import as_store_full
    from tracking.mlflow.log import resolve_tracking_uri

    clock = StageClock()
    if planned is not None and _calls_first(spec, base_url, planned):  # its imports beside the rest of the start
        from engines.call_processes import start_first_call_process

        start_first_call_process()
    the_plan, run, questions = prepared = planned or plan_run(spec, store_root)
    # the indexes of the retrievers whose retrievals are still to be made (a rerun's kept ones start no JVM)
    retrievers = dict.fromkeys(s.retriever for s in the_plan.retrieves.values() if not is_kept(run, s))
    tracking_uri = resolve_tracking_uri(spec.tracking.mlflow_uri)
    accounting = Accounting(run.run_token)
    # one thread per chain the pipeline keeps a task of in flight at once (flows/pipeline.py)
    threads = len(the_plan.generates) + len(the_plan.retrieves) + len(the_plan.filters) + 1
    try:
        store_run(prepared, retrievers)
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="ragledger-stage") as pool:
            # the recall curve's plot (matplotlib) waits for the recorder, as Prefect and MLflow do
            done = execute(the_plan, questions, run, base_url, accounting, clock, plain_tasks(pool), is_kept,
                           recall_curve=False)
        summary = record_run(done, run, accounting, clock, tracking_uri, logged_after, compact=False)
    except Exception as exc:  # out of space anywhere under the store: one StoreFullError naming the file
        full = as_store_full(exc, store_root)
        if full is None:
            raise
        raise full from None
    return asdict(summary)


def _calls_first(spec: ExperimentSpec, base_url: str | None, planned: PreparedRun) -> bool:
    """Whether a rerun will call an endpoint that is up already (flows/head_start.py `up_already`) for a generate
    stage no earlier run ran (a first run's call process is started with the command: flows/launch.py)."""
    from flows.head_start import up_already

    if up_already(spec, base_url) is None:
        return False
    return not all(is_kept(planned.run, g) for rounds in planned.plan.generates.values() for g in rounds)


def logged_after(store_root: str, manifest: str, record: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """The manifest written with its logging pending (tracking/mlflow/sync.py): the recorder logs it."""
    from tracking.mlflow.sync import leave_pending

    leave_pending(store_root, Path(manifest), record, tracking_uri)
    return {"pending": RECORDED_AFTER, "synced": []}
