"""Stage 4 — evaluate: score each vote against the gold answers and classify its error (seed 002).

Error types (seed 002 §4): RE = gold not in the reader's context. Correct (EM) with RE is a lucky
guess; an "unknown" answer is an abstention; wrong with RE is a retrieval failure; wrong without
RE is an extraction error when the prediction occurs in the context, else a hallucination error.

"The reader's context" is what the reader read in its final round: the cell's retrieval, except for a
reader that retrieves its own feedback documents (REFEED's refine step reads the question+answer
retrieval), where it is those documents, and for a reader whose final call reads less than the retrieval
(`Reader.final_context`: pf_concat's distil call reads the passages Post-Fusion kept, sure_generic's answer call
the summary alone). `gold_in_retrieval` keeps the cell's retrieval apart for Recall@k.

The answer pool (seed 001's %NM): the vote's candidates; a single answer is a one-answer pool, so a
single-answer reader never counts as "not majority".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from core.answers import (
    contains_token_sequence,
    em_score,
    f1_score,
    has_answer,
    is_unknown,
    normalized_context,
    normalized_passages,
)
from strategies.readers import get_reader
from tasks.retrieve import passages_by_question
from tasks.stages import EVALUATE_VERSION as EVALUATE_VERSION
from tasks.stages import EvaluateStage, RunContext, StageResult
from tracking.store.events import event_id, new_events


def error_type(correct: bool, unknown: bool, gold_in_context: bool, prediction_in_context: bool) -> str:
    if correct:
        return "correct" if gold_in_context else "lucky_guess"
    if unknown:
        return "abstention"
    if not gold_in_context:
        return "retrieval_failure"
    return "extraction_error" if prediction_in_context else "hallucination_error"


def semantic_matches(votes: pd.DataFrame, answers: dict[str, list[str]]) -> list[bool]:
    """Per vote, whether its prediction is semantically close to a gold answer (engines/semantic.py)."""
    from engines.semantic import SEMANTIC_THRESHOLD, max_similarity

    predictions, qids = votes["chosen"].tolist(), votes["qid"].tolist()
    # only a wrong, non-abstaining prediction needs an embedding: EM decides the rest (and costs nothing)
    need = [i for i, (p, q) in enumerate(zip(predictions, qids, strict=True))
            if not is_unknown(p) and em_score(p, answers[q]) < 1.0]
    close = max_similarity([predictions[i] for i in need], [answers[qids[i]] for i in need])
    sims = [False] * len(predictions)
    for i, s in zip(need, close, strict=True):
        sims[i] = s >= SEMANTIC_THRESHOLD
    return sims


def outcome_rows(
    experiment: str,
    cell: str,
    retriever: str,
    reader: str,
    model: str,
    stage_key: str,
    questions: pd.DataFrame,
    retrievals: pd.DataFrame,
    votes: pd.DataFrame,
    generations: pd.DataFrame,
    semantic: bool = True,
    feedback_documents: Callable[[str, str, str], str | None] | None = None,
    final_context: Callable[[Sequence[Any], Callable[[str], str]], str | None] | None = None,
) -> list[dict[str, Any]]:
    answers = {r.qid: list(r.answers) for r in questions.itertuples()}
    feedback = feedback_contexts(questions, generations, feedback_documents)
    passages = passages_by_question(retrievals)
    narrowed = narrowed_contexts(passages, generations, final_context)
    contexts = {qid: normalized_passages(t for _, t in ps) for qid, ps in passages.items()}
    tokens_in, tokens_out, calls = usage_by_question(generations)
    votes = votes[votes["qid"].isin(answers)]
    sims = semantic_matches(votes, answers) if semantic and len(votes) else None
    rows = []
    for i, v in enumerate(votes.itertuples()):
        golds = answers[v.qid]
        retrieved = contexts.get(v.qid) or normalized_context("")  # normalized once for every check below
        # the context the reader saw in its final round (seed 002's decomposition): its feedback documents or the
        # narrower context of its final call, if any
        final = feedback.get(v.qid, narrowed.get(v.qid))
        context = retrieved if final is None else normalized_context(final)
        pred = v.chosen
        em = em_score(pred, golds)
        unknown = is_unknown(pred)
        gic = has_answer(context, golds)
        rows.append(
            {
                "event_id": event_id("outcomes", experiment, stage_key, v.qid),
                "cell": cell,
                "qid": v.qid,
                "retriever": retriever,
                "reader": reader,
                "model": model,
                "prediction": pred,
                "em": em,
                "f1": f1_score(pred, golds),
                "semantic_match": (None if sims is None else float((em == 1.0 or sims[i]) and not unknown)),
                "is_unknown": unknown,
                "gold_in_context": gic,
                "gold_in_retrieval": gic if context is retrieved else has_answer(retrieved, golds),
                "pool_has_correct": pool_has_correct(v.candidates, pred, golds),
                "gold_in_feedback": gic if v.qid in feedback else None,
                "error_type": error_type(em == 1.0, unknown, gic, (not unknown) and contains_token_sequence(context, pred)),
                "tokens_in": int(tokens_in.get(v.qid, 0)),
                "tokens_out": int(tokens_out.get(v.qid, 0)),
                "llm_calls": int(calls.get(v.qid, 0)),
            }
        )
    return rows


def usage_by_question(generations: pd.DataFrame) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """qid -> tokens in, tokens out, calls; as dicts: a pandas .loc lookup per question cost more than the rest of its
    scoring (docs/performance.md, "Small costs behind the code")."""
    if generations.empty:
        return {}, {}, {}
    by_question = generations.groupby("qid")
    return (by_question["tokens_in"].sum().to_dict(), by_question["tokens_out"].sum().to_dict(),
            by_question.size().to_dict())


def embed_gold_answers(questions: pd.DataFrame) -> None:
    """Embed the gold answers of these questions ahead of their evaluation (the flow does it while their calls are in
    flight): `outcome_rows` then embeds only the predictions, every vector being kept (engines/semantic.py). The
    evaluations left after a run's last answer are what it waits for at its end."""
    from engines.semantic import embed

    embed(sorted({str(a) for answers in questions["answers"] for a in answers}))


def pool_has_correct(candidates: Sequence[str], chosen: str, golds: list[str]) -> bool:
    """Whether the answer pool the vote chose from holds a correct answer (EM); without candidates the pool is
    the chosen answer alone."""
    return any(em_score(c, golds) == 1.0 for c in (candidates if len(candidates) else [chosen]))


def feedback_contexts(questions: pd.DataFrame, generations: pd.DataFrame,
                      feedback_documents: Callable[[str, str, str], str | None] | None) -> dict[str, str]:
    """qid -> the text of the feedback documents the reader's own calls carried (`Reader.feedback_documents`)."""
    if feedback_documents is None or generations.empty or "prompt" not in generations:
        return {}
    texts = dict(zip(questions["qid"], questions["question"], strict=True)) if "question" in questions else {}
    out: dict[str, list[str]] = {}
    for g in generations.itertuples():
        docs = feedback_documents(texts.get(g.qid, ""), g.role, g.prompt)
        if docs is not None:
            out.setdefault(g.qid, []).append(docs)
    return {qid: "\n\n".join(docs) for qid, docs in out.items()}


def narrowed_contexts(passages: dict[str, list[tuple[str, str]]], generations: pd.DataFrame,
                      final_context: Callable[[Sequence[Any], Callable[[str], str]], str | None] | None) -> dict[str, str]:
    """qid -> the text the reader's final call read, where `Reader.final_context` says it is not the retrieval."""
    if final_context is None or generations.empty:
        return {}
    out = {}
    for qid, rows in generations.groupby("qid", sort=False):
        texts = dict(passages.get(qid, []))
        rows = list(rows.sort_values(["round", "call_index"]).itertuples())
        text = final_context(rows, lambda pid, texts=texts: texts.get(pid, ""))
        if text is not None:
            out[qid] = text
    return out


def run_evaluate(run: RunContext, stage: EvaluateStage, retrieval_segments: list[str | None],
                 generation_segments: list[str | None], vote_segment: str | None) -> StageResult:
    spec, store = run.spec, run.store()
    questions = run.questions(store, stage.qids)
    retrievals = store.read("retrievals", paths=[p for p in retrieval_segments if p])
    generations = store.read("generations", paths=[p for p in generation_segments if p])
    votes = store.read("votes", paths=[vote_segment] if vote_segment else [])
    reader = get_reader(spec.reader_entry(stage.reader).name)
    cell = stage.cell
    rows = outcome_rows(
        spec.name, cell.name, cell.retriever, cell.reader, cell.model, stage.key,
        questions, retrievals[retrievals["qid"].isin(stage.qids)], votes, generations,
        feedback_documents=reader.feedback_documents if reader.retrieves_feedback else None,
        final_context=reader.final_context if reader.narrows_context else None,
    )  # fmt: skip
    segment = store.write("outcomes", new_events("outcomes", spec.name, rows)) if rows else None
    return stage.result(run, segment, len(rows))
