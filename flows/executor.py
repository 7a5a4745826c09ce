"""The one executor of a plan's stages: submits each stage task as its upstream results come in (flows/pipeline.py),
so early shards vote and evaluate while later shards still generate, and keeps the results; starts the model
endpoint only when a task that calls the model must run."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prefect.results import get_result_store

from core import progress
from core.atomic import temp_path
from core.cell import Cell
from core.diskfull import reported_as_store_full
from core.paths import StoreLayout
from flows.endpoint import ModelEndpoint
from flows.pipeline import Pipeline
from flows.plan import ExperimentPlan
from flows.run_summary import Accounting
from tasks.evaluate import embed_gold_answers
from tasks.prefect_tasks import evaluate_task, generate_round_task, retrieve_task, vote_task
from tasks.stages import GenerateStage, RetrieveStage, RunContext, Stage, StageResult
from tracking.store.events import EventStore, stable_hash

log = logging.getLogger(__name__)


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
        self.pipeline.submit("retrieve", retrieve_task, params, partial(self._retrieved, stage))

    def _retrieved(self, stage: RetrieveStage, result: StageResult) -> None:
        sid = self.plan.shard_of(stage)
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


@dataclass
class Executed:
    """What the endpoint block hands on to the recording: the plan as run and its results."""

    plan: ExperimentPlan
    execution: PlanExecution
    filter_segments: list[str]
    prompt_tokens_evaluated: int | None
