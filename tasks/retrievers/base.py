"""What a retriever is, and the corpus it searches."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragledger.atomic import atomic_path
from ragledger.hashing import stable_hash
from ragledger.paths import cache_home, file_identity, resolve_data_path

if TYPE_CHECKING:  # pandas is imported where a corpus is read: the spec's check of retriever names needs none
    import pandas as pd

log = logging.getLogger(__name__)

# names the passage tables kept in the cache home: a new one when the corpus loaders or Corpus.from_frame's hash change
CORPUS_TABLE_VERSION = "corpus-table-1"


@dataclass(frozen=True)
class Hit:
    pid: str
    score: float | None
    title: str
    text: str  # exactly as the reader will see it


@dataclass(frozen=True)
class Query:
    qid: str
    text: str
    gold_pids: tuple[str, ...] = ()  # the question's gold paragraphs, where the dataset knows them (`gold(...)`)
    answers: tuple[str, ...] = ()  # its gold answers: `gold(...)` inserts when none occurs in the retrieved text


@dataclass(frozen=True)
class LLMPrompt:
    """One model call a retriever needs (compression, GenRead); sampling comes from the spec."""

    system: str
    prompt: str
    max_tokens: int


# Runs a batch of prompts on the experiment's model (cached, concurrent) and returns the outputs in order.
LLMFn = Callable[[list[LLMPrompt]], list[str]]


def reader_text(title: str, text: str) -> str:
    """The passage text a reader sees: its title, then its paragraph."""
    return f"{title}: {text}" if title else text


_build_lock = threading.Lock()


@dataclass
class Corpus:
    passages: pd.DataFrame  # pid, title, text
    corpus_hash: str

    @classmethod
    def from_frame(cls, df: pd.DataFrame) -> Corpus:
        df = df[["pid", "title", "text"]].reset_index(drop=True)
        h = stable_hash("corpus", df["pid"].tolist(), df["title"].tolist(), df["text"].tolist())
        return cls(df, h)

    @classmethod
    def load(cls, name: str, paths: tuple[str, ...]) -> Corpus:
        """The spec's corpus, read and hashed once per process: the plan needs its hash for the retrieve keys, and the
        stages (and a cached rerun's check) need the same corpus, so they share one load. The load is named by the
        kept table's path too (the files' identities), so a file changed within a process is read afresh."""
        return _load_corpus(name, tuple(paths), corpus_table_path(name, tuple(paths)))

    def lookup(self) -> dict[str, tuple[str, str]]:
        # built once per process under a lock: every retrieval shard task asks for it at the same moment, and
        # column .tolist() rather than iterating Arrow-backed columns element by element (measured: half a
        # second per build for the 20,963 SQuAD paragraphs, paid by each of the shard threads)
        with _build_lock:
            if not hasattr(self, "_lookup"):
                pairs = zip(self.passages["title"].tolist(), self.passages["text"].tolist(), strict=True)
                self._lookup = dict(zip(self.passages["pid"].tolist(), pairs, strict=True))
        return self._lookup

    def reader_texts(self) -> dict[str, tuple[str, str]]:
        """pid -> (title, text as the reader sees it), built once: hot in every retriever's result loop."""
        lookup = self.lookup()
        with _build_lock:
            if not hasattr(self, "_reader"):
                self._reader = {pid: (title, reader_text(title, text)) for pid, (title, text) in lookup.items()}
        return self._reader

    def hit(self, pid: str, score: float | None) -> Hit:
        title, text = self.reader_texts()[pid]
        return Hit(pid, score, title, text)


class Retriever(ABC):
    """A named retriever. `name` is the spec string (e.g. `bm25@5`), which also labels its cell."""

    code_version: str = "1"
    needs_corpus: bool = True  # False: closed book, parametric (no index to build)
    needs_llm: bool = False  # True: retrieve() must be given an LLMFn (compression, parametric)
    # True: a query's hits do not depend on the other queries of the batch (a lexical index; not an encoder, whose
    # batch padding moves scores in the last bits), so a shard may be retrieved in parts (flows/warmup.py)
    per_query: bool = False

    def __init__(self, name: str):
        self.name = name

    def start_engine(self) -> None:  # noqa: B027 (optional hook)
        """Start what searching needs before the corpus and its index are known (BM25: the JVM and Anserini's searcher
        class, ~1 s). A run's warm-up calls it in a thread of its own while it reads the dataset (flows/warmup.py)."""

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:  # noqa: B027 (optional hook)
        """Build or open whatever index this retriever needs (cached by corpus hash)."""

    @abstractmethod
    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        """Top hits per query id, best first. `llm` is required when `needs_llm`."""


def corpus_table_path(name: str, paths: tuple[str, ...]) -> Path | None:
    """Where this machine keeps the corpus's passage table and hash: in the cache home beside the indexes, named by
    the corpus files' paths, sizes and modification times, so a changed file is read and hashed afresh. None when a
    file is missing (the load reports it)."""
    files = []
    for path in paths:
        p = resolve_data_path(path)
        if not p.is_file():
            return None
        files.append(file_identity(p))
    if not files:
        return None
    return cache_home() / "corpora" / f"{stable_hash(CORPUS_TABLE_VERSION, name, files)}.parquet"


def corpus_hash_of(name: str, paths: tuple[str, ...]) -> str:
    """The corpus's content hash. From the kept table's footer when there is one: planning a run (its retrieve keys
    hold the hash) and answering a cached rerun from the store read no passage."""
    kept = corpus_table_path(name, paths)
    if kept is not None and kept.exists():
        import pyarrow.parquet as pq

        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return pq.read_schema(kept).metadata[b"corpus_hash"].decode()
    return Corpus.load(name, paths).corpus_hash


@functools.lru_cache(maxsize=4)
def _load_corpus(name: str, paths: tuple[str, ...], kept: Path | None) -> Corpus:
    """The corpus from the table kept on this machine (a Parquet read: ~0.1 s for the 20,963 SQuAD paragraphs,
    against ~1.3 s to parse the SQuAD JSON files and hash every passage), else from its files, keeping the table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragledger.datasets import load_corpus

    if kept is not None and kept.exists():
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # unreadable: read the files again
            table = pq.read_table(kept)
            return Corpus(table.to_pandas(), table.schema.metadata[b"corpus_hash"].decode())
    corpus = Corpus.from_frame(load_corpus(name, list(paths)))
    if kept is not None:
        try:  # a cache: one that cannot be kept is read again next time, the corpus is loaded either way
            table = pa.Table.from_pandas(corpus.passages, preserve_index=False)
            table = table.replace_schema_metadata({**table.schema.metadata, b"corpus_hash": corpus.corpus_hash.encode()})
            with atomic_path(kept) as tmp:
                pq.write_table(table, tmp)
        except Exception as exc:
            log.debug("corpus table not kept at %s: %s", kept, exc)
    return corpus
