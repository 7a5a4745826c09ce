"""Embeddings kept on this machine: text -> unit vector of one encoder, in SQLite under the cache home.

An embedding is a function of the encoder and the text alone, like a model call of its request. The semantic answer
match embeds every wrong prediction with its gold answers; the gold answers of a dataset and the short answers readers
give recur in every run on it, and encoding them is the evaluate stage's whole cost (about 10 s of CPU for 2,000
SQuAD questions on 2 cores). Kept here, each distinct text is encoded once per machine, not once per process.

A vector read back is the one first computed for its text, so later runs see exactly the vectors earlier ones did
(an encoder's batch padding can move the last bits of a fresh encoding). The file is a cache: a read or write that
fails (a read-only or full cache home, a damaged file) is logged at debug level and the texts are encoded as usual.
WAL mode lets concurrent runs and Dask workers share it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_CHUNK = 500  # texts per SELECT: under SQLite's bound-parameter limit


class VectorCache:
    def __init__(self, path: Path, dimension: int):
        self.path, self.dimension = path, dimension
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._broken = False

    def _connection(self) -> sqlite3.Connection | None:
        if self._pid != os.getpid():  # a forked child opens its own connection (SQLite's rule)
            self._conn, self._pid = None, os.getpid()
        if self._conn is None and not self._broken:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("CREATE TABLE IF NOT EXISTS vectors (text TEXT PRIMARY KEY, vector BLOB NOT NULL)")
                self._conn = conn
            except (OSError, sqlite3.Error) as exc:
                self._give_up(exc)
        return self._conn

    def _give_up(self, exc: BaseException) -> None:
        log.debug("embedding cache %s not used: %s", self.path, exc)
        self._broken = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self, texts: list[str]) -> dict[str, np.ndarray]:
        """The kept vectors of those texts that have one."""
        found: dict[str, np.ndarray] = {}
        with self._lock:
            conn = self._connection()
            if conn is None:
                return found
            try:
                for start in range(0, len(texts), _CHUNK):
                    chunk = texts[start : start + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    for text, blob in conn.execute(f"SELECT text, vector FROM vectors WHERE text IN ({marks})", chunk):
                        vector = np.frombuffer(blob, dtype=np.float32)
                        if vector.shape == (self.dimension,):  # a damaged row is encoded again
                            found[text] = vector
            except sqlite3.Error as exc:
                self._give_up(exc)
                return {}
        return found

    def put(self, pairs: Iterable[tuple[str, np.ndarray]]) -> None:
        """Keep these vectors (a text already kept keeps its first vector), in one transaction."""
        rows = [(text, np.asarray(vector, dtype=np.float32).tobytes()) for text, vector in pairs]
        with self._lock:
            conn = self._connection()
            if conn is None or not rows:
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany("INSERT OR IGNORE INTO vectors (text, vector) VALUES (?, ?)", rows)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._give_up(exc)
