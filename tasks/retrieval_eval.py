"""Retrieval-only evaluation (no model): Recall@k and gold-paragraph hit rate of retrievers on a dataset.

Recall@k: share of questions with some gold answer in the top-k text as the reader sees it (`has_answer`,
SQuAD normalization) — the same `gold_in_context` the experiment flow records per cell. Gold-paragraph
hit: share of questions (with a known gold paragraph, e.g. SQuAD) whose gold paragraph is among the hits.
Used by `ragledger recall`; questions are sampled exactly as the experiment flow samples them.
"""

from __future__ import annotations

import time

from core.answers import has_answer, normalized_passages
from schemas.spec import ExperimentSpec
from strategies.retrievers import Query, parse_retriever
from tasks.context import retriever_for


def retrieval_recall(spec: ExperimentSpec, store_root: str, log=print, batch: int = 1000) -> list[dict]:
    questions = spec.dataset.sampled_questions()
    rows = []
    for name in spec.retrievers:
        if parse_retriever(name).needs_llm:
            raise ValueError(f"retriever {name!r} calls the model; measure it with `ragledger run`")
        retriever = retriever_for(spec, name, store_root, log=log)
        started = time.perf_counter()
        hits: dict[str, list] = {}
        for i in range(0, len(questions), batch):
            hits.update(retriever.retrieve([Query(q.qid, q.question) for q in questions[i : i + batch]]))
        seconds = time.perf_counter() - started
        found = [has_answer(normalized_passages(h.text for h in hits.get(q.qid, [])), q.answers) for q in questions]
        with_gold = [q for q in questions if q.gold_pids]
        gold = [bool(set(q.gold_pids) & {h.pid for h in hits.get(q.qid, [])}) for q in with_gold]
        rows.append({
            "retriever": name, "questions": len(questions),
            "recall_at_k": round(100.0 * sum(found) / max(len(found), 1), 2),
            "gold_paragraph_hit": round(100.0 * sum(gold) / len(gold), 2) if gold else float("nan"),
            "seconds": round(seconds, 2),
        })  # fmt: skip
        log(f"{name}: Recall@k {rows[-1]['recall_at_k']:.2f}%  gold paragraph {rows[-1]['gold_paragraph_hit']:.2f}%  "
            f"({len(questions):,} questions, {seconds:.1f} s)")
    return rows

