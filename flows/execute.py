"""The story of a run, top to bottom: prepare (questions stored, indexes open, the plan of flows/plan.py), execute
(seed 001's closed-book filter when asked, then retrieve -> generate rounds -> vote -> evaluate over shards of
questions, flows/executor.py), record (metrics per cell, the run manifest, one parent MLflow run with a nested run per
cell, flows/recording.py), on the task runner the spec asks for (flows/runners.py).

The plan holds every key and dependency; the flow only submits, collects and records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from prefect import flow

from core.datasets import Question
from core.diskfull import as_store_full
from flows.endpoint import model_endpoint
from flows.executor import EndpointUse, Executed, PlanExecution
from flows.head_start import HeadStart
from flows.pipeline import Pipeline
from flows.plan import FLOW_VERSION, PIPELINE_STAGES, ExperimentPlan, plan
from flows.prepare import plan_run, store_run
from flows.recording import record_run
from flows.run_summary import Accounting, StageClock
from flows.runners import task_processes, task_progress, task_runner_for, without_default_heartbeats
from schemas.spec import ExperimentSpec
from tasks.closed_book_filter import answered_closed_book
from tasks.prefect_tasks import closed_book_filter_task
from tasks.stages import RunContext, StageResult
from tracking.mlflow.log import preload as preload_mlflow
from tracking.mlflow.log import resolve_tracking_uri
from tracking.store.events import EventStore


def closed_book_filter(the_plan: ExperimentPlan, run: RunContext, use: EndpointUse,
                       accounting: Accounting) -> tuple[set[str], list[str]]:
    """Seed 001's closed-book filter, one task per shard of the sampled questions: the questions it drops (answered
    correctly with no context) and its generation segments."""
    urls = [use.url_for(f) for f in the_plan.filters]
    filtered: dict[int, StageResult] = {}
    pipeline = Pipeline(on_result=accounting.add)
    for i, (stage, url) in enumerate(zip(the_plan.filters, urls, strict=True)):
        pipeline.submit("closed-book filter", closed_book_filter_task, {"run": run, "stage": stage, "base_url": url},
                        partial(filtered.__setitem__, i))
    pipeline.run()
    segments = [filtered[i].segment for i in range(len(urls)) if filtered[i].segment]
    store = EventStore(run.store_root)
    correct = answered_closed_book(store.read("questions", paths=[run.questions_segment]),
                                   store.read("generations", paths=segments))
    return correct, segments


def execute(the_plan: ExperimentPlan, questions: list[Question], run: RunContext, base_url: str | None,
            accounting: Accounting, clock: StageClock, meanwhile: Callable[[], Any] | None = None) -> Executed:
    """The stage tasks, inside the model endpoint's block: it closes the endpoint after generation, or with the error
    that ends the run before (an enclosing sweep's shared endpoint stays up: the sweep closes it)."""
    with model_endpoint(the_plan.spec, base_url) as endpoint, task_progress(run.run_token):
        evaluated_before = endpoint.prompt_tokens_evaluated() or 0  # a sweep's shared server counts from its start
        use = EndpointUse(endpoint)
        filter_segments: list[str] = []
        if the_plan.filters:
            dropped, filter_segments = closed_book_filter(the_plan, run, use, accounting)
            the_plan = plan(the_plan.spec, questions, store_root=the_plan.store_root, questions_segment=run.questions_segment,
                            corpus_hash=the_plan.corpus_hash, closed_book_dropped=dropped)
        execution = PlanExecution(the_plan, run, use, accounting, meanwhile)
        clock.lap("prepare")  # includes the closed-book filter and, when a call must be made, the endpoint's start
        execution.run_all()
        clock.seconds.update(execution.pipeline.stage_spans(list(PIPELINE_STAGES)))
        evaluated = endpoint.prompt_tokens_evaluated()
    return Executed(the_plan, execution, filter_segments, None if evaluated is None else evaluated - evaluated_before)


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
    done = execute(the_plan, questions, run, base_url, accounting, clock, partial(preload_mlflow, tracking_uri))
    return asdict(record_run(done, run, accounting, clock, tracking_uri))


def run_experiment(spec: ExperimentSpec | dict, store_root: str, base_url: str | None = None, tracking_uri: str | None = None,
                   runner: str | None = None, workers: int | None = None, scheduler_address: str | None = None,
                   head_start: HeadStart | None = None) -> dict:
    """Run the flow with the runner the spec asks for, unless runner/workers/scheduler_address override it. A spec
    given as a dict (a test, a deployment's parameters) is parsed here, once. `head_start`: the run's, if begun."""
    spec = spec if isinstance(spec, ExperimentSpec) else ExperimentSpec.model_validate(spec)
    execution = spec.execution
    scheduler_address = scheduler_address or execution.scheduler_address
    task_runner = task_runner_for(runner or execution.runner, workers or execution.workers, scheduler_address)
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
