"""`trunc(X,N)`: a word budget, so retrievers hand the reader texts of similar length (seed 002 keeps
its retrievers' documents "in similar length", e.g. SE@1 truncated to 1000 words).

X's hits are kept in rank order until N words (whitespace-separated) are used; the hit that
crosses the budget is cut at the budget, later hits are dropped. The cut text is what the reader sees.
"""

from __future__ import annotations

from pathlib import Path

from strategies.retrievers.base import Hit, LLMFn, Query, Retriever
from strategies.retrievers.corpus import Corpus


def truncate_hits(hits: list[Hit], budget: int) -> list[Hit]:
    out, left = [], budget
    for h in hits:
        if left <= 0:
            break
        words = h.text.split()
        if len(words) > left:
            h = Hit(h.pid, h.score, h.title, " ".join(words[:left]))
        out.append(h)
        left -= len(words)
    return out


class Truncate(Retriever):
    def __init__(self, name: str, inner: Retriever, words: int):
        super().__init__(name)
        self.inner, self.words = inner, words
        self.code_version = f"trunc-1({inner.code_version})"
        self.per_query = inner.per_query
        self.needs_corpus, self.needs_llm = inner.needs_corpus, inner.needs_llm

    def start_engine(self) -> None:
        self.inner.start_engine()

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.inner.prepare(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        inner = self.inner.retrieve(queries, llm)
        return {q.qid: truncate_hits(inner.get(q.qid, []), self.words) for q in queries}
