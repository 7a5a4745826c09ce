"""The experiment flow: runs an ExperimentPlan (flows/plan.py): retrieve -> generate rounds -> vote -> evaluate over
shards of questions, then cell metrics, the run manifest and one parent MLflow run with a nested run per cell.

The plan holds every key and dependency; this module only submits, collects and records. Tasks run as a pipeline
(flows/pipeline.py): each is submitted when its upstream result is in, so early shards vote and evaluate while later
shards still generate.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.results import get_result_store
from prefect.runtime import flow_run

from flows import warmup
from flows.endpoint import ModelEndpoint, model_endpoint
from flows.pipeline import Pipeline
from flows.plan import FLOW_VERSION, PIPELINE_STAGES, ExperimentPlan, plan, question_rows
from flows.tasks import closed_book_filter_task, evaluate_task, generate_round_task, retrieve_task, vote_task
from ragledger import progress
from ragledger.cell import Cell
from ragledger.datasets import Question
from ragledger.paths import StoreLayout
from schemas.spec import ExperimentSpec
from tasks.closed_book_filter import answered_closed_book
from tasks.context import corpus_for, retriever_for
from tasks.evaluate import embed_gold_answers
from tasks.retrievers import parse_retriever
from tasks.stages import RetrieveStage, RunContext, Stage, StageResult
from tracking.diskfull import as_store_full, reported_as_store_full
from tracking.events import EventStore, new_events, stable_hash, temp_path
from tracking.metrics import METRICS_VERSION, cached_cell_metrics, cell_metrics
from tracking.mlflow_log import preload as preload_mlflow
from tracking.mlflow_log import resolve_tracking_uri, safe_spec
from tracking.mlflow_sync import MlflowLoggingPending, publish, sync
from tracking.readers_table import readers_table, write_readers_table

log = logging.getLogger(__name__)

COUNTERS = ("llm_calls", "cache_hits", "retries", "tokens_in")


@dataclass
class RunSummary:
    experiment: str
    spec_hash: str
    questions: int  # the questions the cells ran on (after the closed-book filter, when the spec asks for it)
    questions_sampled: int = 0  # the questions sampled from the dataset
    closed_book_dropped: int | None = None  # seed 001's filter: answered correctly closed book, so dropped (None: off)
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    llm_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens_sent: int = 0  # prompt tokens of the calls this run made (their usage.prompt_tokens)
    # of those, what the embedded server evaluated by its own count (it reuses the previous prompt's prefix from its
    # KV cache); None for other backends
    prompt_tokens_evaluated: int | None = None
    tasks_total: int = 0
    tasks_from_cache: int = 0
    task_processes: int = 0  # distinct processes that ran this run's stage tasks (1 = threads; >1 = Dask workers)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage: where the run's time went
    wall_time_s: float = 0.0
    mlflow_parent_run_id: str | None = None
    mlflow_cell_run_ids: dict[str, str] = field(default_factory=dict)
    tracking_uri: str = ""
    mlflow_experiment_id: str | None = None
    manifest: str | None = None
    mlflow_pending: str | None = None  # MLflow did not take the logging: why, and that `ragledger sync` will log it
    mlflow_synced: list[str] = field(default_factory=list)  # earlier pending executions this run logged to MLflow
    flow_run_id: str | None = None
    root_flow_run_id: str | None = None  # the scheduled parent flow run, when run as a subflow


@dataclass
class Accounting:
    """What this run's stage tasks did: a result from another run's token came from the cache; the counters of
    the tasks that ran add up to the run's model calls."""

    run_token: str
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    tasks_total: int = 0
    tasks_cached: int = 0
    pids: set[int] = field(default_factory=set)

    def add(self, stage: str, result: StageResult) -> None:
        self.tasks_total += 1
        if result.run_token != self.run_token:
            self.tasks_cached += 1
            return
        self.pids.add(result.pid)
        for k in self.counters:
            self.counters[k] += result.counters.get(k, 0)

    def add_with_progress(self, stage: str, result: StageResult) -> None:
        self.add(stage, result)
        progress.advance(stage, 1)

    def fill(self, summary: RunSummary) -> None:
        summary.llm_calls, summary.cache_hits = self.counters["llm_calls"], self.counters["cache_hits"]
        summary.retries, summary.prompt_tokens_sent = self.counters["retries"], self.counters["tokens_in"]
        summary.tasks_total, summary.tasks_from_cache = self.tasks_total, self.tasks_cached
        summary.task_processes = len(self.pids)


class StageClock:
    """Wall time per stage of the flow, each from the end of the one before."""

    def __init__(self, started: float | None = None) -> None:
        """`started`: when the run's work began, if before the flow (flows/warmup.py): reported as "start-up"."""
        self._last = time.perf_counter()
        self.started = started or self._last
        self.seconds: dict[str, float] = {"start-up": round(self._last - started, 2)} if started else {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 2)
        self._last = now

    def restart(self) -> None:
        self._last = time.perf_counter()

    def total(self) -> float:
        return round(time.perf_counter() - self.started, 2)


class EndpointUse:
    """When the model endpoint starts: at most once, and only when a task that calls the model must run (compress
    and parametric retrievers call it during retrieval, readers during generation). A task whose result is
    persisted makes no call and gets the URL without a start."""

    def __init__(self, endpoint: ModelEndpoint) -> None:
        self.endpoint = endpoint
        # look up stage results as the tasks themselves do: the flow's own result store never finds them (Prefect
        # 3.8 gives a flow's store a null metadata store, so its exists() is always False)
        self._results = get_result_store().update_for_task(generate_round_task)

    def reusable(self, stage: Stage) -> bool:
        """A persisted stage result whose segment is still in the store: that task will not run (a vanished
        segment makes the pipeline re-run it, and it may need the model)."""
        try:
            return self._results.read(stage.key).result.segment_exists()
        except Exception:  # nothing persisted under this key (or unreadable): the task runs
            return False

    def url_for(self, *stages: Stage) -> str:
        """The URL for these tasks: the endpoint's, started now, if any of them calls the model and must run."""
        if any(s.calls_model and not self.reusable(s) for s in stages):
            return self.endpoint.url()
        return self.endpoint.known_url()


class PlanExecution:
    """Submits the plan's pipeline stages as their upstream results come in, and keeps the results. The
    continuations run in the flow's thread (flows/pipeline.py), so the dicts need no locks."""

    def __init__(self, the_plan: ExperimentPlan, run: RunContext, use: EndpointUse, accounting: Accounting,
                 meanwhile: Callable[[], Any] | None = None) -> None:
        self.plan, self.run, self.use = the_plan, run, use
        # background work once the first generate task is done, i.e. while later calls are in flight (importing
        # MLflow for the logging at the end): started with the flow, it held the GIL while the first shard's
        # retrieval was being stored and its calls planned, delaying the first model call by seconds
        self._meanwhile = meanwhile
        self.pipeline = Pipeline(on_result=accounting.add_with_progress)
        self.retrieved: dict[tuple[str, str], StageResult] = {}
        self.generations: dict[tuple[Cell, str], list[StageResult]] = {k: [] for k in the_plan.generates}
        self.votes: dict[tuple[Cell, str], StageResult] = {}
        self.evals: dict[tuple[Cell, str], StageResult] = {}
        self.recall_curve: concurrent.futures.Future | None = None
        self._answers_embedded: set[str] = set()  # shards whose gold answers were embedded ahead of evaluation
        self._background = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragledger-analysis")
        # the endpoint starts here (before the pipeline) if some retrieve or generate task must call the model
        self.retrieve_urls = {s.key: use.url_for(s) for s in the_plan.retrieves.values()}
        self.generate_url = use.url_for(*(g for rounds in the_plan.generates.values() for g in rounds))

    def run_all(self) -> None:
        warmup.stop()  # the schedule is the flow's from here: the warm-up claims no further shard
        for stage, total in self.plan.stage_totals().items():
            progress.set_total(stage, total)
        for stage in self.plan.first_retrievals():
            self.retrieve(stage)
        try:
            self.pipeline.run()
        finally:
            self._background.shutdown(wait=True)

    def retrieve(self, stage: RetrieveStage) -> None:
        params = {"run": self.run, "stage": stage, "base_url": self.retrieve_urls[stage.key]}
        self.pipeline.submit("retrieve", retrieve_task, params, partial(self._retrieved, stage))

    def _retrieved(self, stage: RetrieveStage, result: StageResult) -> None:
        sid = self.shard_of(stage)
        self.retrieved[(stage.retriever, sid)] = result
        for cell in self.plan.cells_of(stage.retriever):
            self.generate(cell, sid, 1)
        # while the shard's calls are in flight, not after its last answer; not for evaluations Prefect has persisted
        if sid not in self._answers_embedded and not all(self.use.reusable(self.plan.evaluates[(cell, sid)])
                                                         for cell in self.plan.cells_of(stage.retriever)):
            self._answers_embedded.add(sid)
            self._background.submit(self._embed_gold_answers, stage.qids)
        if len(self.retrieved) == len(self.plan.retrieves):  # the recall curve needs only retrievals: drawn meanwhile
            self.recall_curve = self._background.submit(self.recall_curve_files)
        for later in self.plan.retrievals_after(stage):
            self.retrieve(later)

    def _embed_gold_answers(self, qids: tuple[str, ...]) -> None:
        try:
            embed_gold_answers(self.run.questions(self.run.store(), qids))
        except Exception as exc:  # the shard's evaluation embeds them itself and reports what fails
            log.debug("gold answers not embedded ahead: %s", exc)

    def generate(self, cell: Cell, sid: str, round_no: int) -> None:
        stage = self.plan.generates[(cell, sid)][round_no - 1]
        params = {"run": self.run, "stage": stage, "base_url": self.generate_url,
                  "retrieval_segments": [self.retrieved[(cell.retriever, sid)].segment],
                  "previous_segments": [g.segment for g in self.generations[(cell, sid)]],
                  "logprobs_base_url": self.use.endpoint.logprobs_url()}
        self.pipeline.submit("generate", generate_round_task, params, partial(self._generated, cell, sid, round_no))

    def _generated(self, cell: Cell, sid: str, round_no: int, result: StageResult) -> None:
        if self._meanwhile is not None:
            self._background.submit(self._meanwhile)
            self._meanwhile = None
        self.generations[(cell, sid)].append(result)
        if round_no == len(self.plan.generates[(cell, sid)]):
            self.vote(cell, sid)
        else:
            self.generate(cell, sid, round_no + 1)

    def _upstream(self, cell: Cell, sid: str) -> dict[str, Any]:
        return {"run": self.run, "retrieval_segments": [self.retrieved[(cell.retriever, sid)].segment],
                "generation_segments": [g.segment for g in self.generations[(cell, sid)]]}

    def vote(self, cell: Cell, sid: str) -> None:
        params = {**self._upstream(cell, sid), "stage": self.plan.votes[(cell, sid)]}
        self.pipeline.submit("vote", vote_task, params, partial(self._voted, cell, sid))

    def _voted(self, cell: Cell, sid: str, result: StageResult) -> None:
        self.votes[(cell, sid)] = result
        params = {**self._upstream(cell, sid), "stage": self.plan.evaluates[(cell, sid)], "vote_segment": result.segment}
        self.pipeline.submit("evaluate", evaluate_task, params, partial(self.evals.__setitem__, (cell, sid)))

    def shard_of(self, stage: RetrieveStage) -> str:
        return next(s.id for s in self.plan.shards if s.qids == stage.qids)

    def recall_curve_files(self) -> list[str]:
        """Recall@k per retriever over this run's retrievals (a projection named by their segments)."""
        p = self.plan
        by_retriever = {r: [self.retrieved[(r, s.id)].segment for s in p.shards] for r in p.spec.retrievers}
        out_dir = StoreLayout.of(p.store_root).recall_curve_dir(p.spec.name,
                                                                stable_hash(by_retriever, p.questions_segment, length=12))
        store = EventStore(p.store_root)
        return recall_curve_files(store, store.read("questions", paths=[p.questions_segment]), by_retriever, out_dir)

    def cell_segments(self, cell: Cell) -> dict[str, list[str]]:
        """The segments of one cell's records, in shard and round order (None: an empty shard)."""
        shards = [s.id for s in self.plan.shards]
        segs = {
            "retrievals": [self.retrieved[(cell.retriever, sid)].segment for sid in shards],
            "generations": [g.segment for sid in shards for g in self.generations[(cell, sid)]],
            "votes": [self.votes[(cell, sid)].segment for sid in shards],
            "outcomes": [self.evals[(cell, sid)].segment for sid in shards],
        }
        return {k: [s for s in v if s] for k, v in segs.items()}


@task(name="log-to-mlflow")
def log_to_mlflow(store_root: str, manifest: str, record: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """Write the run manifest and log the execution to MLflow from it, exactly once (tracking/mlflow_sync.py). MLflow
    down (before or during the logging) leaves the execution pending, not the run failed: the store has every event.
    Logged, it then logs the store's other pending executions for this tracking URI (a previous run's)."""
    try:
        record = publish(store_root, Path(manifest), record, tracking_uri)
    except MlflowLoggingPending as exc:
        return {"pending": str(exc), "synced": []}
    synced = sync(store_root, tracking_uri, only_uri=tracking_uri)
    s = record["summary"]
    return {"parent": s["mlflow_parent_run_id"], "cells": s["mlflow_cell_run_ids"], "experiment_id": s["mlflow_experiment_id"],
            "pending": None, "synced": [e["execution"] for e in synced.logged]}


def recall_curve_files(store: EventStore, questions_df, segments: dict[str, list[str | None]], out_dir: Path) -> list[str]:
    """Recall@k for every k up to the deepest rank, per retriever: a PNG plot and the CSV behind it.
    A projection of immutable segments: computed once per set of segments (out_dir is named by them)."""
    from tracking.recall_curve import plot_recall_curve, recall_at_k_curve

    files = [out_dir / "recall_at_k.csv", out_dir / "recall_at_k.png"]
    if all(f.exists() for f in files):
        return [str(f) for f in files]
    paths = [s for segs in segments.values() for s in segs if s]
    retrievals = store.read("retrievals", paths=paths)
    if retrievals.empty:
        return []
    curve = recall_at_k_curve(retrievals, questions_df, list(segments))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out_dir)  # written aside, then renamed: a killed run leaves no half file
    try:
        with reported_as_store_full(out_dir):
            curve.to_csv(tmp.with_suffix(".csv"), index=False)
            plot_recall_curve(curve, tmp.with_suffix(".png"))
            for f in files:
                tmp.with_suffix(f.suffix).replace(f)
    except BaseException:  # e.g. out of space: no temp file left behind for `store verify` to flag
        for f in files:
            tmp.with_suffix(f.suffix).unlink(missing_ok=True)
        raise
    return [str(f) for f in files]


def prepare_run(spec: ExperimentSpec, spec_dict: dict, store_root: str) -> tuple[ExperimentPlan, RunContext, list[Question]]:
    """Questions loaded, sampled (seeded) and stored once; indexes built or opened before shards fan out; the plan."""
    store = EventStore(store_root)
    store.remove_abandoned_temp_files()
    run_token = uuid.uuid4().hex
    questions = spec.dataset.sampled_questions()
    q_segment = str(store.write("questions", new_events("questions", spec.name, question_rows(spec, questions))))
    needs_corpus = any(parse_retriever(r).needs_corpus for r in spec.retrievers)
    the_plan = plan(spec, questions, store_root=store_root, questions_segment=q_segment,
                    corpus_hash=corpus_for(spec).corpus_hash if needs_corpus else "")
    for r in spec.retrievers:
        retriever_for(spec, r, store_root)
    return the_plan, RunContext(spec_dict, store_root, q_segment, run_token), questions


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


@dataclass
class Executed:
    """What the endpoint block hands on to the recording: the plan as run and its results."""

    plan: ExperimentPlan
    execution: PlanExecution
    filter_segments: list[str]
    prompt_tokens_evaluated: int | None


def execute(the_plan: ExperimentPlan, questions: list[Question], run: RunContext, base_url: str | None,
            accounting: Accounting, clock: StageClock, meanwhile: Callable[[], Any] | None = None) -> Executed:
    """The stage tasks, inside the model endpoint's block: it closes the endpoint after generation, or with the error
    that ends the run before (an enclosing sweep's shared endpoint stays up: the sweep closes it)."""
    with model_endpoint(the_plan.spec, base_url) as endpoint:
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


def cell_summaries(done: Executed) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, list[str]]]]:
    """Metrics per cell (a projection of its segments) and the segments the manifest lists per cell."""
    p = done.plan
    store = EventStore(p.store_root)
    questions_df = store.read("questions", paths=[p.questions_segment])
    metrics_dir = StoreLayout.of(p.store_root).metrics_projection
    cells, segments = {}, {}
    for cell in p.cells:
        segs = done.execution.cell_segments(cell)
        segments[cell.name] = {**segs, "questions": [p.questions_segment]}
        key = stable_hash(METRICS_VERSION, segs["outcomes"], segs["retrievals"], segs["generations"], p.questions_segment)
        cells[cell.name] = cached_cell_metrics(
            metrics_dir, key,
            partial(compute_cell_metrics, store, segs, questions_df))
    return cells, segments


def compute_cell_metrics(store: EventStore, segs: dict[str, list[str]], questions_df) -> dict[str, Any]:
    return cell_metrics(store.read("outcomes", paths=segs["outcomes"]), store.read("retrievals", paths=segs["retrievals"]),
                        questions_df, store.read("generations", paths=segs["generations"]))


@flow(name="ragledger-experiment", version=FLOW_VERSION)
def experiment_flow(spec_dict: dict, store_root: str, tracking_uri: str | None = None, base_url: str | None = None) -> dict:
    clock = StageClock(started=warmup.take_started_at())
    spec = ExperimentSpec.model_validate(spec_dict)
    the_plan, run, questions = prepare_run(spec, spec_dict, store_root)
    tracking_uri = tracking_uri or resolve_tracking_uri(spec.tracking.mlflow_uri)
    accounting = Accounting(run.run_token)
    done = execute(the_plan, questions, run, base_url, accounting, clock, partial(preload_mlflow, tracking_uri))
    clock.restart()  # metrics per cell, from the stored records of this run: closing the endpoint is not a stage
    p = done.plan
    summary = RunSummary(spec.name, spec.spec_hash(), len(p.qids), p.questions_sampled,
                         None if p.closed_book_dropped is None else len(p.closed_book_dropped))
    summary.flow_run_id = str(flow_run.id) if flow_run.id else None
    summary.root_flow_run_id = str(flow_run.root_flow_run_id) if flow_run.root_flow_run_id else None
    summary.cells, cell_segments = cell_summaries(done)
    accounting.fill(summary)
    summary.prompt_tokens_evaluated = done.prompt_tokens_evaluated
    summary.tracking_uri = tracking_uri
    summary.wall_time_s = clock.total()
    execution = done.execution
    analysis_files = execution.recall_curve.result() if execution.recall_curve else execution.recall_curve_files()
    layout = StoreLayout.of(store_root)
    analysis_files += write_readers_table(readers_table(summary.cells),
                                          layout.readers_table_dir(spec.name, stable_hash(summary.cells, length=12)),
                                          f"{spec.name} — {summary.questions} questions")
    clock.lap("metrics")
    summary.stage_seconds = clock.seconds
    # the execution id names the manifest and tags its MLflow runs (written aside and renamed: a full disk or a kill
    # never leaves half a manifest, which latest_execution would refuse)
    manifest = layout.manifest(spec.name, time.strftime("%Y%m%dT%H%M%S"), run.run_token)
    summary.manifest = str(manifest)
    record = {"summary": asdict(summary), "segments": cell_segments, "closed_book_filter_segments": done.filter_segments,
              "spec": safe_spec(spec_dict), "analysis_files": analysis_files, "corpus_hash": p.corpus_hash}
    logged = log_to_mlflow(store_root, str(manifest), record, summary.tracking_uri)
    clock.lap("mlflow")
    summary.mlflow_pending, summary.mlflow_synced = logged["pending"], logged["synced"]
    if not logged["pending"]:
        summary.mlflow_parent_run_id = logged["parent"]
        summary.mlflow_cell_run_ids = logged["cells"]
        summary.mlflow_experiment_id = logged["experiment_id"]
    return asdict(summary)


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
    from tasks.context import PROCESSES_ENV

    # processes: retrieval (JVM, FAISS) and parsing are CPU work; a few threads each for model-call waits. Each
    # worker bounds its own model calls, so it gets 1/workers of model.concurrency (the whole run's bound);
    # workers of an existing scheduler need RAGLEDGER_ENDPOINT_PROCESSES set by whoever starts them
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 4, "processes": True,
                                          "dashboard_address": None, "env": {PROCESSES_ENV: str(workers)}})


def run_experiment(spec_dict: dict, store_root: str, base_url: str | None = None, tracking_uri: str | None = None,
                   runner: str | None = None, workers: int | None = None, scheduler_address: str | None = None) -> dict:
    """Run the flow with the runner the spec asks for, unless runner/workers/scheduler_address override it."""
    execution = ExperimentSpec.model_validate(spec_dict).execution
    scheduler_address = scheduler_address or execution.scheduler_address
    task_runner = task_runner_for(runner or execution.runner, workers or execution.workers, scheduler_address)
    if task_runner is not None and scheduler_address:  # workers that outlive runs: events to this run's server
        from flows.dask_workers import ready_long_lived_workers

        ready_long_lived_workers(scheduler_address)
    flow_fn = experiment_flow if task_runner is None else experiment_flow.with_options(task_runner=task_runner)
    try:
        with without_default_heartbeats():
            return flow_fn(spec_dict, store_root, tracking_uri, base_url)
    except Exception as exc:
        # out of space anywhere under the store (a segment, a projection, the LLM-call cache, even in the model-call
        # process): one StoreFullError naming the file, whichever writer hit it first (tracking/diskfull.py)
        full = as_store_full(exc, store_root)
        if full is None:
            raise
        raise full from None


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
