"""Stage 2 — generate: one round of a reader strategy over a shard, model calls run concurrently.

The reader plans the calls (pure); this stage executes them through the cached `LLMClient` and
stores each call as a GenerationRecord with its prompt, raw output and parsed answer.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import pandas as pd

from core import progress
from core.cell import Cell
from core.crash import crashpoint
from engines.llm import ContextOverflow, LLMClient, LLMRequest, LLMResponse, run_on_engine
from schemas.spec import ExperimentSpec
from strategies.readers import get_reader
from strategies.readers.base import (
    Call,
    Generation,
    Passage,
    Reader,
    ReaderInput,
    ReaderSettings,
    answer_token_prob,
    output_token_prob,
    parse_output,
)
from tasks.context import llm_client_for, retriever_for
from tasks.retrieve import passages_by_question
from tasks.stages import GenerateStage, RunContext, StageResult
from tracking.store.events import event_id, new_events, stable_hash


def reader_inputs(questions: pd.DataFrame, retrievals: pd.DataFrame) -> list[ReaderInput]:
    by_q = passages_by_question(retrievals)
    titles = dict(zip(retrievals["pid"], retrievals["title"], strict=True)) if "title" in retrievals else {}
    return [
        ReaderInput(r.qid, r.question, tuple(Passage(pid, text, titles.get(pid, "")) for pid, text in by_q.get(r.qid, [])))
        for r in questions.itertuples()
    ]


def history_by_question(generations: pd.DataFrame) -> dict[str, list[Generation]]:
    out: dict[str, list[Generation]] = {}
    if generations.empty:
        return out
    # the columns read, not every one: a row's `created_at` alone, made a Timestamp per row, cost more than the rest
    columns = ["qid", "round", "role", "sample_index", "passage_ids", "output", "parsed_answer", "parse_status", "logprob",
               *(c for c in ("answer_prob", "output_prob") if c in generations)]
    for g in generations.sort_values(["round", "call_index"])[columns].itertuples(index=False):
        out.setdefault(g.qid, []).append(
            Generation(
                round=int(g.round),
                role=g.role,
                sample_index=int(g.sample_index),
                passage_ids=tuple(g.passage_ids),
                output=g.output,
                parsed_answer=g.parsed_answer,
                parse_status=g.parse_status,
                mean_logprob=None if pd.isna(g.logprob) else float(g.logprob),
                answer_prob=_optional_float(getattr(g, "answer_prob", None)),
                output_prob=_optional_float(getattr(g, "output_prob", None)),
            )
        )
    return out


def _optional_float(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def feedback_retrieval(spec: ExperimentSpec, retriever_name: str, store_root: str):
    """The cell's retriever as a query -> passages callable, for strategies that retrieve again with a
    rewritten query (REFEED). Deterministic for a fixed index, so plans stay reproducible."""
    if retriever_name == "none":
        return None
    import copy

    from strategies.retrievers import Query

    def retrieve(text: str, k: int | None = None) -> list[Passage]:
        base = retriever_for(spec, retriever_name, store_root)  # opened on first use (memoised per process)
        r = base
        if k is not None and hasattr(base, "k") and k != base.k:  # a retriever without a k keeps its own depth
            r = copy.copy(base)
            r.k = k
        hits = r.retrieve([Query("feedback", text)]).get("feedback", [])
        return [Passage(h.pid, h.text, h.title, h.score) for h in hits]

    return retrieve


def to_request(call: Call, spec: ExperimentSpec) -> LLMRequest:
    m = spec.model
    return LLMRequest(
        system=call.system,
        prompt=call.prompt,
        temperature=m.temperature if call.temperature is None else call.temperature,
        top_p=m.top_p if call.top_p is None else call.top_p,
        max_tokens=m.max_tokens if call.max_tokens is None else call.max_tokens,
        seed=m.seed,
        sample_index=call.sample_index,
        logprobs=call.logprobs,
    )


def overflow_message(cell: str, qid: str, round_no: int, call: Call, exc: BaseException) -> str:
    """One line for a prompt the server refused as longer than its context: which cell, question and call, what the
    server said, and what shortens it (ContextOverflow, engines/llm_http.py)."""
    return (f"cell '{cell}', question {qid} (round {round_no}, {call.role} call): {exc}; shorten the prompt (fewer or "
            f"shorter passages: the retriever's k, trunc(...)) or serve a longer context (vLLM --max-model-len; the "
            f"embedded model: model.context_window)")


def generation_rows(
    spec: ExperimentSpec,
    reader: Reader,
    retriever_name: str,
    round_no: int,
    stage_key: str,
    planned: list[tuple[str, int, Call, LLMRequest]],
    responses: list[LLMResponse],
    client: LLMClient,
    reader_label: str | None = None,
    prompt_version: str | None = None,
) -> list[dict[str, Any]]:
    rows = []
    prompt_version = prompt_version or reader.prompt_version
    model = spec.model.display_name
    label = reader_label or reader.name  # the spec's label (ReaderEntry.key: name plus non-default settings)
    cell = Cell(retriever_name, label, model).name
    for (qid, call_index, call, req), resp in zip(planned, responses, strict=True):
        answer, status = parse_output(resp.text, call.parser)
        call_id = client.cache_key(req)
        rows.append(
            {
                "event_id": event_id("generations", spec.name, stage_key, qid, round_no, call_index, call_id),
                "cell": cell,
                "qid": qid,
                "retriever": retriever_name,
                "reader": label,
                "round": round_no,
                "role": call.role,
                "call_index": call_index,
                "sample_index": call.sample_index,
                "call_id": call_id,
                "prompt_version": prompt_version,
                "prompt_hash": stable_hash(call.system, call.prompt),
                "system_prompt": call.system,
                "prompt": call.prompt,
                "passage_ids": list(call.passage_ids),
                "output": resp.text,
                "parsed_answer": answer,
                "parse_status": status,
                "logprob": resp.mean_logprob,
                "answer_prob": answer_token_prob(resp.text, resp.token_logprobs, answer) if call.logprobs else None,
                "output_prob": output_token_prob(resp.token_logprobs) if call.logprobs else None,
                "tokens_in": resp.tokens_in,
                "tokens_out": resp.tokens_out,
                "latency_ms": resp.latency_ms,
                "model": model,
                "from_cache": resp.from_cache,
                "retries": resp.retries,
            }
        )
    return rows


class RoundPlan(NamedTuple):
    reader: Reader
    settings: ReaderSettings
    calls: list[tuple[str, int, Call, LLMRequest]]  # (qid, call index, the reader's call, its request)
    rounds_after: int  # the strategy's rounds after this one: the call gate lets a call more rounds wait on go first


def plan_round(spec: ExperimentSpec, stage: GenerateStage, store_root: str, questions: pd.DataFrame,
               retrievals: pd.DataFrame, history: dict[str, list[Generation]]) -> RoundPlan:
    """The calls of one round over a shard, as the reader plans them (pure but for REFEED's feedback retrieval)."""
    entry = spec.reader_entry(stage.reader)
    reader = get_reader(entry.name)
    settings = entry.settings.with_retrieval(feedback_retrieval(spec, stage.retriever, store_root))
    calls = [(item.qid, i, call, to_request(call, spec))
             for item in reader_inputs(questions, retrievals[retrievals["qid"].isin(stage.qids)])
             for i, call in enumerate(reader.plan(stage.round_no, item, history.get(item.qid, []), settings))]
    return RoundPlan(reader, settings, calls, max(0, reader.rounds - stage.round_no))


def run_generate_round(run: RunContext, stage: GenerateStage, base_url: str, retrieval_segments: list[str | None],
                       previous_segments: list[str | None], logprobs_base_url: str | None = None) -> StageResult:
    spec, store = run.spec, run.store()
    history = history_by_question(store.read("generations", paths=[p for p in previous_segments if p]))
    round_plan = plan_round(spec, stage, run.store_root, run.questions(store, stage.qids),
                            store.read("retrievals", paths=[p for p in retrieval_segments if p]), history)
    reader, settings, planned, _ = round_plan
    # the run's forecast of its calls, each weighed by its prompt (core/progress.py)
    progress.planned(stage.calls_progress, stage.key, len(planned),
                     sum(progress.call_work(req.system, req.prompt) for *_, req in planned))
    client = llm_client_for(spec, base_url, run.store_root, logprobs_base_url, head_start_calls=run.head_start_calls,
                            task_processes=run.task_processes)
    responses = run_on_engine(complete_all(client, planned, stage, round_plan.rounds_after)) if planned else []
    rows = generation_rows(spec, reader, stage.retriever, stage.round_no, stage.key, planned, responses, client,
                           stage.reader, reader.version_for(settings))
    segment = store.write("generations", new_events("generations", spec.name, rows)) if rows else None
    return stage.result(run, segment, len(rows), client.counters.as_stage_counters())


async def complete_all(client: LLMClient, planned: list[tuple[str, int, Call, LLMRequest]],
                       stage: GenerateStage, rounds_after: int = 0) -> list[LLMResponse]:
    """Every planned call, concurrently; progress per finished call, so a long shard shows movement."""

    async def one(qid: str, call: Call, req: LLMRequest) -> LLMResponse:
        try:
            resp = await client.complete(req, rounds_after)
        except ContextOverflow as exc:
            raise ContextOverflow(overflow_message(stage.cell.name, qid, stage.round_no, call, exc)) from None
        crashpoint("generate.call")
        progress.advance(stage.calls_progress, 1, progress.call_work(req.system, req.prompt))
        return resp

    return await asyncio.gather(*(one(qid, call, req) for qid, _, call, req in planned))
