"""`none`: closed book, the reader gets no passages."""

from __future__ import annotations

from strategies.retrievers.base import Hit, LLMFn, Query, Retriever


class ClosedBook(Retriever):
    code_version = "none-1"
    per_query = True
    needs_corpus = False

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        return {q.qid: [] for q in queries}
