"""The plan of one experiment run, computed from the spec and its questions alone: every cell, shard and stage (with
its inputs and cache key) and what each stage waits for. No Prefect, no model, no store writes: flows/execute.py
runs a plan as the Prefect flow, and flows/cached.py answers a fully cached rerun from it.

Task granularity is (stage x shard): Prefect costs ~10-20 ms per task run, so per-question tasks would dominate.
Each key chains from upstream (tasks/stages.py), so a changed vote method re-runs only vote and evaluate.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.cell import Cell
from core.datasets import Question
from core.paths import StoreLayout
from schemas.spec import ExperimentSpec
from strategies.readers import get_reader
from strategies.readers.base import FINAL_CONTEXT_VERSION
from strategies.readers.concatenation import Concatenation
from strategies.retrievers import parse_retriever
from tasks.stages import (
    KEY_VERSION,
    EvaluateStage,
    FilterStage,
    GenerateStage,
    RetrieveStage,
    Stage,
    VoteStage,
    model_key,
    shard_id,
)
from tracking.store.events import event_id, stable_hash

FLOW_VERSION = KEY_VERSION
PIPELINE_STAGES = ("retrieve", "generate", "vote", "evaluate")  # in chain order


@dataclass(frozen=True)
class Shard:
    id: str
    qids: tuple[str, ...]


@dataclass(frozen=True)
class PlannedTask:
    stage: Stage
    after: tuple[str, ...]  # the keys of the stages whose results it reads


@dataclass(frozen=True)
class ExperimentPlan:
    spec: ExperimentSpec
    store_root: str
    questions_segment: str
    dataset_key: str
    corpus_hash: str
    model_key: str
    questions_sampled: int
    filters: tuple[FilterStage, ...]  # the closed-book filter's shards (empty when the spec does not ask for it)
    closed_book_dropped: frozenset[str] | None  # None: the filter is off or has not run yet
    cells: tuple[Cell, ...]
    shards: tuple[Shard, ...]
    retrieves: dict[tuple[str, str], RetrieveStage] = field(repr=False)  # (retriever, shard id)
    generates: dict[tuple[Cell, str], tuple[GenerateStage, ...]] = field(repr=False)  # (cell, shard id): rounds
    votes: dict[tuple[Cell, str], VoteStage] = field(repr=False)
    evaluates: dict[tuple[Cell, str], EvaluateStage] = field(repr=False)

    @property
    def qids(self) -> list[str]:
        """The questions the cells run on."""
        return [q for s in self.shards for q in s.qids]

    def tasks(self) -> list[PlannedTask]:
        """Every stage task of the run with its dependencies, upstream before downstream."""
        out = [PlannedTask(f, ()) for f in self.filters]
        out += [PlannedTask(r, ()) for r in self.retrieves.values()]
        for (cell, sid), rounds in self.generates.items():
            retrieval = self.retrieves[(cell.retriever, sid)].key
            out += [PlannedTask(g, (retrieval, *(p.key for p in rounds[:i]))) for i, g in enumerate(rounds)]
        for (cell, sid), vote in self.votes.items():
            generated = tuple(g.key for g in self.generates[(cell, sid)])
            retrieval = self.retrieves[(cell.retriever, sid)].key
            out.append(PlannedTask(vote, (retrieval, *generated)))
            out.append(PlannedTask(self.evaluates[(cell, sid)], (retrieval, *generated, vote.key)))
        return out

    def stage_totals(self) -> dict[str, int]:
        """Tasks per pipeline stage (the progress bars' totals)."""
        return {"retrieve": len(self.retrieves), "generate": sum(len(g) for g in self.generates.values()),
                "vote": len(self.votes), "evaluate": len(self.evaluates)}

    def call_parts(self) -> dict[str, tuple[str, int]]:
        """The run's model calls in parts, one per generate stage: its key -> (its cell and round, its questions). A
        stage's calls are known when its task plans them; until then core.progress.Forecast estimates them."""
        return {g.key: (f"{g.cell.name} round {g.round_no}", len(g.qids)) for rounds in self.generates.values()
                for g in rounds}

    def cells_of(self, retriever: str) -> list[Cell]:
        return [c for c in self.cells if c.retriever == retriever]

    # The retrieval schedule. Each retriever's first shard goes alone, so the model gets work as early as it can
    # (retrieving every shard at once, the first one finished after about all of them, the model idle meanwhile).
    # Then the model is busy: the other shards are retrieved beside it one after another (all at once, their search
    # threads took both cores from the model calls; docs/performance.md), except for a retriever that calls the
    # model itself, whose shards fill its concurrency together.
    def first_retrievals(self) -> list[RetrieveStage]:
        return [self.retrieves[(r, self.shards[0].id)] for r in self.spec.retrievers] if self.shards else []

    def retrievals_after(self, done: RetrieveStage) -> list[RetrieveStage]:
        ids = [s.id for s in self.shards]
        i = ids.index(self.shard_of(done))
        if not done.calls_model:
            return [self.retrieves[(done.retriever, sid)] for sid in ids[i + 1 : i + 2]]
        later = ids[1:] if i == 0 else []
        return [self.retrieves[(done.retriever, sid)] for sid in later]

    def retrieval_order(self) -> list[RetrieveStage]:
        """Every retrieval in the order the schedule above starts them when each is done before the next starts: a
        run's head start runs them so (flows/head_start.py)."""
        queue, order = list(self.first_retrievals()), []
        while queue:
            order.append(queue.pop(0))
            queue += self.retrievals_after(order[-1])
        return order

    def shard_of(self, stage: RetrieveStage) -> str:
        return shard_id(stage.qids)


def shard(qids: Sequence[str], size: int) -> list[list[str]]:
    return [list(qids[i : i + size]) for i in range(0, len(qids), size)]


def question_rows(spec: ExperimentSpec, questions: Iterable[Question]) -> list[dict[str, Any]]:
    """The experiment's QuestionRecords (their event ids name the questions segment)."""
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


def questions_segment_for(spec: ExperimentSpec, questions: Sequence[Question], store_root: str | Path) -> str:
    """Where the flow stores the experiment's questions (a segment is named by its events: EventStore.write)."""
    ids = [r["event_id"] for r in question_rows(spec, questions)]
    return str(StoreLayout.of(store_root).segment("questions", spec.name, ids))


def corpus_hash_for(spec: ExperimentSpec) -> str:
    """The corpus's content hash when a retriever needs the corpus ("" otherwise): it enters the retrieve keys."""
    if not any(parse_retriever(r).needs_corpus for r in spec.retrievers):
        return ""
    from strategies.retrievers.corpus import Corpus

    return Corpus.of_spec(spec.corpus).corpus_hash


def plan(spec: ExperimentSpec, questions: Sequence[Question], *, store_root: str | None = None,
         questions_segment: str | None = None, corpus_hash: str | None = None,
         closed_book_dropped: Iterable[str] | None = None) -> ExperimentPlan:
    """The run of `spec` over its sampled `questions`. The closed-book filter's results are known only once its
    tasks ran: until `closed_book_dropped` is given, the cells are planned over every sampled question."""
    store_root = store_root or spec.tracking.store
    segment = questions_segment or questions_segment_for(spec, questions, store_root)
    corpus = corpus_hash if corpus_hash is not None else corpus_hash_for(spec)
    dataset_key = stable_hash(spec.name, spec.dataset.identity(), segment)
    mkey = model_key(spec)
    sampled = [q.qid for q in questions]
    dropped = frozenset(closed_book_dropped) if closed_book_dropped is not None else None
    qids = [q for q in sampled if q not in (dropped or ())]
    size = spec.execution.shard_size_for(len(sampled))  # of the sampled questions: the same before and after the filter
    shards = tuple(Shard(shard_id(s), tuple(s)) for s in shard(qids, size))
    cells = tuple(Cell(r, e.key, spec.model.display_name) for r in spec.retrievers for e in spec.reader_entries())
    filters = filter_stages(spec, sampled, size, dataset_key, mkey)
    retrieves = {(r, s.id): retrieve_stage(r, s, dataset_key, corpus, store_root, mkey)
                 for r in spec.retrievers for s in shards}
    generates, votes, evaluates = {}, {}, {}
    for cell in cells:
        for s in shards:
            rounds = generate_stages(spec, cell, s, retrieves[(cell.retriever, s.id)].key, mkey)
            generates[(cell, s.id)] = rounds
            votes[(cell, s.id)] = vote_stage(spec, cell, s, rounds[-1].key)
            evaluates[(cell, s.id)] = evaluate_stage(spec, cell, s, votes[(cell, s.id)].key)
    return ExperimentPlan(spec, store_root, segment, dataset_key, corpus, mkey, len(sampled), filters, dropped, cells, shards,
                          retrieves, generates, votes, evaluates)


def filter_stages(spec: ExperimentSpec, qids: list[str], size: int, dataset_key: str,
                  mkey: str) -> tuple[FilterStage, ...]:
    if not spec.dataset.closed_book_filter:
        return ()
    return tuple(FilterStage(dataset_key, mkey, Concatenation.prompt_version, spec.model.display_name, tuple(s))
                 for s in shard(qids, size))


def retrieve_stage(retriever: str, s: Shard, dataset_key: str, corpus_hash: str, store_root: str,
                   mkey: str) -> RetrieveStage:
    r = parse_retriever(retriever)
    return RetrieveStage(dataset_key, corpus_hash, retriever, r.code_version, s.qids, str(Path(store_root).resolve()),
                         mkey if r.needs_llm else None)


def generate_stages(spec: ExperimentSpec, cell: Cell, s: Shard, retrieval_key: str, mkey: str) -> tuple[GenerateStage, ...]:
    entry = spec.reader_entry(cell.reader)
    reader = get_reader(entry.name)
    keyed = entry.call_settings()
    settings = (keyed,) if keyed else ()  # plain names keep their keys
    version = reader.version_for(entry.settings)  # the template version under this entry's settings
    rounds, upstream = [], retrieval_key
    for rnd in range(1, reader.rounds + 1):
        rounds.append(GenerateStage(upstream, cell, rnd, version, mkey, settings, s.qids))
        upstream = rounds[-1].key
    return tuple(rounds)


def evaluate_stage(spec: ExperimentSpec, cell: Cell, s: Shard, vote_key: str) -> EvaluateStage:
    reader = get_reader(spec.reader_entry(cell.reader).name)
    return EvaluateStage(vote_key, cell, s.qids, FINAL_CONTEXT_VERSION if reader.narrows_context else "")


def vote_stage(spec: ExperimentSpec, cell: Cell, s: Shard, generated_key: str) -> VoteStage:
    entry = spec.reader_entry(cell.reader)
    return VoteStage(generated_key, cell, get_reader(entry.name).vote_version, entry.vote, s.qids)
