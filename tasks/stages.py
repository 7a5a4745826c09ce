"""The contract of every stage task: what it is called, its version, its typed inputs and its cache key, in one place.

A stage is a frozen dataclass. Its fields are the task's inputs known before the run (upstream results' segments are
passed beside it, as they exist only once the upstream task finished); `key` hashes the fields that determine its
records, chained from the upstream stage's key, so a changed input re-runs that stage and everything downstream, and
an identical rerun reads every result from the cache. Adding an input is one field here (and its use in `key` when it
changes the records). The key formulas are fixed: existing stores and Prefect's persisted results are found by them
(tests/test_plan_pinning.py pins them).

Nothing here imports Prefect: flows/plan.py builds every stage of a run without it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from core.cell import Cell
from engines.llm_types import endpoint_identity
from schemas.spec import ExperimentSpec
from tracking.store.catalog import segment_exists
from tracking.store.events import EventStore, stable_hash
from tracking.store.mirrored import on_this_mirror

if TYPE_CHECKING:
    from engines.llm import HeadStartCalls

# the flow version the first key of every chain carries (filter, retrieve): bumping it re-runs every stage
KEY_VERSION = "1"
EVALUATE_VERSION = "eval-3"  # eval-3: final-round context, gold_in_retrieval, one-answer pools
FILTER_VERSION = "closed-book-filter-1"
FILTER_RETRIEVER = "none"
FILTER_READER = "closed_book_filter"


@dataclass(frozen=True)
class StageResult:
    """What a stage task returns (and Prefect persists): where its records went, and its counters. Results persisted
    before this module existed name it tasks.context.StageResult, which still resolves (tasks/context.py)."""

    stage: str
    cell: str
    shard: str  # the stage's key
    segment: str | None
    rows: int
    run_token: str  # the run that executed the task; differs from the current run on a cache hit
    counters: dict[str, int]
    pid: int = field(default_factory=os.getpid)  # the process that ran it: the flow's, or a Dask worker's

    def segment_exists(self) -> bool:
        return self.segment is None or segment_exists(self.segment)  # as its own file or compacted into a pack

    def named_under(self, store_root: str) -> StageResult:
        """The result with its segment named as the mirror at `store_root` names it (the run's own process's), not
        as the worker's mirror that wrote it (tracking/store/mirrored.py)."""
        if self.segment is None:
            return self
        return dataclasses.replace(self, segment=str(on_this_mirror(Path(store_root), self.segment)))


def shard_id(qids: Sequence[str]) -> str:
    return stable_hash("shard", list(qids), length=12)


def _stage_model_fields(spec: ExperimentSpec) -> dict[str, Any]:
    """What the stage keys know of the model: the spec's endpoint (not a --base-url given at run time) and sampling."""
    m = spec.model
    return {"backend": endpoint_identity(m, m.base_url or ""),
            "name": m.name if m.backend == "openai" else m.embedded_model, "temperature": m.temperature,
            "top_p": m.top_p, "max_tokens": m.max_tokens, "seed": m.seed}


def model_key(spec: ExperimentSpec) -> str:
    return stable_hash(_stage_model_fields(spec))


class HeadStartView(Protocol):
    """A run's head start as its stage tasks meet it (flows/head_start.py): the retrievals it made before Prefect was
    up, whose records a retrieve task takes instead of retrieving again, and the model calls it sent ahead."""

    head_start_calls: HeadStartCalls

    def take_retrieval(self, stage: RetrieveStage) -> list[dict[str, Any]] | None: ...

    def stop(self) -> None:
        """The flow executes its plan from here: no further stage is taken on ahead."""


@dataclass(frozen=True)
class RunContext:
    """What every task of one run shares: the spec (the typed model, parsed once by whoever started the run; it
    travels to Dask workers pickled), the store, the run's questions segment and the token that tells this run's task
    runs from cached ones."""

    spec: ExperimentSpec
    store_root: str
    questions_segment: str
    run_token: str
    # how many processes run this run's tasks (its Dask workers, counted when its flow starts: flows/runners.py
    # `task_processes`), each making its share of the model calls in flight (engines/concurrency.py)
    task_processes: int = 1
    # the URL of the store when it is at one (its store_root then the run's process's mirror of it): a task on a
    # machine whose mirror lies elsewhere (a Dask worker on another host) works in its own (`on_this_machine`)
    store_url: str | None = None
    # the run's head start (flows/head_start.py), when `ragledger run` began it before Prefect was up; never with Dask
    head_start: HeadStartView | None = field(default=None, compare=False, repr=False)

    @property
    def head_start_calls(self) -> HeadStartCalls | None:
        return self.head_start.head_start_calls if self.head_start is not None else None

    def store(self) -> EventStore:
        return EventStore(self.store_root)

    def on_this_machine(self) -> RunContext:
        """The run as this process reaches its store: itself, or, where this machine's mirror of the store at
        `store_url` is not `store_root` (a Dask worker with a home of its own, on this host or another), rooted at
        that mirror, brought up to date once per run."""
        if self.store_url is None:
            return self
        from tracking.store.remote import mirror_for_run, mirror_root

        if mirror_root(self.store_url) == Path(self.store_root):
            return self
        root = mirror_for_run(self.store_url, self.run_token)
        return dataclasses.replace(self, store_root=str(root),
                                   questions_segment=str(on_this_mirror(root, self.questions_segment)))

    def questions(self, store: EventStore, qids: Sequence[str]):
        """The shard's questions, in shard order, `qid` first."""
        q, row_of = _questions_segment(store, self.questions_segment)
        rows = q.iloc[[row_of[x] for x in qids if x in row_of]]
        return rows[["qid", *(c for c in q.columns if c != "qid")]].reset_index(drop=True)


_segments_lock = threading.Lock()
_segments: dict[tuple[str, str], Any] = {}


def _questions_segment(store: EventStore, segment: str) -> tuple[Any, dict[str, int]]:
    """A run's questions segment and the row of each qid in it, read once per process: every task of the run asks
    for it, and a segment is written once and never changed (named by the hash of its events' ids), so it is read
    whole once and each task takes its shard's rows by position (by value, with `isin` over the segment's arrow
    strings, 3x the time: 2.0 against 0.7 ms for 125 of 2,000 questions)."""
    key = (str(store.root), segment)
    with _segments_lock:
        if key not in _segments:
            if len(_segments) >= 8:
                _segments.pop(next(iter(_segments)))
            q = store.read("questions", paths=[segment])
            _segments[key] = (q, {qid: i for i, qid in enumerate(q["qid"].tolist())})
        return _segments[key]


class Stage:
    """Base of the stage dataclasses: `task_name` names the Prefect task, `stage` the pipeline stage (progress,
    stage_seconds), `key` is the cache key, `cell_label` what its StageResult names."""

    task_name: ClassVar[str]
    stage: ClassVar[str]
    qids: tuple[str, ...]

    @property
    def key(self) -> str:
        raise NotImplementedError

    @property
    def cell_label(self) -> str:
        raise NotImplementedError

    @property
    def result_stage(self) -> str:
        return self.stage

    @property
    def calls_model(self) -> bool:
        """Whether running it (not reading it from the cache) calls the model."""
        return False

    def result(self, run: RunContext, segment: Path | str | None, rows: int, counters: dict[str, int] | None = None):
        """The task's one result type: where its records went, and its counters."""
        return StageResult(self.result_stage, self.cell_label, self.key, str(segment) if segment else None, rows,
                           run.run_token, counters or {})


@dataclass(frozen=True)
class FilterStage(Stage):
    """Seed 001's closed-book filter over one shard of the sampled questions (tasks/closed_book_filter.py)."""

    task_name: ClassVar[str] = "closed-book-filter"
    stage: ClassVar[str] = "closed-book filter"
    version: ClassVar[str] = FILTER_VERSION

    dataset_key: str
    model_key: str
    prompt_version: str  # the Concatenation prompt's (Fig. 7)
    model: str  # the model's display name, for the cell
    qids: tuple[str, ...]

    @cached_property
    def key(self) -> str:
        return stable_hash("closed-book-filter", KEY_VERSION, self.dataset_key, self.version, self.prompt_version,
                           self.model_key, shard_id(self.qids))

    @property
    def cell_label(self) -> str:
        return Cell(FILTER_RETRIEVER, FILTER_READER, self.model).name

    @property
    def calls_model(self) -> bool:
        return True


@dataclass(frozen=True)
class RetrieveStage(Stage):
    task_name: ClassVar[str] = "retrieve"
    stage: ClassVar[str] = "retrieve"

    dataset_key: str
    corpus_hash: str  # "" for a retriever without a corpus
    retriever: str
    code_version: str  # the retriever's
    qids: tuple[str, ...]
    store_root: str  # resolved: the index's place is part of what a result depends on
    model_key: str | None = None  # only a retriever that calls the model (compression, parametric) has one

    @cached_property
    def key(self) -> str:
        return stable_hash("retrieve", KEY_VERSION, self.dataset_key, self.corpus_hash, self.retriever, self.code_version,
                           shard_id(self.qids), self.store_root, *([self.model_key] if self.model_key else []))

    @property
    def cell_label(self) -> str:
        return self.retriever

    @property
    def calls_model(self) -> bool:
        return self.model_key is not None


class CellStage(Stage):
    """A stage of one cell (generate, vote, evaluate): its retriever, reader and label come from the cell."""

    cell: Cell

    @property
    def retriever(self) -> str:
        return self.cell.retriever

    @property
    def reader(self) -> str:
        return self.cell.reader

    @property
    def cell_label(self) -> str:
        return self.cell.name


@dataclass(frozen=True)
class GenerateStage(CellStage):
    """One round of a cell's reader over one shard."""

    task_name: ClassVar[str] = "generate-round"
    stage: ClassVar[str] = "generate"
    calls_progress: ClassVar[str] = "generate calls"  # the core.progress stage its model calls are counted in

    upstream: str  # the retrieve key (round 1) or the previous round's
    cell: Cell
    round_no: int
    prompt_version: str  # the reader's template version under this entry's settings
    model_key: str
    settings: tuple[dict[str, Any], ...]  # () for a plain reader name: such entries keep the keys they had
    qids: tuple[str, ...]

    @cached_property
    def key(self) -> str:
        return stable_hash("generate", self.upstream, self.reader, self.prompt_version, self.model_key, self.round_no,
                           *self.settings)

    @property
    def result_stage(self) -> str:
        return f"generate round {self.round_no}"

    @property
    def calls_model(self) -> bool:
        return True


@dataclass(frozen=True)
class VoteStage(CellStage):
    task_name: ClassVar[str] = "vote"
    stage: ClassVar[str] = "vote"

    upstream: str  # the last generate round's key
    cell: Cell
    vote_version: str  # the reader's decision rule
    vote: str  # the entry's vote setting
    qids: tuple[str, ...]

    @cached_property
    def key(self) -> str:
        return stable_hash("vote", self.upstream, self.vote_version, self.vote)


@dataclass(frozen=True)
class EvaluateStage(CellStage):
    task_name: ClassVar[str] = "evaluate"
    stage: ClassVar[str] = "evaluate"
    version: ClassVar[str] = EVALUATE_VERSION

    upstream: str  # the vote's key
    cell: Cell
    qids: tuple[str, ...]
    # how the reader's final context is read: "" the cell's retrieval (or its feedback documents); the reader's
    # `final_context` version when its final call reads less (pf_concat, sure_generic): only their keys changed
    context: str = ""

    @cached_property
    def key(self) -> str:
        if self.context:
            return stable_hash("evaluate", self.upstream, self.version, self.context)
        return stable_hash("evaluate", self.upstream, self.version)
