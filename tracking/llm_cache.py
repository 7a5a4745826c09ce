"""Content-addressed cache of LLM calls, shared by every experiment using the same store.

Key = hash(backend identity, model, system prompt, prompt, sampling params, sample index). SQLite in
WAL mode lets several processes (parallel experiments, Dask workers) read and write it safely.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from tracking.diskfull import reported_as_store_full


class LLMCallCache:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # a full filesystem: StoreFullError naming this file (SQLite rolls the write back; the cache stays whole)
        with reported_as_store_full(self.path):
            self._conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False, isolation_level=None)
            _enable_wal(self._conn)
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS llm_calls (key TEXT PRIMARY KEY, response TEXT NOT NULL,"
                " created_at TEXT DEFAULT CURRENT_TIMESTAMP)"
            )

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute("SELECT response FROM llm_calls WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, response: dict[str, Any]) -> None:
        with self._lock, reported_as_store_full(self.path):
            self._conn.execute(
                "INSERT OR IGNORE INTO llm_calls (key, response) VALUES (?, ?)", (key, json.dumps(response))
            )

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM llm_calls").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _enable_wal(conn: sqlite3.Connection, attempts: int = 100) -> None:
    """Switch the file to WAL once. The switch takes an exclusive lock and SQLite answers "database is locked" at
    once (its busy timeout does not apply) while another connection opens the same new file: retry briefly."""
    for attempt in range(attempts):
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.05)
