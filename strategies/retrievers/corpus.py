"""The corpus a run retrieves from, never held in memory: its identity (`corpus_hash`), its passages streamed in
order (to build an index), and, once indexed, its passages read by id from disk (strategies/retrievers/lucene.py
`PassageStore`: the Lucene index's stored documents, for the hits a run needs only).

Sources (the spec's `corpus.name`, docs/spec.md):
- `squad-paragraphs`, `jsonl`, `dpr-tsv`: passage files. ragledger builds one Lucene index of them per corpus hash
  (the BM25 index, with every document stored raw), which is also where a run reads passages from.
- `lucene`: an existing Lucene index with stored documents (`-storeRaw`, as Pyserini's prebuilt indexes have
  them), searched and read in place.
- `prebuilt`: a Pyserini prebuilt index by name, fetched into and read from Pyserini's own cache by Pyserini.

The corpus hash of a passage file is content-defined (every id, title and text, in order) and computed once per
file identity, streaming, then kept beside the indexes; that of an index is the identity of its files (names,
sizes and each file's Lucene checksum footer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import tempfile
import threading
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # the C encoder json.dumps uses for a str
from pathlib import Path

from core.atomic import atomic_write_text
from core.datasets import CORPUS_FORMATS, DatasetError, PassageBatch, check_unique_ids, iter_corpus, iter_corpus_batches, pid_hash
from core.hashing import stable_hash
from core.paths import cache_home, file_identity, resolve_data_path

logger = logging.getLogger(__name__)

# the corpus kinds searched in place (passage file formats are core/datasets.py CORPUS_FORMATS)
INDEX_KINDS = {"lucene": "an existing Lucene index with stored documents (`-storeRaw`), searched in place; `paths`: "
                         "its folder",
               "prebuilt": "a Pyserini prebuilt index by name (e.g. wikipedia-dpr-100w), fetched into Pyserini's cache"}


def corpus_kinds() -> tuple[str, ...]:
    """Every `corpus.name` a spec may give: the registered passage file formats, then the index kinds."""
    return (*CORPUS_FORMATS, *INDEX_KINDS)

# names what is kept per corpus file identity (its hash and size): a new one when the readers or the hash change
CORPUS_INFO_VERSION = "corpus-info-1"
LUCENE_FOOTER_BYTES = 16  # every Lucene file ends with a codec footer holding its CRC32 checksum
PROGRESS_EVERY = 1_000_000  # passages between progress lines of the one-time read


class CorpusError(DatasetError):
    """A corpus that cannot be read as given; the message names the file, index or field and what to do."""


@dataclass(frozen=True)
class Corpus:
    name: str  # one of corpus_kinds()
    paths: tuple[str, ...]  # the passage files, or the one index folder (`lucene`), or the index name (`prebuilt`)
    passages_hash: str  # the passages' identity: names the indexes built of them
    passages: int | None  # known for passage files (counted while hashing); an index says it when opened
    index_dir: Path | None = None  # `lucene` and `prebuilt`: the index that holds the corpus
    faiss: Path | None = None  # a FAISS index directory in Pyserini's layout that `dense@k` searches (corpus.faiss)
    anserini_ready: bool = False  # a JSON-lines file of {id, contents} rows only: an index build reads it in place

    @property
    def corpus_hash(self) -> str:
        """What the retrieve keys hold: the passages, and the FAISS directory dense retrieval searches when given."""
        return self.passages_hash if self.faiss is None else stable_hash(self.passages_hash, index_hash(self.faiss))

    @classmethod
    def of_spec(cls, spec, log=None) -> Corpus:  # spec: schemas.spec.CorpusSpec (schemas sits above this layer)
        """The corpus a spec's `corpus` block (schemas.spec.CorpusSpec) names."""
        return cls.load(spec.name, tuple(spec.paths), spec.faiss, log=log)

    @classmethod
    def load(cls, name: str, paths: tuple[str, ...], faiss: str | None = None, log=None, tee=None) -> Corpus:
        """The spec's corpus: its hash and size, kept per file identity (a passage file is read and hashed once on
        this machine, saying so to `log`) or computed from an index's files. Nothing of the passages stays in memory.
        `tee`, when given, is handed every batch of that one read as a `JsonBatch`, as it is read (an index
        built from the same read: strategies/retrievers/lucene.py `load_with_index`); it is not called when the
        corpus is already named on this machine (`named`)."""
        if name not in corpus_kinds():
            raise CorpusError(f"corpus.name: unknown corpus kind {name!r}; known: {', '.join(corpus_kinds())}")
        faiss_dir = _faiss_dir(faiss) if faiss else None
        if name in INDEX_KINDS:
            index_dir = _index_dir(name, paths)
            return cls(name, tuple(paths), index_hash(index_dir), None, index_dir, faiss_dir)
        key = (name, tuple(paths), _identity(name, tuple(paths)))
        with _memo_lock:
            if key not in _memo:
                _memo[key] = _file_corpus(*key, log=log, tee=tee)
            return dataclasses.replace(_memo[key], faiss=faiss_dir)

    @staticmethod
    def named(name: str, paths: tuple[str, ...]) -> bool:
        """Whether these passage files are named on this machine already (their hash kept, or read in this process):
        loading them then reads no passage."""
        key = (name, tuple(paths), _identity(name, tuple(paths)))
        with _memo_lock:
            if key in _memo:
                return True
        return _kept_info(name, key[2]).exists()

    @property
    def built_here(self) -> bool:
        """True for passage files: ragledger builds (and owns) their Lucene index."""
        return self.index_dir is None

    def stream(self) -> Iterator[tuple[str, str, str]]:
        """(pid, title, text) of every passage, in file order, in constant memory (passage files only: an index
        corpus is read through its index, strategies/retrievers/lucene.py)."""
        if not self.built_here:
            raise CorpusError(f"corpus {self.paths[0]}: an index corpus is read through its index, not streamed")
        for _, pid, title, text in iter_corpus(self.name, list(self.paths)):
            yield pid, title, text

    def batches(self) -> Iterator[PassageBatch]:
        """The passages of `stream`, a batch of a few thousand at a time."""
        if not self.built_here:
            raise CorpusError(f"corpus {self.paths[0]}: an index corpus is read through its index, not streamed")
        yield from iter_corpus_batches(self.name, list(self.paths))


def _identity(name: str, paths: tuple[str, ...]) -> tuple:
    files = []
    for path in paths:
        p = resolve_data_path(path)
        if not p.is_file():
            raise CorpusError(f"corpus.paths: {p}: file not found: put the {name} file there, or give another corpus "
                              "with --corpus KIND:PATH or the spec's corpus block (e.g. --corpus prebuilt:wikipedia-dpr-100w, "
                              "Pyserini's index of DPR's Wikipedia, or --corpus squad-paragraphs; docs/spec.md, Corpora)")
        files.append(file_identity(p))
    if not files:
        raise CorpusError("corpus.paths: no file given")
    return tuple(files)


# (name, paths, the files' identity) -> Corpus: one read per process, and a file changed within a process is read afresh
_memo: dict[tuple, Corpus] = {}
_memo_lock = threading.Lock()


def _kept_info(name: str, identity: tuple) -> Path:
    return cache_home() / "corpora" / f"{stable_hash(CORPUS_INFO_VERSION, name, identity)}.json"


def _file_corpus(name: str, paths: tuple[str, ...], identity: tuple, log=None, tee=None) -> Corpus:
    """Read from what this machine kept for these files (their identity names it), else streamed and hashed once."""
    kept = _kept_info(name, identity)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        info = json.loads(kept.read_text())
        return Corpus(name, paths, str(info["corpus_hash"]), int(info["passages"]),
                      anserini_ready=bool(info["anserini_ready"]))
    if log is not None:
        log(f"reading the {name} corpus once on this machine to name it by its content ({', '.join(paths)}) ...")
    shape: dict = {}
    corpus_hash, count = stream_hash(name, paths, log, shape, tee)
    ready = bool(shape.get("contents_only"))
    try:  # a cache: one that cannot be kept is computed again next time
        kept.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(kept, json.dumps({"corpus_hash": corpus_hash, "passages": count, "anserini_ready": ready,
                                            "name": name, "files": [str(f[0]) for f in identity]}))
    except OSError as exc:
        logger.debug("corpus hash not kept at %s: %s", kept, exc)
    return Corpus(name, paths, corpus_hash, count, anserini_ready=ready)


def stream_hash(name: str, paths: tuple[str, ...], log=None, shape: dict | None = None, tee=None) -> tuple[str, int]:
    """The corpus hash, streamed: the same value as `stable_hash("corpus", pids, titles, texts)` over the whole
    corpus (core/hashing.py: sha256 of the JSON of the three lists), without holding them. The ids go to the
    hash as they come; titles and texts are spooled to two temporary files and appended after them. Every row is
    checked on the way (tasks: core/datasets.py `iter_corpus`), duplicate ids too, in 8 bytes a passage. Each batch
    goes to `tee` too, when given, encoded once for both (`JsonBatch`, Corpus.load)."""
    sha = hashlib.sha256(b'["corpus", [')
    hashes = array("Q")
    count = 0
    spool_dir = _spool_dir()
    with tempfile.TemporaryFile(dir=spool_dir) as titles, tempfile.TemporaryFile(dir=spool_dir) as texts:
        # a batch at a time: one hash update and one write per batch of a few thousand passages, not per passage
        for batch in iter_corpus_batches(name, list(paths), shape):
            encoded = JsonBatch(batch)
            if tee is not None:
                tee(encoded)
            sep = b", " if count else b""
            sha.update(sep + encoded.json_list(encoded.pids))
            titles.write(sep + encoded.json_list(encoded.titles))
            texts.write(sep + encoded.json_list(encoded.texts))
            hashes.extend([pid_hash(pid) for pid in batch.pids])
            before, count = count, count + len(batch.pids)
            if log is not None and count // PROGRESS_EVERY > before // PROGRESS_EVERY:
                log(f"  {count:,} passages read")
        check_unique_ids(name, list(paths), hashes)
        for spool, opening in ((titles, b"], ["), (texts, b"], [")):
            sha.update(opening)
            spool.seek(0)
            for block in iter(functools.partial(spool.read, 1 << 20), b""):
                sha.update(block)
    sha.update(b"]]")
    return sha.hexdigest()[:32], count


class JsonBatch:
    """A batch of passages as JSON strings, each what json.dumps(value, ensure_ascii=False) writes, in UTF-8, without
    its quotes; a column is its strings joined by b"\n" (a string never holds one: a line break is written `\\n`).
    The corpus hash takes them as JSON lists (`json_list`), an index build's lines interleave them
    (strategies/retrievers/lucene.py `anserini_lines`): each value is encoded once for both."""

    def __init__(self, batch: PassageBatch):
        utf8 = batch.utf8 or (None, None, None)
        self.size = len(batch.pids)
        self.pids, self.titles, self.texts = (json_strings(values, joined) for values, joined in
                                              zip((batch.pids, batch.titles, batch.texts), utf8, strict=True))
        # Anserini's contents are "title\ntext": a title's own line breaks become spaces (lucene.py `anserini_lines`)
        self.one_line_titles = self.titles if utf8[1] is not None or "\n" not in "".join(batch.titles) else \
            json_strings([title.replace("\n", " ") for title in batch.titles])

    @staticmethod
    def json_list(column: bytes) -> bytes:
        """The column's strings as the items of a JSON list, `"a", "b"` (json.dumps' separator)."""
        return b'"' + column.replace(b"\n", b'", "') + b'"'


_CONTROL = bytes(range(32))  # written as escapes by json.dumps, as \\ and \" are


def json_strings(values: list[str], joined: bytes | None = None) -> bytes:
    """`values` as JSON strings (`JsonBatch`), joined by b"\n". `joined`, when given, is the values in UTF-8 joined
    by b"\n" already, none holding one. Over the whole batch at once when no value holds a control character
    (nothing to escape but backslashes and quotes); else one value at a time by json's own encoder."""
    if joined is None:
        text = "\n".join(values)
        joined = text.encode("utf-8") if text.count("\n") == len(values) - 1 else None  # else a value holds a \n
    if joined is not None and len(joined.translate(None, _CONTROL)) == len(joined) - len(values) + 1:
        return joined.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return b"\n".join([_json(value)[1:-1] for value in values])


def _spool_dir() -> Path | None:
    """Beside the kept hashes (a corpus's text is spooled there: the same disk as the indexes), or the system's temporary
    folder when that cannot be written (a user whose cache home is read-only still runs)."""
    folder = cache_home() / "corpora"
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
    return folder if os.access(folder, os.W_OK) else None


def _json(value: str) -> bytes:
    """json.dumps(value, ensure_ascii=False) of a string, without building an encoder per call (a tenth of the time)."""
    return encode_basestring(value).encode("utf-8")


def _index_dir(name: str, paths: tuple[str, ...]) -> Path:
    if len(paths) != 1:
        raise CorpusError(f"corpus.paths: a {name} corpus is one {'index folder' if name == 'lucene' else 'index name'}, "
                          f"got {len(paths)}")
    if name == "prebuilt":
        return prebuilt_index(paths[0])
    folder = resolve_data_path(paths[0])
    if not folder.is_dir():
        raise CorpusError(f"corpus.paths: {folder}: no such index folder (give an existing Lucene index with stored "
                          "documents, e.g. one built by `python -m pyserini.index.lucene ... --storeRaw`)")
    if not any(folder.glob("segments_*")):
        raise CorpusError(f"corpus.paths: {folder}: not a Lucene index (no segments_N file)")
    return folder


def _faiss_dir(path: str) -> Path:
    folder = resolve_data_path(path)
    if not folder.is_dir():
        raise CorpusError(f"corpus.faiss: {folder}: no such FAISS index directory (Pyserini's layout: 'index' and 'docid')")
    for name in ("index", "docid"):
        if not (folder / name).is_file():
            raise CorpusError(f"corpus.faiss: {folder}: no {name!r} file (Pyserini's FAISS layout: 'index' and 'docid', "
                              "one passage id per line)")
    return folder


def prebuilt_index(index_name: str) -> Path:
    """A Pyserini prebuilt index by name, from Pyserini's cache ($PYSERINI_CACHE or ~/.cache/pyserini/indexes),
    fetched there by Pyserini itself when missing and this machine can reach its servers."""
    from engines.java import ensure_jvm

    ensure_jvm()  # Pyserini's index tables are read from Anserini's jar: its JVM must be ragledger's (Java 21)
    from pyserini import util

    info = _prebuilt_info(index_name)
    if info is None:
        raise CorpusError(f"corpus.paths: {index_name!r} is not a Pyserini prebuilt index name (e.g. wikipedia-dpr-100w; "
                          "`python -c 'from pyserini.prebuilt_index_info import TF_INDEX_INFO; print(*TF_INDEX_INFO)'`)")
    folder = Path(util.get_cache_home()) / "indexes" / f"{info['filename'].removesuffix('.tar.gz')}.{info['md5']}"
    if folder.is_dir():
        return folder
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Pyserini prints its download attempts
            return Path(util.download_prebuilt_index(index_name, verbose=False))
    except Exception as exc:  # no network, a refused download, a failed checksum
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}" if str(exc) else type(exc).__name__
        raise CorpusError(f"corpus.paths: the Pyserini prebuilt index {index_name!r} is not in Pyserini's cache ({folder}) "
                          f"and could not be fetched ({why}); place the unpacked index there, or give it as "
                          "corpus {name: lucene, paths: [FOLDER]}") from None


def _prebuilt_info(index_name: str) -> dict | None:
    from pyserini import prebuilt_index_info as known

    for table in (known.TF_INDEX_INFO, known.IMPACT_INDEX_INFO):
        if index_name in table and "filename" in table[index_name]:
            return table[index_name]
    return None


def index_hash(folder: Path) -> str:
    """A Lucene index's identity: each file's name, size and codec footer (its CRC32), so a rebuilt or changed
    index is a new corpus while reading no document."""
    parts = []
    for f in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != "write.lock"):
        size = f.stat().st_size
        with f.open("rb") as fh:
            fh.seek(max(0, size - LUCENE_FOOTER_BYTES))
            parts.append([f.name, size, fh.read().hex()])
    return stable_hash("lucene-index", parts)


def corpus_label(corpus: Corpus) -> str:
    """How logs name the corpus."""
    what = corpus.paths[0] if len(corpus.paths) == 1 else f"{len(corpus.paths)} files"
    size = f"{corpus.passages:,} passages, " if corpus.passages is not None else ""
    return f"{corpus.name} {os.path.basename(what) or what} ({size}hash {corpus.corpus_hash[:12]})"
