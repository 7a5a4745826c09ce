"""`hybrid(X,Y,...)`: seed 002's concatenation of sources — X's hits, then Y's, deduplicated by pid
(the first occurrence wins, so X's rank order comes first). Scores keep each source's own scale."""

from __future__ import annotations

from pathlib import Path

from strategies.retrievers.base import Hit, LLMFn, Query, Retriever
from strategies.retrievers.corpus import Corpus


def merge_dedup(lists: list[list[Hit]]) -> list[Hit]:
    seen: set[str] = set()
    out = []
    for hits in lists:
        for h in hits:
            if h.pid not in seen:
                seen.add(h.pid)
                out.append(h)
    return out


class Hybrid(Retriever):
    def __init__(self, name: str, parts: list[Retriever]):
        super().__init__(name)
        self.parts = parts
        self.code_version = "hybrid-1(" + ",".join(p.code_version for p in parts) + ")"
        self.per_query = all(p.per_query for p in parts)
        self.needs_corpus = any(p.needs_corpus for p in parts)
        self.needs_llm = any(p.needs_llm for p in parts)

    def start_engine(self) -> None:
        for p in self.parts:
            p.start_engine()

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        for p in self.parts:
            p.prepare(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        results = [p.retrieve(queries, llm) for p in self.parts]
        return {q.qid: merge_dedup([r.get(q.qid, []) for r in results]) for q in queries}
