"""The experiment flow: retrieve -> generate rounds -> vote -> evaluate over shards of questions,
then one parent MLflow run with a nested run per cell.

Task granularity is (stage x shard): Prefect costs ~10-20 ms per task run, so per-question tasks
would dominate. Each task's cache key is a hash of small explicit inputs chained from upstream
(spec identity, shard, stage config, code/prompt version), so a changed vote method re-runs only
vote and evaluate, and an identical rerun only reads cached results.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.results import get_result_store
from prefect.runtime import flow_run

from flows.endpoint import model_endpoint
from flows.pipeline import Pipeline
from ragledger import progress
from ragledger.datasets import load_questions, sample_questions
from schemas.spec import ExperimentSpec
from tasks.context import StageResult, backend_identity, cell_name, corpus_for, retriever_for
from tasks.evaluate import EVALUATE_VERSION, evaluate_task
from tasks.generate import generate_round_task
from tasks.readers import get_reader, settings_for
from tasks.retrieve import retrieve_task
from tasks.retrievers import parse_retriever
from tasks.vote import vote_task
from tracking.diskfull import as_store_full, reported_as_store_full
from tracking.events import PROJECTIONS_DIR, EventStore, event_id, new_events, stable_hash, temp_path
from tracking.metrics import METRICS_VERSION, cached_cell_metrics, cell_metrics
from tracking.mlflow_log import resolve_tracking_uri, safe_spec
from tracking.mlflow_sync import MlflowLoggingPending, publish, sync
from tracking.readers_table import readers_table, write_readers_table

FLOW_VERSION = "1"


@dataclass
class CellPlan:
    retriever: str
    strategy: str
    model: str
    rounds: int

    @property
    def name(self) -> str:
        return cell_name(self.retriever, self.strategy, self.model)


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


def shard(qids: list[str], size: int) -> list[list[str]]:
    return [qids[i : i + size] for i in range(0, len(qids), size)]


def question_rows(spec: ExperimentSpec, questions) -> list[dict[str, Any]]:
    ds = spec.dataset.identity()
    return [
        {
            "event_id": event_id("questions", spec.name, ds, q.qid, q.question, q.answers),
            "cell": "",
            "qid": q.qid,
            "dataset": spec.dataset.name,
            "question": q.question,
            "answers": list(q.answers),
            "gold_pids": list(q.gold_pids),
        }
        for q in questions
    ]


def model_identity(spec: ExperimentSpec) -> dict[str, Any]:
    m = spec.model
    ident = backend_identity(spec, m.base_url or "")
    return {"backend": ident, "name": m.name if m.backend == "openai" else m.embedded_model, "temperature": m.temperature,
            "top_p": m.top_p, "max_tokens": m.max_tokens, "seed": m.seed}


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


@flow(name="ragledger-experiment", version=FLOW_VERSION)
def experiment_flow(spec_dict: dict, store_root: str, tracking_uri: str | None = None, base_url: str | None = None) -> dict:
    started = time.perf_counter()
    spec = ExperimentSpec.model_validate(spec_dict)
    store = EventStore(store_root)
    store.remove_abandoned_temp_files()
    run_token = uuid.uuid4().hex
    spec_hash = spec.spec_hash()

    # questions: loaded, sampled (seeded) and stored once
    questions = sample_questions(load_questions(spec.dataset.name, spec.dataset.path), spec.dataset.limit, spec.dataset.seed)
    q_segment = str(store.write("questions", new_events("questions", spec.name, question_rows(spec, questions))))
    qids = [q.qid for q in questions]
    questions_sampled = len(qids)
    dataset_key = stable_hash(spec.name, spec.dataset.identity(), q_segment)

    needs_corpus = any(parse_retriever(r).needs_corpus for r in spec.retrievers)
    corpus_hash = corpus_for(spec).corpus_hash if needs_corpus else ""
    for r in spec.retrievers:  # build or open indexes once, before shards fan out
        retriever_for(spec, r, store_root)

    entries = {e.key: e for e in spec.reader_entries()}  # cell strategy label -> reader name and settings
    cells = [CellPlan(r, k, spec.model.display_name, get_reader(e.name).rounds)
             for r in spec.retrievers for k, e in entries.items()]
    counters = {"llm_calls": 0, "cache_hits": 0, "retries": 0, "tokens_in": 0}
    tasks_total = tasks_cached = 0
    task_pids: set[int] = set()

    def account(results: list[StageResult]) -> None:
        nonlocal tasks_total, tasks_cached
        for r in results:
            tasks_total += 1
            if r.run_token != run_token:
                tasks_cached += 1
            else:
                task_pids.add(r.pid)
                for k in counters:
                    counters[k] += r.counters.get(k, 0)

    # the model endpoint: started at most once, and only when a task that calls the model must run
    # (compress/parametric retrievers call it during retrieval, readers during generation); the block below closes
    # it after generation, or with the error that ends the run before (an enclosing sweep's shared endpoint stays
    # up: the sweep closes it)
    model_key = stable_hash(model_identity(spec))
    # look up stage results as the tasks themselves do: the flow's own result store never finds them (Prefect
    # 3.8 gives a flow's store a null metadata store, so its exists() is always False)
    task_results = get_result_store().update_for_task(generate_round_task)

    def reusable(key: str) -> bool:
        """A persisted stage result whose segment is still in the store: that task will not run (a vanished
        segment makes the pipeline re-run it, and it may need the model)."""
        try:
            return task_results.read(key).result.segment_exists()
        except Exception:  # nothing persisted under this key (or unreadable): the task runs
            return False

    with model_endpoint(spec, base_url) as endpoint:
        evaluated_before = endpoint.prompt_tokens_evaluated() or 0  # a sweep's shared server counts from its start
        # 0. seed 001's closed-book filter: one task per shard of the sampled questions; the rest run on what is left
        closed_book_dropped: int | None = None
        filter_segments: list[str] = []
        if spec.dataset.closed_book_filter:
            from tasks.closed_book_filter import FILTER_VERSION, answered_closed_book, closed_book_filter_task
            from tasks.readers.concatenation import Concatenation

            filter_params = []
            for s in shard(qids, spec.execution.shard_size):
                key = stable_hash("closed-book-filter", FLOW_VERSION, dataset_key, FILTER_VERSION, Concatenation.prompt_version,
                                  model_key, stable_hash("shard", s, length=12))
                url = endpoint.known_url() if reusable(key) else endpoint.url()
                filter_params.append(dict(spec_dict=spec_dict, store_root=store_root, questions_segment=q_segment, base_url=url,
                                          qids=s, stage_key=key, run_token=run_token))
            filtered: dict[int, StageResult] = {}
            filter_run = Pipeline(on_result=lambda stage, result: account([result]))
            for i, p in enumerate(filter_params):
                filter_run.submit("closed-book filter", closed_book_filter_task, p,
                                  lambda result, i=i: filtered.__setitem__(i, result))
            filter_run.run()
            filter_segments = [filtered[i].segment for i in range(len(filter_params)) if filtered[i].segment]
            correct = answered_closed_book(store.read("questions", paths=[q_segment]),
                                           store.read("generations", paths=filter_segments))
            closed_book_dropped = len(correct)
            qids = [q for q in qids if q not in correct]
        shards = shard(qids, spec.execution.shard_size)
        shard_ids = [stable_hash("shard", s, length=12) for s in shards]

        # 1-4. retrieve -> generate rounds -> vote -> evaluate, one task per (stage, cell or retriever, shard, round).
        # Every key is known up front (chained from upstream keys); the tasks run as a pipeline: each is submitted when
        # its upstream result is in, so early shards vote and evaluate while later shards still generate
        retrieve_params = {}
        lone_retrieval: dict[str, bool] = {}  # retriever -> its shards are retrieved one at a time
        for r in spec.retrievers:
            retriever = parse_retriever(r)
            lone_retrieval[r] = not retriever.needs_llm
            code = retriever.code_version
            for sid, s in zip(shard_ids, shards, strict=True):
                key = stable_hash("retrieve", FLOW_VERSION, dataset_key, corpus_hash, r, code, sid,
                                  str(Path(store_root).resolve()), *([model_key] if retriever.needs_llm else []))
                must_call = retriever.needs_llm and not reusable(key)
                url = endpoint.url() if must_call else endpoint.known_url()
                retrieve_params[(r, sid)] = dict(spec_dict=spec_dict, store_root=store_root, questions_segment=q_segment,
                                                retriever_name=r, qids=s, stage_key=key, run_token=run_token, base_url=url)
        gen_keys: dict[tuple[str, str, int], str] = {}
        for c in cells:
            entry = entries[c.strategy]
            reader = get_reader(entry.name)
            settings = () if entry.is_default else (entry.settings_dict(),)  # plain names keep their keys
            version = reader.version_for(settings_for(entry))  # the template version under this entry's settings
            for sid in shard_ids:
                upstream = retrieve_params[(c.retriever, sid)]["stage_key"]
                for rnd in range(1, c.rounds + 1):
                    upstream = stable_hash("generate", upstream, c.strategy, version, model_key, rnd, *settings)
                    gen_keys[(c.name, sid, rnd)] = upstream
        # the endpoint starts only if a generate task must run
        gen_url = endpoint.url() if not all(reusable(k) for k in gen_keys.values()) else endpoint.known_url()
        # prepare includes the closed-book filter and, when a call must be made, the model endpoint's start
        stage_seconds: dict[str, float] = {"prepare": round(time.perf_counter() - started, 2)}

        retrieved: dict[tuple[str, str], StageResult] = {}
        generations: dict[tuple[str, str], list[StageResult]] = {(c.name, sid): [] for c in cells for sid in shard_ids}
        votes: dict[tuple[str, str], StageResult] = {}
        evals: dict[tuple[str, str], StageResult] = {}

        def counted(stage: str, result: StageResult) -> None:
            account([result])
            progress.advance(stage, 1)

        pipeline = Pipeline(on_result=counted)

        def retrieve(r: str, sid: str) -> None:
            def then(result: StageResult) -> None:
                retrieved[(r, sid)] = result
                for c in cells:
                    if c.retriever == r:
                        generate(c, sid, 1)
                if len(retrieved) == len(retrieve_params):  # the recall curve needs only retrievals: drawn meanwhile
                    recall_curve.append(background.submit(recall_curve_for, dict(retrieved)))
                # the model is busy now: the other shards are retrieved beside it, one after another (all at once,
                # their search threads took both cores from the model calls for ~2 s on the P1 benchmark), except
                # for a retriever that calls the model itself, whose shards fill its concurrency together
                i = shard_ids.index(sid)
                if lone_retrieval[r]:
                    if i + 1 < len(shard_ids):
                        retrieve(r, shard_ids[i + 1])
                elif i == 0:
                    for later in shard_ids[1:]:
                        retrieve(r, later)

            pipeline.submit("retrieve", retrieve_task, retrieve_params[(r, sid)], then)

        def generate(c: CellPlan, sid: str, rnd: int) -> None:
            def then(result: StageResult) -> None:
                generations[(c.name, sid)].append(result)
                vote(c, sid) if rnd == c.rounds else generate(c, sid, rnd + 1)

            params = dict(
                spec_dict=spec_dict, store_root=store_root, questions_segment=q_segment, base_url=gen_url,
                retriever_name=c.retriever, strategy=c.strategy, round_no=rnd, qids=shard_qids[sid],
                retrieval_segments=[retrieved[(c.retriever, sid)].segment],
                previous_segments=[g.segment for g in generations[(c.name, sid)]],
                stage_key=gen_keys[(c.name, sid, rnd)], run_token=run_token, logprobs_base_url=endpoint.logprobs_url(),
            )  # fmt: skip
            pipeline.submit("generate", generate_round_task, params, then)

        def vote(c: CellPlan, sid: str) -> None:
            entry = entries[c.strategy]
            key = stable_hash("vote", gen_keys[(c.name, sid, c.rounds)], get_reader(entry.name).vote_version, entry.vote)
            params = dict(
                spec_dict=spec_dict, store_root=store_root, questions_segment=q_segment, retriever_name=c.retriever,
                strategy=c.strategy, qids=shard_qids[sid], retrieval_segments=[retrieved[(c.retriever, sid)].segment],
                generation_segments=[g.segment for g in generations[(c.name, sid)]], stage_key=key, run_token=run_token,
            )  # fmt: skip

            def then(result: StageResult) -> None:
                votes[(c.name, sid)] = result
                evaluate(c, sid, params)

            pipeline.submit("vote", vote_task, params, then)

        def evaluate(c: CellPlan, sid: str, vote_params: dict) -> None:
            params = {**vote_params, "vote_segment": votes[(c.name, sid)].segment,
                      "stage_key": stable_hash("evaluate", vote_params["stage_key"], EVALUATE_VERSION)}
            pipeline.submit("evaluate", evaluate_task, params, lambda result: evals.__setitem__((c.name, sid), result))

        shard_qids = dict(zip(shard_ids, shards, strict=True))
        questions_df = store.read("questions", paths=[q_segment])
        background = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragledger-analysis")
        recall_curve: list[concurrent.futures.Future] = []

        def recall_curve_for(results: dict[tuple[str, str], StageResult]) -> list[str]:
            by_retriever = {r: [results[(r, sid)].segment for sid in shard_ids] for r in spec.retrievers}
            out_dir = Path(store_root) / "runs" / spec.name / f"recall-{stable_hash(by_retriever, q_segment, length=12)}"
            return recall_curve_files(store, questions_df, by_retriever, out_dir)

        pipeline_stages = {"retrieve": len(retrieve_params), "generate": len(gen_keys),
                           "vote": len(cells) * len(shards), "evaluate": len(cells) * len(shards)}
        for stage, total in pipeline_stages.items():
            progress.set_total(stage, total)
        # each retriever's first shard alone, so the model gets work as early as it can (retrieving every shard at
        # once, the first one finished after ~all of them: 1.5 s of an idle model on the P1 benchmark)
        for r in spec.retrievers if shard_ids else []:
            retrieve(r, shard_ids[0])
        try:
            pipeline.run()
        finally:
            background.shutdown(wait=True)
        stage_seconds.update(pipeline.stage_spans(list(pipeline_stages)))
        evaluated = endpoint.prompt_tokens_evaluated()

    # metrics per cell, from the stored records of this run (timed from here: closing the endpoint is not a stage)
    stage_started = time.perf_counter()

    def stage_done(name: str) -> None:
        nonlocal stage_started
        now = time.perf_counter()
        stage_seconds[name] = round(now - stage_started, 2)
        stage_started = now

    summary = RunSummary(spec.name, spec_hash, len(qids), questions_sampled, closed_book_dropped)
    summary.flow_run_id = str(flow_run.id) if flow_run.id else None
    summary.root_flow_run_id = str(flow_run.root_flow_run_id) if flow_run.root_flow_run_id else None
    cell_segments: dict[str, dict[str, list[str]]] = {}
    for c in cells:
        segs = {
            "retrievals": [retrieved[(c.retriever, sid)].segment for sid in shard_ids],
            "generations": [g.segment for sid in shard_ids for g in generations[(c.name, sid)]],
            "votes": [votes[(c.name, sid)].segment for sid in shard_ids],
            "outcomes": [evals[(c.name, sid)].segment for sid in shard_ids],
        }
        segs = {k: [s for s in v if s] for k, v in segs.items()}
        cell_segments[c.name] = {**segs, "questions": [q_segment]}
        summary.cells[c.name] = cached_cell_metrics(
            Path(store_root) / PROJECTIONS_DIR / "metrics",
            stable_hash(METRICS_VERSION, segs["outcomes"], segs["retrievals"], segs["generations"], q_segment),
            lambda segs=segs: cell_metrics(store.read("outcomes", paths=segs["outcomes"]),
                                           store.read("retrievals", paths=segs["retrievals"]), questions_df,
                                           store.read("generations", paths=segs["generations"])))

    summary.llm_calls, summary.cache_hits, summary.retries = counters["llm_calls"], counters["cache_hits"], counters["retries"]
    summary.prompt_tokens_sent = counters["tokens_in"]
    summary.prompt_tokens_evaluated = None if evaluated is None else evaluated - evaluated_before
    summary.tasks_total, summary.tasks_from_cache = tasks_total, tasks_cached
    summary.task_processes = len(task_pids)
    summary.tracking_uri = tracking_uri or resolve_tracking_uri(spec.tracking.mlflow_uri)
    summary.wall_time_s = round(time.perf_counter() - started, 2)
    analysis_files = recall_curve[0].result() if recall_curve else recall_curve_for(retrieved)
    table_dir = Path(store_root) / "runs" / spec.name / f"readers-{stable_hash(summary.cells, length=12)}"
    analysis_files += write_readers_table(readers_table(summary.cells), table_dir,
                                          f"{spec.name} — {summary.questions} questions")
    stage_done("metrics")
    summary.stage_seconds = stage_seconds
    # the execution id names the manifest and tags its MLflow runs (written aside and renamed: a full disk or a kill
    # never leaves half a manifest, which latest_execution would refuse)
    manifest = Path(store_root) / "runs" / spec.name / f"{time.strftime('%Y%m%dT%H%M%S')}-{run_token[:8]}.json"
    summary.manifest = str(manifest)
    record = {"summary": asdict(summary), "segments": cell_segments, "closed_book_filter_segments": filter_segments,
              "spec": safe_spec(spec_dict), "analysis_files": analysis_files}
    logged = log_to_mlflow(store_root, str(manifest), record, summary.tracking_uri)
    stage_done("mlflow")
    summary.mlflow_pending = logged["pending"]
    summary.mlflow_synced = logged["synced"]
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
    task_runner = task_runner_for(runner or execution.runner, workers or execution.workers,
                                  scheduler_address or execution.scheduler_address)
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


@flow(name="ragledger-scheduled", version=FLOW_VERSION)
def scheduled_experiment(spec_dict: dict, store_root: str, tracking_uri: str, runner: str | None = None,
                         workers: int | None = None) -> dict:
    """What a `ragledger schedule` deployment runs: the experiment (or, for a list of datasets, the sweep) as a
    subflow, on the runner asked for (a deployment re-imports its flow by entrypoint, so the task runner is
    chosen here, at run time)."""
    from flows.sweep import run_spec  # flows.sweep imports this module

    return run_spec(spec_dict, store_root, tracking_uri=tracking_uri, runner=runner, workers=workers)
