"""Stage 1 — retrieve: top-k passages per question, stored as RetrievalRecords (text as the reader sees it)."""

from __future__ import annotations

import hashlib
from typing import Any

import pandas as pd
from prefect import task

from ragledger import progress
from ragledger.crash import crashpoint
from tasks.context import StageResult, read_questions, retriever_for, spec_from, store_from
from tasks.retrievers import Hit, Query, Retriever
from tracking.events import event_id, new_events


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


def run_retrieve(
    spec_dict: dict, store_root: str, questions_segment: str, retriever_name: str, qids: list[str], stage_key: str, run_token: str
) -> StageResult:
    spec = spec_from(spec_dict)
    store = store_from(store_root)
    questions = read_questions(store, questions_segment, qids)
    retriever = retriever_for(spec, retriever_name, store_root)
    queries = [Query(r.qid, r.question) for r in questions.itertuples()]
    results = retriever.retrieve(queries)
    rows = retrieval_rows(spec.name, retriever, stage_key, results)
    crashpoint("retrieve.done")
    segment = store.write("retrievals", new_events("retrievals", spec.name, rows)) if rows else None
    progress.advance("retrieve", len(qids))
    return StageResult("retrieve", retriever_name, stage_key, str(segment) if segment else None, len(rows), run_token, {})


@task(name="retrieve", cache_key_fn=lambda ctx, params: params["stage_key"], persist_result=True)
def retrieve_task(
    spec_dict: dict, store_root: str, questions_segment: str, retriever_name: str, qids: list[str], stage_key: str, run_token: str
) -> StageResult:
    return run_retrieve(spec_dict, store_root, questions_segment, retriever_name, qids, stage_key, run_token)


def passages_by_question(retrievals: pd.DataFrame) -> dict[str, list[tuple[str, str]]]:
    """qid -> [(pid, text)] in rank order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for r in retrievals.sort_values(["qid", "rank"]).itertuples():
        out.setdefault(r.qid, []).append((r.pid, r.text))
    return out
