"""BM25 with Pyserini (Lucene) over a locally built index of the corpus.

The index is built once per corpus hash (atomically: built in a temporary folder, then renamed)
and reused by every experiment. Search goes through Anserini's SimpleSearcher via Pyserini's
pyjnius bridge, avoiding the ~16 s import of `pyserini.search.lucene` (it pulls in torch).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ragledger.atomic import COMPLETE_MARKER, publish_dir
from tasks.retrievers.base import Corpus, Hit, LLMFn, Query, Retriever

BM25_K1 = 0.9  # Anserini/Pyserini defaults
BM25_B = 0.4
_searchers: dict[str, object] = {}
_declared: dict[str, type] = {}  # Java class name -> its pyjnius class (_declared_class)
SEARCHER_CLASS = "io/anserini/search/SimpleSearcher"
_lock = threading.Lock()


def build_bm25_index(corpus: Corpus, index_root: Path, threads: int = 2, log=print) -> Path:
    """The corpus's index, built once; and the JVM's start-up cache, trained on it once per machine (ragledger/java.py)."""
    target = index_root / f"bm25-{corpus.corpus_hash}"
    if not (target / COMPLETE_MARKER).exists():
        _build(corpus, target, index_root, threads, log)
    from ragledger.java import keep_start_cache, start_cache_wanted

    if start_cache_wanted():
        log("preparing the JVM's start-up cache (one time) ...")
        keep_start_cache(target)
    return target


def _build(corpus: Corpus, target: Path, index_root: Path, threads: int, log) -> None:
    from ragledger.java import ensure_jvm

    ensure_jvm()
    from jnius import autoclass

    index_root.mkdir(parents=True, exist_ok=True)
    log(f"building BM25 index over {len(corpus.passages):,} passages (one time) ...")
    work = Path(tempfile.mkdtemp(prefix=".bm25-build-", dir=index_root))
    try:
        docs = work / "docs"
        docs.mkdir()
        with (docs / "corpus.jsonl").open("w", encoding="utf-8") as fh:
            for pid, title, text in corpus.passages[["pid", "title", "text"]].itertuples(index=False):
                fh.write(json.dumps({"id": pid, "contents": f"{title}\n{text}"}) + "\n")
        index_dir = work / "index"
        autoclass("io.anserini.index.IndexCollection").main(
            ["-collection", "JsonCollection", "-input", str(docs), "-index", str(index_dir),
             "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
             "-storePositions", "-storeDocvectors", "-storeRaw", "-quiet"]
        )  # fmt: skip
        publish_dir(index_dir, target, corpus.corpus_hash)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"BM25 index ready: {target}")


def _declared_class(java_name: str, constructor: str, **methods: str) -> type:
    """A Java class declared to pyjnius with one constructor and the named methods (JNI signatures), once per process,
    the JVM started for it (ensure_jvm). pyjnius' autoclass would reflect every method of the class and its
    superclasses into Python objects: 0.64 s holding the GIL for SimpleSearcher, measured, on the way to a run's first
    model call; a declaration takes a few milliseconds. pyjnius keeps one class per Java class name: a full one
    already made in this process is used as it is, and after a declaration an autoclass of that class in this process
    gets the declared members only."""
    with _lock:
        if java_name not in _declared:
            from ragledger.java import ensure_jvm

            ensure_jvm()
            from jnius import JavaClass, JavaMethod, MetaJavaClass

            made = MetaJavaClass.get_javaclass(java_name, classparams=(True, True))
            if made is None:
                namespace = {"__module__": __name__, "__javaclass__": java_name,
                             "__javaconstructor__": [(constructor, False)],
                             **{name: JavaMethod(signature) for name, signature in methods.items()}}
                made = MetaJavaClass(java_name.rsplit("/", 1)[-1], (JavaClass,), namespace)
            _declared[java_name] = made
        return _declared[java_name]


def _searcher_class():
    """Anserini's SimpleSearcher with the three members used here (tests/test_retrievers.py checks its hits against
    pyserini's own LuceneSearcher). ragledger never imports pyserini.search.lucene (it imports torch, and would make a
    full class first); a test comparing with it does so in another process."""
    return _declared_class(SEARCHER_CLASS, "(Ljava/lang/String;)V",  # SimpleSearcher(String indexDir)
                           set_bm25="(FF)V",  # setBM25(float k1, float b)
                           # batch_search(List<String> queries, List<String> qids, int k, int threads): Map<String, ScoredDoc[]>
                           batch_search="(Ljava/util/List;Ljava/util/List;II)Ljava/util/Map;")


def _searcher(index_dir: Path):
    key = str(index_dir)
    cls = _searcher_class()
    with _lock:
        if key not in _searchers:
            searcher = cls(key)
            searcher.set_bm25(BM25_K1, BM25_B)
            _searchers[key] = searcher
        return _searchers[key]


def bm25_batch_search(index_dir: Path, queries: list[Query], k: int, threads: int = 2) -> dict[str, list[tuple[str, float]]]:
    searcher = _searcher(index_dir)  # starts the JVM (ensure_jvm)
    array_list = _declared_class("java/util/ArrayList", "()V", add="(Ljava/lang/Object;)Z")
    q_list, id_list = array_list(), array_list()
    for q in queries:
        q_list.add(q.text)
        id_list.add(q.qid)
    results = searcher.batch_search(q_list, id_list, int(k), int(threads))
    return {q.qid: [(h.docid, h.score) for h in results.get(q.qid)] for q in queries}  # score: already a Python float


class BM25(Retriever):
    code_version = "bm25-1"
    per_query = True

    def __init__(self, name: str, k: int):
        super().__init__(name)
        self.k = k
        self.corpus: Corpus | None = None
        self.index_dir: Path | None = None

    def start_engine(self) -> None:
        _searcher_class()

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.corpus = corpus
        self.index_dir = build_bm25_index(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        assert self.corpus is not None and self.index_dir is not None, "call prepare() first"
        ranked = bm25_batch_search(self.index_dir, queries, self.k, threads=os.cpu_count() or 2)
        texts = self.corpus.reader_texts()
        return {qid: [Hit(pid, score, *texts[pid]) for pid, score in hits] for qid, hits in ranked.items()}
