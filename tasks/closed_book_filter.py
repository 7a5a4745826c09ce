"""Seed 001's dataset filter (§4, "Dataset Filter"): drop the questions the model answers correctly with no context.

"We initially prompt the LLM to answer questions without any provided context. This process enables us to filter
out questions that the LLM can accurately answer independently." The closed-book round is the Concatenation
prompt (Fig. 7) with an empty context — exactly the `none · concatenation` cell's call, so the two share the
LLM-call cache — at the spec's sampling settings; a question is dropped when that answer is an exact match (EM).
Its calls are stored as GenerationRecords of the cell `none · closed_book_filter · <model>`.
"""

from __future__ import annotations

import asyncio

import pandas as pd

from core.answers import em_score
from engines.llm import LLMResponse, run_on_engine
from strategies.readers.base import Call, ReaderInput
from strategies.readers.concatenation import Concatenation
from tasks.context import llm_client_for
from tasks.generate import generation_rows, history_by_question, to_request
from tasks.stages import FILTER_READER, FILTER_RETRIEVER, FilterStage, RunContext, StageResult
from tracking.store.events import new_events


def filter_calls(questions: pd.DataFrame) -> list[tuple[str, Call]]:
    """One closed-book call per question: the Concatenation prompt with no passages."""
    reader, settings = Concatenation(), Concatenation.Settings()
    return [(r.qid, call) for r in questions.itertuples() for call in reader.plan(1, ReaderInput(r.qid, r.question, ()), [],
                                                                                   settings)]


def answered_closed_book(questions: pd.DataFrame, generations: pd.DataFrame) -> set[str]:
    """The question ids whose closed-book answer is an exact match of a gold answer."""
    reader = Concatenation()
    history = history_by_question(generations)
    out = set()
    for r in questions.itertuples():
        if r.qid in history:
            chosen = reader.decide(ReaderInput(r.qid, r.question, ()), history[r.qid]).chosen
            if em_score(chosen, list(r.answers)) == 1.0:
                out.add(r.qid)
    return out


def run_closed_book_filter(run: RunContext, stage: FilterStage, base_url: str) -> StageResult:
    spec, store = run.spec, run.store()
    questions = run.questions(store, stage.qids)
    planned = [(qid, 0, call, to_request(call, spec)) for qid, call in filter_calls(questions)]
    client = llm_client_for(spec, base_url, run.store_root, task_processes=run.task_processes)

    async def run_all() -> list[LLMResponse]:
        return await asyncio.gather(*(client.complete(req) for _, _, _, req in planned))

    responses: list[LLMResponse] = run_on_engine(run_all()) if planned else []
    rows = generation_rows(spec, Concatenation(), FILTER_RETRIEVER, 1, stage.key, planned, responses, client, FILTER_READER)
    segment = store.write("generations", new_events("generations", spec.name, rows)) if rows else None
    return stage.result(run, segment, len(rows), client.counters.as_stage_counters())
