"""`none`: closed book, the reader gets no passages."""

from __future__ import annotations

from tasks.retrievers.base import Hit, Query, Retriever


class ClosedBook(Retriever):
    code_version = "none-1"

    def retrieve(self, queries: list[Query]) -> dict[str, list[Hit]]:
        return {q.qid: [] for q in queries}
