"""The one executor of a plan's stages: submits each stage task as its upstream results come in (flows/pipeline.py),
so early shards vote and evaluate while later shards still generate, and keeps the results; starts the model
endpoint only when a task that calls the model must run. The tasks are given: Prefect's (flows/execute.py) or the
stage bodies on a plain thread pool (flows/direct.py); nothing here imports Prefect."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from core import progress
from core.atomic import temp_path
from core.cell import Cell
from core.datasets import Question
from core.diskfull import reported_as_store_full
from core.paths import StoreLayout
from flows.endpoint import ModelEndpoint, model_endpoint
from flows.pipeline import Pipeline
from flows.plan import PIPELINE_STAGES, ExperimentPlan, plan
from flows.run_summary import Accounting, StageClock
from flows.runners import task_progress
from tasks.closed_book_filter import answered_closed_book
from tasks.evaluate import embed_gold_answers
from tasks.stages import GenerateStage, RetrieveStage, RunContext, Stage, StageResult
from tracking.store.events import EventStore, stable_hash

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageTasks:
    """The task of each stage, as the runner submits it: `submit(**params)` gives a future with
    `add_done_callback`, and `with_options(refresh_cache=True)` the task that ignores a cached result
    (flows/pipeline.py)."""

    closed_book_filter: Any
    retrieve: Any
    generate_round: Any
    vote: Any
    evaluate: Any


class EndpointUse:
    """When the model endpoint starts: at most once, and only when a task that calls the model must run (compress
    and parametric retrievers call it during retrieval, readers during generation). A task whose result is
    cached makes no call and gets the URL without a start. `reusable`: whether a stage's result is cached with
    its segment still in the store (that task will not run: a vanished segment makes the pipeline re-run it, and
    it may need the model)."""

    def __init__(self, endpoint: ModelEndpoint, reusable: Callable[[Stage], bool]) -> None:
        self.endpoint = endpoint
        self.reusable = reusable

    def url_for(self, *stages: Stage) -> str:
        """The URL for these tasks: the endpoint's, started now, if any of them calls the model and must run."""
        if any(s.calls_model and not self.reusable(s) for s in stages):
            return self.endpoint.url()
        return self.endpoint.known_url()


class PlanExecution:
    """Submits the plan's pipeline stages as their upstream results come in, and keeps the results. The
    continuations run in the flow's thread (flows/pipeline.py), so the dicts need no locks."""

    def __init__(self, the_plan: ExperimentPlan, run: RunContext, use: EndpointUse, accounting: Accounting,
                 tasks: StageTasks, meanwhile: Callable[[], Any] | None = None, recall_curve: bool = True) -> None:
        self.plan, self.run, self.use, self.tasks = the_plan, run, use, tasks
        # the recall curve drawn once every retrieval is in (False: by whoever records the run, flows/direct.py)
        self.draws_recall_curve = recall_curve
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
        if self.run.head_start is not None:  # the schedule is the flow's from here: its head start claims no further stage
            self.run.head_start.stop()
        for stage, total in self.plan.stage_totals().items():
            progress.set_total(stage, total, timed=False)  # tasks run side by side: no time left from their count
        progress.forecast(GenerateStage.calls_progress, self.plan.call_parts())  # the time left is the calls'
        for stage in self.plan.first_retrievals():
            self.retrieve(stage)
        try:
            self.pipeline.run()
        finally:
            self._background.shutdown(wait=True)

    def retrieve(self, stage: RetrieveStage) -> None:
        params = {"run": self.run, "stage": stage, "base_url": self.retrieve_urls[stage.key]}
        self.pipeline.submit("retrieve", self.tasks.retrieve, params, partial(self._retrieved, stage))

    def _retrieved(self, stage: RetrieveStage, result: StageResult) -> None:
        sid = self.plan.shard_of(stage)
        self.retrieved[(stage.retriever, sid)] = result
        for cell in self.plan.cells_of(stage.retriever):
            self.generate(cell, sid, 1)
        # while the shard's calls are in flight, not after its last answer; not for evaluations already cached
        if sid not in self._answers_embedded and not all(self.use.reusable(self.plan.evaluates[(cell, sid)])
                                                         for cell in self.plan.cells_of(stage.retriever)):
            self._answers_embedded.add(sid)
            self._background.submit(self._embed_gold_answers, stage.qids)
        if self.draws_recall_curve and len(self.retrieved) == len(self.plan.retrieves):  # needs only retrievals
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
        self.pipeline.submit("generate", self.tasks.generate_round, params, partial(self._generated, cell, sid, round_no))

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
        self.pipeline.submit("vote", self.tasks.vote, params, partial(self._voted, cell, sid))

    def _voted(self, cell: Cell, sid: str, result: StageResult) -> None:
        self.votes[(cell, sid)] = result
        params = {**self._upstream(cell, sid), "stage": self.plan.evaluates[(cell, sid)], "vote_segment": result.segment}
        self.pipeline.submit("evaluate", self.tasks.evaluate, params, partial(self.evals.__setitem__, (cell, sid)))

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


def recall_curve_files(store: EventStore, questions_df, segments: dict[str, list[str | None]], out_dir: Path) -> list[str]:
    """Recall@k for every k up to the deepest rank, per retriever: a PNG plot and the CSV behind it.
    A projection of immutable segments: computed once per set of segments (out_dir is named by them)."""
    from tracking.analysis.recall_curve import plot_recall_curve, recall_at_k_curve

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


def closed_book_filter(the_plan: ExperimentPlan, run: RunContext, use: EndpointUse, accounting: Accounting,
                       tasks: StageTasks) -> tuple[set[str], list[str]]:
    """Seed 001's closed-book filter, one task per shard of the sampled questions: the questions it drops (answered
    correctly with no context) and its generation segments."""
    urls = [use.url_for(f) for f in the_plan.filters]
    filtered: dict[int, StageResult] = {}
    pipeline = Pipeline(on_result=accounting.add)
    for i, (stage, url) in enumerate(zip(the_plan.filters, urls, strict=True)):
        pipeline.submit("closed-book filter", tasks.closed_book_filter, {"run": run, "stage": stage, "base_url": url},
                        partial(filtered.__setitem__, i))
    pipeline.run()
    segments = [filtered[i].segment for i in range(len(urls)) if filtered[i].segment]
    store = EventStore(run.store_root)
    correct = answered_closed_book(store.read("questions", paths=[run.questions_segment]),
                                   store.read("generations", paths=segments))
    return correct, segments


def execute(the_plan: ExperimentPlan, questions: list[Question], run: RunContext, base_url: str | None,
            accounting: Accounting, clock: StageClock, tasks: StageTasks, reusable: Callable[[RunContext, Stage], bool],
            meanwhile: Callable[[], Any] | None = None, recall_curve: bool = True) -> Executed:
    """The stage tasks, inside the model endpoint's block: it closes the endpoint after generation, or with the error
    that ends the run before (an enclosing sweep's shared endpoint stays up: the sweep closes it). `reusable`: whether
    a stage's task will not run, its result cached. `recall_curve`: drawn meanwhile (else left to the recording)."""
    with model_endpoint(the_plan.spec, base_url) as endpoint, task_progress(run.run_token):
        evaluated_before = endpoint.prompt_tokens_evaluated() or 0  # a sweep's shared server counts from its start
        use = EndpointUse(endpoint, partial(reusable, run))
        filter_segments: list[str] = []
        if the_plan.filters:
            dropped, filter_segments = closed_book_filter(the_plan, run, use, accounting, tasks)
            the_plan = plan(the_plan.spec, questions, store_root=the_plan.store_root, questions_segment=run.questions_segment,
                            corpus_hash=the_plan.corpus_hash, closed_book_dropped=dropped)
        execution = PlanExecution(the_plan, run, use, accounting, tasks, meanwhile, recall_curve)
        clock.lap("prepare")  # includes the closed-book filter and, when a call must be made, the endpoint's start
        execution.run_all()
        clock.seconds.update(execution.pipeline.stage_spans(list(PIPELINE_STAGES)))
        evaluated = endpoint.prompt_tokens_evaluated()
    return Executed(the_plan, execution, filter_segments, None if evaluated is None else evaluated - evaluated_before)


@dataclass
class Executed:
    """What the endpoint block hands on to the recording: the plan as run and its results."""

    plan: ExperimentPlan
    execution: PlanExecution
    filter_segments: list[str]
    prompt_tokens_evaluated: int | None
