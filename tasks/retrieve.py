"""Stage 1 — retrieve: top-k passages per question, stored as RetrievalRecords (text as the reader sees it)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd

from core import progress
from core.crash import crashpoint
from engines.llm import LLMClient, LLMRequest, LLMResponse, run_on_engine
from schemas.spec import ExperimentSpec
from strategies.retrievers import Hit, LLMFn, LLMPrompt, Query, Retriever
from tasks.context import llm_client_for, retriever_for
from tasks.stages import RetrieveStage, RunContext, StageResult
from tracking.store.events import event_id, new_events


def retrieval_rows(experiment: str, retriever: Retriever, stage_key: str, results: dict[str, list[Hit]]) -> list[dict[str, Any]]:
    rows = []
    for qid, hits in results.items():
        for rank, h in enumerate(hits, start=1):
            rows.append(
                {
                    "event_id": event_id("retrievals", experiment, stage_key, qid, rank),
                    "cell": retriever.name,
                    "qid": qid,
                    "retriever": retriever.name,
                    "rank": rank,
                    "pid": h.pid,
                    "score": h.score,
                    "title": h.title,
                    "text": h.text,
                    "text_hash": hashlib.sha256(h.text.encode()).hexdigest()[:32],
                }
            )
    return rows


def retrieval_llm(spec: ExperimentSpec, client: LLMClient) -> LLMFn:
    """The model as retrievers see it (compression, GenRead): the experiment's cached client and sampling."""

    def run(prompts: list[LLMPrompt]) -> list[str]:
        m = spec.model
        reqs = [LLMRequest(system=p.system, prompt=p.prompt, temperature=m.temperature, top_p=m.top_p,
                           max_tokens=p.max_tokens, seed=m.seed) for p in prompts]

        async def all_calls() -> list[LLMResponse]:
            return await asyncio.gather(*(client.complete(r) for r in reqs))

        return [r.text for r in run_on_engine(all_calls())] if reqs else []

    return run


def queries_of(questions: Iterable[Any]) -> list[Query]:
    """Retriever queries from question records (stored rows, or the rows about to be stored)."""
    return [Query(q["qid"], q["question"], tuple(q["gold_pids"]), tuple(q["answers"])) for q in questions]


# what a part of a shard retrieved (its questions and retrieval rows) is handed to while the rest is retrieved
PartSink = Callable[[pd.DataFrame, list[dict[str, Any]]], None]


def retrieve_rows(run: RunContext, stage: RetrieveStage, questions: pd.DataFrame, client: LLMClient | None = None,
                  on_part: PartSink | None = None, first: int = 0) -> list[dict[str, Any]]:
    """The retrieve stage's records for the shard's `questions`. With `on_part` and a retriever whose hits for a
    question do not depend on the other questions of the call (`Retriever.per_query`), the shard is retrieved in parts
    (its `first` questions, then 3x as many, then the rest), each handed on as soon as it is retrieved: a run's head
    start sends its round-1 calls (flows/head_start.py)."""
    spec = run.spec
    retriever = retriever_for(spec, stage.retriever, run.store_root)
    n = len(questions)
    cuts = sorted({0, min(first, n), min(4 * first, n), n}) if on_part and first and retriever.per_query else [0, n]
    rows: list[dict[str, Any]] = []
    for a, b in itertools.pairwise(cuts):  # distinct cuts: no part is empty
        part = questions.iloc[a:b]
        hits = retriever.retrieve(queries_of(part.to_dict("records")), retrieval_llm(spec, client) if client else None)
        part_rows = retrieval_rows(spec.name, retriever, stage.key, hits)
        rows += part_rows
        if on_part is not None:
            on_part(part, part_rows)
    return rows


def run_retrieve(run: RunContext, stage: RetrieveStage, base_url: str = "") -> StageResult:
    """The retrieve stage: its records, retrieved now or taken from the run's head start, which retrieved them ahead."""
    spec, store = run.spec, run.store()
    client = None
    rows = run.head_start.take_retrieval(stage) if run.head_start is not None else None
    if rows is None:
        if retriever_for(spec, stage.retriever, run.store_root).needs_llm:
            client = llm_client_for(spec, base_url, run.store_root, task_processes=run.task_processes)
        rows = retrieve_rows(run, stage, run.questions(store, stage.qids), client)
    crashpoint("retrieve.done")
    segment = store.write("retrievals", new_events("retrievals", spec.name, rows)) if rows else None
    progress.advance("retrieve questions", len(stage.qids))
    return stage.result(run, segment, len(rows), client.counters.as_stage_counters() if client is not None else {})


def passages_by_question(retrievals: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """qid -> [(pid, text)] in rank order."""
    out: dict[str, list[tuple[str, str]]] = {}
    ranked = retrievals.sort_values(["qid", "rank"])
    # three columns as lists, not itertuples: that makes every column of every row a Python object (a Timestamp
    # per row for `created_at`), 4x the time of the whole function
    for qid, pid, text in zip(ranked["qid"].tolist(), ranked["pid"].tolist(), ranked["text"].tolist(), strict=True):
        out.setdefault(qid, []).append((pid, text))
    return out
