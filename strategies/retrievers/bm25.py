"""BM25 with Pyserini (Lucene) over the corpus's Lucene index (strategies/retrievers/lucene.py): built once per corpus
hash from passage files, or the index the corpus is. A hit's passage comes from the index's stored document, so a run
reads only the passages it retrieves."""

from __future__ import annotations

import os
from pathlib import Path

from strategies.retrievers.base import Hit, LLMFn, Query, Retriever
from strategies.retrievers.corpus import Corpus
from strategies.retrievers.lucene import PassageStore, declared_class, searcher, searcher_class

BM25_K1 = 0.9  # Anserini/Pyserini defaults
BM25_B = 0.4
_bm25_set: set[str] = set()


def bm25_batch_search(store: PassageStore, queries: list[Query], k: int, threads: int = 2) -> dict[str, list[Hit]]:
    """Top-k BM25 hits per query, each with its stored passage (Anserini's ScoredDoc carries the document)."""
    s = searcher(store.index_dir)  # starts the JVM (ensure_jvm)
    key = str(store.index_dir)
    if key not in _bm25_set:
        s.set_bm25(BM25_K1, BM25_B)
        _bm25_set.add(key)
    array_list = declared_class("java/util/ArrayList", "()V", add="(Ljava/lang/Object;)Z")
    q_list, id_list = array_list(), array_list()
    for q in queries:
        q_list.add(q.text)
        id_list.add(q.qid)
    results = s.batch_search(q_list, id_list, int(k), int(threads))
    out = {}
    for q in queries:
        hits = []
        for h in results.get(q.qid):
            pid = h.docid
            hits.append(Hit(pid, h.score, *store.of_hit(pid, h)))  # score: already a Python float
        out[q.qid] = hits
    return out


class BM25(Retriever):
    code_version = "bm25-1"
    per_query = True

    def __init__(self, name: str, k: int):
        super().__init__(name)
        self.k = k
        self.store: PassageStore | None = None

    def start_engine(self) -> None:
        searcher_class()

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.store = PassageStore.of(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        assert self.store is not None, "call prepare() first"
        return bm25_batch_search(self.store, queries, self.k, threads=os.cpu_count() or 2)
