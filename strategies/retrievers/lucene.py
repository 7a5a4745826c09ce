"""The corpus's Lucene index: built once per corpus hash from passage files (atomically: in a temporary folder, then
renamed), or the index the corpus is (`lucene`, `prebuilt`); searched with BM25 (strategies/retrievers/bm25.py), and read
by passage id (`PassageStore`), so no run holds the corpus in memory.

Everything goes through Anserini's SimpleSearcher via Pyserini's pyjnius bridge, declared with only the members used
here (`_declared_class`), avoiding the ~16 s import of `pyserini.search.lucene` (it pulls in torch).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from core.atomic import COMPLETE_MARKER, publish_dir
from core.paths import resolve_data_path
from strategies.retrievers.base import Hit, reader_text
from strategies.retrievers.corpus import Corpus, CorpusError, JsonBatch, corpus_label

SEARCHER_CLASS = "io/anserini/search/SimpleSearcher"
_searchers: dict[str, object] = {}
_declared: dict[str, type] = {}  # Java class name -> its pyjnius class (_declared_class)
_lock = threading.Lock()
RECENT_PASSAGES = 65_536


def lucene_index(corpus: Corpus, index_root: Path, threads: int = 2, log=print) -> Path:
    """The Lucene index holding the corpus: the given one for an index corpus; for passage files the one ragledger
    built (once per corpus hash) and the JVM's start-up cache trained on it once per machine (engines/java.py)."""
    if not corpus.built_here:
        assert corpus.index_dir is not None
        return corpus.index_dir
    target = _built_index(index_root, corpus.passages_hash)
    if not (target / COMPLETE_MARKER).exists():
        _build(corpus, target, index_root, threads, log)
    from engines.java import keep_start_cache, start_cache_wanted

    if start_cache_wanted():
        log("preparing the JVM's start-up cache (one time) ...")
        keep_start_cache(target)
    return target


def _built_index(index_root: Path, passages_hash: str) -> Path:
    return index_root / f"bm25-{passages_hash}"


# passage files always converted for Anserini (a JSON-lines file may be its input as it is: known once read)
INDEXED_WHILE_NAMED = ("squad-paragraphs", "dpr-tsv")


def load_with_index(name: str, paths: tuple[str, ...], faiss: str | None, index_root: Path, threads: int = 2,
                    log=print) -> Corpus:
    """The corpus (Corpus.load), for a caller that is about to search it. Passage files this machine has not named
    yet are read once for both: the read that names them by their content also feeds Anserini's indexer, the index
    published under the hash that read gives. Otherwise the corpus as Corpus.load gives it (its index built, when
    missing, by `lucene_index`)."""
    if name not in INDEXED_WHILE_NAMED or Corpus.named(name, paths):
        return Corpus.load(name, paths, faiss, log=log)
    from engines.java import ensure_jvm

    ensure_jvm()
    index_root.mkdir(parents=True, exist_ok=True)
    log(f"building the Lucene index of the {name} corpus as it is read (one time) ...")
    work = Path(tempfile.mkdtemp(prefix=".bm25-build-", dir=index_root))
    fed = [0]

    def read(write) -> Corpus:  # the corpus's one read, each batch also written for Anserini
        def tee(batch: JsonBatch) -> None:
            fed[0] += batch.size
            write(anserini_lines(batch))

        return Corpus.load(name, paths, faiss, log=log, tee=tee)

    try:
        docs, index_dir = work / "docs", work / "index"
        docs.mkdir()
        with PipeFeed(docs / "corpus.jsonl", read) as feed:
            _index_collection(docs, index_dir, threads)
        corpus = feed.result
        target = _built_index(index_root, corpus.passages_hash)
        if fed[0] == corpus.passages and not (target / COMPLETE_MARKER).exists():  # named meanwhile: not fed
            publish_dir(index_dir, target, corpus.passages_hash)
            log(f"Lucene index ready: {target}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return corpus


def _build(corpus: Corpus, target: Path, index_root: Path, threads: int, log) -> None:
    """Index the passages with Anserini's JsonCollection (`contents` is "title\\ntext", the raw document stored), then
    publish the index. A JSON-lines file already in Anserini's shape is read in place; any other corpus is converted
    as Lucene indexes it, into a named pipe Anserini reads as its one file (`PipeFeed`): no pass over the corpus
    before the build, nothing written to disk but the index. Memory stays flat: a batch of passages, and Lucene's
    own buffers."""
    from engines.java import ensure_jvm

    ensure_jvm()
    index_root.mkdir(parents=True, exist_ok=True)
    log(f"building the Lucene index of {corpus_label(corpus)} (one time) ...")
    work = Path(tempfile.mkdtemp(prefix=".bm25-build-", dir=index_root))
    try:
        docs, index_dir = work / "docs", work / "index"
        docs.mkdir()
        given = resolve_data_path(corpus.paths[0])
        if corpus.anserini_ready and given.suffix == ".jsonl":  # already Anserini's input: read in place, not rewritten
            (docs / "corpus.jsonl").symlink_to(given)
            _index_collection(docs, index_dir, threads)
        else:
            def produce(write: Callable[[bytes], object]) -> None:
                for batch in corpus.batches():
                    write(anserini_lines(JsonBatch(batch)))

            with PipeFeed(docs / "corpus.jsonl", produce):
                _index_collection(docs, index_dir, threads)
        publish_dir(index_dir, target, corpus.passages_hash)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"Lucene index ready: {target}")


def _index_collection(docs: Path, index_dir: Path, threads: int) -> None:
    """Anserini's IndexCollection over the JSON-lines files in `docs`: positions, doc vectors and raw documents, as
    `python -m pyserini.index.lucene` builds them (pyjnius releases the GIL while Java runs: a feed thread runs)."""
    from jnius import autoclass

    autoclass("io.anserini.index.IndexCollection").main(
        ["-collection", "JsonCollection", "-input", str(docs), "-index", str(index_dir),
         "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
         "-storePositions", "-storeDocvectors", "-storeRaw", "-quiet"]
    )  # fmt: skip


# a line's pieces around its three JSON strings (JsonBatch): {"id": "PID", "contents": "TITLE\nTEXT"}
_LINE = (b'{"id": "', None, b'", "contents": "', None, b"\\n", None, b'"}\n')


def anserini_lines(batch: JsonBatch) -> bytes:
    """A batch of passages as JsonCollection lines `{"id": pid, "contents": "title\\ntext"}`, byte for byte what
    json.dumps(..., ensure_ascii=False) writes (Anserini reads them as UTF-8 and stores each document as Jackson
    writes it again, so the escapes chosen do not reach the index). A title's own line breaks would move the
    title/text boundary of the stored document: they become spaces (`JsonBatch.one_line_titles`). Built from the
    batch's encoded columns with list operations, not a string per passage."""
    parts = list(_LINE) * batch.size
    parts[1::7] = batch.pids.split(b"\n")
    parts[3::7] = batch.one_line_titles.split(b"\n")
    parts[5::7] = batch.texts.split(b"\n")
    return b"".join(parts)


class _Stopped(Exception):
    """The reader is gone: the producer is told so at its next write."""


class PipeFeed:
    """A named pipe that a reader (Anserini's indexer) opens as a file, written by `produce(write)` in a thread of its
    own while the reader consumes it, on the other core; what `produce` returns is `result`. On leaving, a reader
    that stopped early, or never opened the pipe, is found out: the producer is released (its next write raises,
    the pipe is drained meanwhile) and the build fails, as it does when producing failed (a malformed row: its
    DatasetError)."""

    def __init__(self, path: Path, produce: Callable[[Callable[[bytes], object]], object]):
        os.mkfifo(path)
        self.path, self.produce = path, produce
        self.result: object = None
        self.error: BaseException | None = None
        self.complete = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="anserini-feed", daemon=True)

    def __enter__(self) -> PipeFeed:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            with open(self.path, "wb", buffering=1 << 20) as out:  # waits for the reader to open the pipe

                def write(chunk: bytes) -> None:
                    if self.stop.is_set():
                        raise _Stopped
                    out.write(chunk)

                self.result = self.produce(write)
            self.complete = True
        except (_Stopped, BrokenPipeError) as exc:  # the reader left before the end: not complete
            if exc.__context__ is not None and not isinstance(exc.__context__, (_Stopped, BrokenPipeError)):
                self.error = exc.__context__  # producing failed first; closing the pipe then found the reader gone
        except BaseException as exc:
            self.error = exc

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.thread.is_alive():
            self._release()
        self.thread.join()
        if exc_type is not None:
            return
        if self.error is not None:
            raise self.error
        if not self.complete:
            raise CorpusError(f"the Lucene indexer stopped before reading every passage from {self.path}")

    def _release(self) -> None:
        """Open the pipe's reading end ourselves and drain it until the producer, told to stop, has left."""
        self.stop.set()
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            while self.thread.is_alive():
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 1 << 20)
                self.thread.join(0.05)
        finally:
            os.close(fd)


def declared_class(java_name: str, constructor: str, **methods: str | list[str]) -> type:
    """A Java class declared to pyjnius with one constructor and the named methods (JNI signatures; a list for an
    overloaded method), once per process, the JVM started for it (ensure_jvm). pyjnius' autoclass would reflect every
    method of the class and its superclasses into Python objects: 0.64 s holding the GIL for SimpleSearcher, measured,
    on the way to a run's first model call; a declaration takes a few milliseconds. pyjnius keeps one class per Java
    class name: a full one already made in this process is used as it is, and after a declaration an autoclass of
    that class in this process gets the declared members only."""
    with _lock:
        if java_name not in _declared:
            from engines.java import ensure_jvm

            ensure_jvm()
            from jnius import JavaClass, JavaMethod, JavaMultipleMethod, MetaJavaClass

            made = MetaJavaClass.get_javaclass(java_name, classparams=(True, True))
            if made is None:
                members = {name: JavaMultipleMethod([(s, False, False) for s in sig]) if isinstance(sig, list)
                           else JavaMethod(sig) for name, sig in methods.items()}
                namespace = {"__module__": __name__, "__javaclass__": java_name,
                             "__javaconstructor__": [(constructor, False)], **members}
                made = MetaJavaClass(java_name.rsplit("/", 1)[-1], (JavaClass,), namespace)
            _declared[java_name] = made
        return _declared[java_name]


_DOCUMENT = "Lorg/apache/lucene/document/Document;"


def searcher_class():
    """Anserini's SimpleSearcher with the members used here (tests/test_retrievers.py checks its hits against
    pyserini's own LuceneSearcher). ragledger never imports pyserini.search.lucene (it imports torch, and would make a
    full class first); a test comparing with it does so in another process."""
    return declared_class(SEARCHER_CLASS, "(Ljava/lang/String;)V",  # SimpleSearcher(String indexDir)
                          set_bm25="(FF)V",  # setBM25(float k1, float b)
                          # batch_search(List<String> queries, List<String> qids, int k, int threads): Map<String, ScoredDoc[]>
                          batch_search="(Ljava/util/List;Ljava/util/List;II)Ljava/util/Map;",
                          doc=[f"(Ljava/lang/String;){_DOCUMENT}", f"(I){_DOCUMENT}"],  # by passage id, by Lucene number
                          get_total_num_docs="()I")


def searcher(index_dir: Path):
    """One SimpleSearcher per index folder in this process (it starts the JVM, ensure_jvm)."""
    key = str(index_dir)
    cls = searcher_class()
    with _lock:
        if key not in _searchers:
            _searchers[key] = cls(key)
        return _searchers[key]


class PassageStore:
    """A corpus's passages read by id from its Lucene index's stored raw documents: a run reads the passages of its
    hits only. A document is JSON `{"id", "contents"}` whose contents are "title\\ntext" (ragledger's builds, and
    Pyserini's Wikipedia indexes, where the title is in double quotes: `unquote_titles`)."""

    def __init__(self, index_dir: Path, unquote_titles: bool = False):
        self.index_dir, self.unquote_titles = index_dir, unquote_titles
        self._searcher = searcher(index_dir)
        # the passages read last, at most RECENT_PASSAGES (~50 MB): a hit's stored document crosses the JNI bridge as a
        # proxy object and is parsed (docs/performance.md, "Small costs behind the code"), and questions retrieve the
        # same passages again and again (10,570 SQuAD questions x 10 hits name ~1 in 5 passages twice or more);
        # bounded, so memory does not grow with the corpus
        self._recent: dict[str, tuple[str, str]] = {}
        self._recent_lock = threading.Lock()

    @classmethod
    def of(cls, corpus: Corpus, index_root: Path, log=print) -> PassageStore:
        """The corpus's store, one per index in this process (every retriever of a run shares its recent passages):
        the index given (`given`), or the one built here of the passage files."""
        if not corpus.built_here:
            return cls.given(corpus)
        return _store(lucene_index(corpus, index_root, log=log), unquote_titles=False)

    @classmethod
    def given(cls, corpus: Corpus) -> PassageStore:
        """The store of an index corpus (`lucene`, `prebuilt`), its stored documents checked on first opening."""
        assert corpus.index_dir is not None, "a corpus of passage files has no given index"
        return _store(corpus.index_dir, unquote_titles=True)

    def check_stored(self) -> None:
        """An index corpus must store its documents: without them no passage text can be shown to a reader."""
        if int(self._searcher.get_total_num_docs()) == 0:
            raise CorpusError(f"corpus.paths: {self.index_dir}: the Lucene index holds no documents")
        doc = self._searcher.doc(0)
        if doc is None or (doc.get("raw") is None and doc.get("contents") is None):
            raise CorpusError(f"corpus.paths: {self.index_dir}: the Lucene index stores no documents (rebuild it with "
                              "--storeRaw, as `python -m pyserini.index.lucene ... --storeRaw`, or give the passage file)")

    def size(self) -> int:
        return int(self._searcher.get_total_num_docs())

    def passage(self, pid: str) -> tuple[str, str] | None:
        """(title, text as a reader sees it) of one passage, or None when the corpus has no such id."""
        found = self._recent.get(pid)
        if found is None:
            doc = self._searcher.doc(pid)
            if doc is None:
                return None
            found = self.remember(pid, self.parse(doc))
        return found

    def of_hit(self, pid: str, hit) -> tuple[str, str]:
        """(title, reader text) of a search hit with this pid (Anserini's ScoredDoc, which carries its stored document,
        read only when the passage is not among the recent ones: each attribute of a hit is a JNI call)."""
        found = self._recent.get(pid)
        return found if found is not None else self.remember(pid, self.parse(hit.lucene_document))

    def remember(self, pid: str, passage: tuple[str, str]) -> tuple[str, str]:
        with self._recent_lock:
            if len(self._recent) >= RECENT_PASSAGES:
                self._recent.pop(next(iter(self._recent)))  # the oldest (dicts keep insertion order)
            self._recent[pid] = passage
        return passage

    def hit(self, pid: str, score: float | None) -> Hit:
        found = self.passage(pid)
        if found is None:
            raise CorpusError(f"corpus {self.index_dir}: no passage with id {pid!r}")
        return Hit(pid, score, *found)

    def parse(self, doc) -> tuple[str, str]:
        """(title, reader text) of a stored Lucene document: its raw JSON, else its stored contents field."""
        raw = doc.get("raw")
        return document_text(raw, doc.get("contents") if raw is None else None, self.unquote_titles)

    def documents(self):
        """(pid, reader text) of every stored document, in the index's order."""
        for i in range(self.size()):
            doc = self._searcher.doc(i)
            if doc is not None:
                yield doc.get("id"), self.parse(doc)[1]


def document_text(raw: str | None, contents: str | None, unquote_titles: bool) -> tuple[str, str]:
    """(title, reader text) from a stored document: the raw JSON's `contents`, else the stored contents field; its
    first line is the title when there is more than one."""
    if raw is not None:
        try:
            obj = json.loads(raw)
            contents = obj.get("contents", contents) if isinstance(obj, dict) else contents
        except json.JSONDecodeError:
            contents = contents if contents is not None else raw
    title, sep, text = (contents or "").partition("\n")
    if not sep:
        title, text = "", title
    if unquote_titles and len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, reader_text(title, text)


_stores: dict[str, PassageStore] = {}


def _store(index_dir: Path, unquote_titles: bool) -> PassageStore:
    with _lock:
        found = _stores.get(str(index_dir))
    if found is None:
        found = PassageStore(index_dir, unquote_titles)  # outside the lock: it starts the JVM (searcher)
        if unquote_titles:
            found.check_stored()
        with _lock:
            found = _stores.setdefault(str(index_dir), found)
    return found


def iter_passages(corpus: Corpus, store: PassageStore):
    """(pid, reader text) of every passage, in corpus order, streamed: from the passage files, or, for an index
    corpus, from its stored documents (an index build over the whole corpus, such as the dense one)."""
    if corpus.built_here:
        for pid, title, text in corpus.stream():
            yield pid, reader_text(title, text)
        return
    yield from store.documents()
