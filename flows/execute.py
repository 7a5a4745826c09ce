"""The story of a run, top to bottom: prepare (questions stored, indexes open, the plan of flows/plan.py), execute
(seed 001's closed-book filter when asked, then retrieve -> generate rounds -> vote -> evaluate over shards of
questions, flows/executor.py), record (metrics per cell, the run manifest, one parent MLflow run with a nested run per
cell, flows/recording.py), on the task runner the spec asks for (flows/runners.py).

The plan holds every key and dependency; the flow only submits, collects and records.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.results import get_result_store
from prefect.runtime import flow_run

from core.diskfull import as_store_full
from flows.executor import StageTasks, execute
from flows.head_start import HeadStart
from flows.plan import FLOW_VERSION
from flows.prepare import plan_run, store_run
from flows.recording import recall_curve_files, record_run
from flows.run_summary import Accounting, StageClock
from flows.runners import task_processes, task_runner_for, without_default_heartbeats
from schemas.spec import ExperimentSpec
from tasks.prefect_tasks import STAGE_TASKS, generate_round_task
from tasks.stage_runs import is_kept
from tasks.stages import RunContext, Stage
from tracking.mlflow.log import preload as preload_mlflow
from tracking.mlflow.log import resolve_tracking_uri
from tracking.mlflow.sync import MlflowLoggingPending, note_recording, publish, recordings_queued, sync
from tracking.store.compaction import compact_experiment
from tracking.store.events import EventStore


@task(name="log-to-mlflow")
def log_to_mlflow(store_root: str, manifest: str, record: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """Write the run manifest and log the execution to MLflow from it, exactly once (tracking/mlflow/sync.py). MLflow
    down (before or during the logging) leaves the execution pending, not the run failed: the store has every event.
    Logged, it then logs the store's other pending executions for this tracking URI (a previous run's)."""
    try:
        record = publish(store_root, Path(manifest), record, tracking_uri)
    except MlflowLoggingPending as exc:
        return {"pending": str(exc), "synced": []}
    synced = sync(store_root, tracking_uri, only_uri=tracking_uri, leave=recordings_queued())
    s = record["summary"]
    return {"parent": s["mlflow_parent_run_id"], "cells": s["mlflow_cell_run_ids"], "experiment_id": s["mlflow_experiment_id"],
            "pending": None, "synced": [e["execution"] for e in synced.logged]}


PREFECT_TASKS = StageTasks(**STAGE_TASKS)


def persisted_or_kept(run: RunContext, stage: Stage) -> bool:
    """Whether a stage's task will not run: a result Prefect persisted, or one the store keeps
    (tasks/stage_runs.py), with its segment still in the store."""
    # Prefect's result store as the tasks themselves see it: the flow's own never finds them (Prefect 3.8 gives a
    # flow's store a null metadata store, so its exists() is always False)
    try:
        if get_result_store().update_for_task(generate_round_task).read(stage.key).result.segment_exists():
            return True
    except Exception:  # nothing persisted under this key (or unreadable)
        pass
    return is_kept(run, stage)


@flow(name="ragledger-experiment", version=FLOW_VERSION)
def experiment_flow(spec: ExperimentSpec, store_root: str, tracking_uri: str | None = None, base_url: str | None = None,
                    head_start: HeadStart | None = None) -> dict:
    """`head_start`: the run begun before Prefect was up (flows/head_start.py); Prefect keeps no copy of it."""
    clock = StageClock(started=head_start.started_at if head_start is not None else None)
    planned = head_start.prepared() if head_start is not None else None  # planned there, or here
    the_plan, run, questions = prepared = planned or plan_run(spec, store_root)
    store_run(prepared)
    run = replace(run, task_processes=task_processes())  # the model-call bound's share of each
    tracking_uri = tracking_uri or resolve_tracking_uri(spec.tracking.mlflow_uri)
    accounting = Accounting(run.run_token)
    done = execute(the_plan, questions, run, base_url, accounting, clock, PREFECT_TASKS, persisted_or_kept,
                   partial(preload_mlflow, tracking_uri))
    return asdict(record_run(done, run, accounting, clock, tracking_uri, log_to_mlflow, flow_run_ids()))


def flow_run_ids() -> tuple[str | None, str | None]:
    """Inside a flow: its flow run's id and its root flow run's."""
    return (str(flow_run.id) if flow_run.id else None,
            str(flow_run.root_flow_run_id) if flow_run.root_flow_run_id else None)


@task(name="log-to-mlflow")
def log_pending_to_mlflow(store_root: str, tracking_uri: str, execution: str) -> list[str]:
    """Log the store's pending executions for this tracking URI (tracking/mlflow/sync.py), `execution` (the one
    recorded) among them, the others whose recording is queued left to it: the executions logged."""
    leave = recordings_queued() - {execution}
    return [e["execution"] for e in sync(store_root, tracking_uri, only_uri=tracking_uri, leave=leave).logged]


def record_in_prefect(spec: ExperimentSpec, store_root: str, manifest: str, give_way: Callable[[], None]) -> list[str]:
    """`recorded_flow`, calling `give_way` before each task it submits and before each later step: the recorder's
    (ragledger/recorder.py), which waits there while runs work. Not one of the flow's parameters: Prefect records
    those."""
    token = _give_way.set(give_way)
    try:
        return recorded_flow(spec, store_root, manifest)
    finally:
        _give_way.reset(token)


_give_way: ContextVar[Callable[[], None]] = ContextVar("give_way", default=lambda: None)


@flow(name="ragledger-experiment", version=FLOW_VERSION)
def recorded_flow(spec: ExperimentSpec, store_root: str, manifest: str) -> list[str]:
    """The flow run of a run made without Prefect (flows/direct.py), recorded after it (ragledger/recorder.py): the
    same plan's stage tasks, each answered by the result the store keeps under its key (a task whose result is gone
    runs, as in any flow), then its recall curve drawn, the execution's MLflow logging, with this flow run and the
    recall curve noted on its manifest, and the experiment's segments compacted."""
    give_way = _give_way.get()
    tasks = StageTasks(**{name: _GivingWay(task, give_way) for name, task in STAGE_TASKS.items()})
    the_plan, run, questions = plan_run(spec, store_root)
    accounting = Accounting(run.run_token)
    done = execute(the_plan, questions, run, None, accounting, StageClock(), tasks, persisted_or_kept)
    give_way()
    note_recording(store_root, Path(manifest), flow_run_ids(), recall_curve_files(done.execution))
    logged = log_pending_to_mlflow(store_root, resolve_tracking_uri(spec.tracking.mlflow_uri), Path(manifest).stem)
    if spec.tracking.compact:  # left by the run (flows/direct.py): its segments become one pack per kind
        give_way()
        compact_experiment(EventStore(store_root), spec.name)
    return logged


@dataclass(frozen=True)
class _GivingWay:
    """A stage task (flows/executor.py `StageTasks`) submitted once `give_way` returns."""

    task: Any
    give_way: Callable[[], None]

    def submit(self, **params: Any) -> Any:
        self.give_way()
        return self.task.submit(**params)

    def with_options(self, **options: Any) -> _GivingWay:
        return _GivingWay(self.task.with_options(**options), self.give_way)


def run_experiment(spec: ExperimentSpec | dict, store_root: str, base_url: str | None = None, tracking_uri: str | None = None,
                   runner: str | None = None, workers: int | None = None, scheduler_address: str | None = None,
                   head_start: HeadStart | None = None) -> dict:
    """Run the flow with the runner the spec asks for, unless runner/workers/scheduler_address override it. A spec
    given as a dict (a test, a deployment's parameters) is parsed here, once. `head_start`: the run's, if begun."""
    spec = spec if isinstance(spec, ExperimentSpec) else ExperimentSpec.model_validate(spec)
    execution = spec.execution
    scheduler_address = scheduler_address or execution.scheduler_address
    task_runner = task_runner_for(execution.runner_taken(runner), workers or execution.workers, scheduler_address)
    if task_runner is not None and scheduler_address:  # workers that outlive runs: events to this run's server
        from flows.dask_workers import ready_long_lived_workers

        ready_long_lived_workers(scheduler_address)
    flow_fn = experiment_flow if task_runner is None else experiment_flow.with_options(task_runner=task_runner)
    try:
        with without_default_heartbeats():
            return flow_fn(spec, store_root, tracking_uri, base_url, head_start)
    except Exception as exc:
        # out of space anywhere under the store (a segment, a projection, the LLM-call cache, even in the model-call
        # process): one StoreFullError naming the file, whichever writer hit it first (core/diskfull.py)
        full = as_store_full(exc, store_root)
        if full is None:
            raise
        raise full from None
