"""Content-addressed cache of LLM calls, shared by every experiment using the same store.

Key = hash(model identity, model, system prompt, prompt, sampling params, sample index) (engines/llm.py). SQLite in
WAL mode lets several processes (parallel experiments, Dask workers) read and write it safely.

Keys named an OpenAI-compatible server's URL before they named the model (engines/llm_types.py): a cache that may
hold such keys (`may_hold_url_keys`: written before, or given a call pack) is asked for them on a miss; one created
since is not, so a new store's calls cost one lookup each, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from core.diskfull import reported_as_store_full
from core.processes import pid_alive


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
            # calls being made now, by which process: another process asking the same call waits for its answer
            # instead of making it again (experiments started together on one store share their calls)
            self._conn.execute("CREATE TABLE IF NOT EXISTS llm_pending (key TEXT PRIMARY KEY, owner TEXT NOT NULL,"
                               " started REAL NOT NULL)")
            self.may_hold_url_keys = self._key_format() != KEYS_BY_MODEL

    def _key_format(self) -> str:
        """What this cache's keys name: KEYS_BY_MODEL for a cache created empty since keys name the model, else
        "mixed" (entries written before, or imported from a call pack). Recorded once, on the first open since; an
        open after that only reads it."""
        with contextlib.suppress(sqlite3.OperationalError):  # no llm_meta yet: a cache written before
            row = self._conn.execute("SELECT value FROM llm_meta WHERE name = 'keys'").fetchone()
            if row is not None:
                return row[0]
        self._conn.execute("CREATE TABLE IF NOT EXISTS llm_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            empty = self._conn.execute("SELECT 1 FROM llm_calls LIMIT 1").fetchone() is None
            self._conn.execute("INSERT OR IGNORE INTO llm_meta (name, value) VALUES ('keys', ?)",
                               (KEYS_BY_MODEL if empty else "mixed",))
            row = self._conn.execute("SELECT value FROM llm_meta WHERE name = 'keys'").fetchone()
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return row[0]

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute("SELECT response FROM llm_calls WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, response: dict[str, Any]) -> None:
        """Store a response (an existing key keeps its own) and end this process's claim on the call."""
        with self._lock, reported_as_store_full(self.path):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("INSERT OR IGNORE INTO llm_calls (key, response) VALUES (?, ?)", (key, json.dumps(response)))
                self._conn.execute("DELETE FROM llm_pending WHERE key = ? AND owner = ?", (key, OWNER))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def claim(self, key: str, stale_after_s: float) -> bool:
        """True when this process may make the call now: it is not answered, and nobody else is making it, or its
        maker died or has held it longer than `stale_after_s` (a call and all its retries). False: it is answered, or
        its maker's answer is to be waited for (`get`)."""
        now = time.time()
        with self._lock, reported_as_store_full(self.path):
            inserted = self._conn.execute("INSERT OR IGNORE INTO llm_pending (key, owner, started) SELECT ?, ?, ? "
                                          "WHERE NOT EXISTS (SELECT 1 FROM llm_calls WHERE key = ?)",
                                          (key, OWNER, now, key)).rowcount
            if inserted:
                return True
            row = self._conn.execute("SELECT owner, started FROM llm_pending WHERE key = ?", (key,)).fetchone()
            if row is None:  # released in between: claim it again next time
                return False
            owner, started = row
            if owner == OWNER:
                return True
            if _owner_alive(owner) and now - started < stale_after_s:
                return False
            return self._conn.execute("UPDATE llm_pending SET owner = ?, started = ? WHERE key = ? AND owner = ? "
                                      "AND started = ?", (OWNER, now, key, owner, started)).rowcount == 1

    def release(self, key: str) -> None:
        """End this process's claim without an answer (the call failed): a waiting process makes it itself."""
        with self._lock, reported_as_store_full(self.path):
            self._conn.execute("DELETE FROM llm_pending WHERE key = ? AND owner = ?", (key, OWNER))

    def get_many(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The cached responses of `keys` that are in the cache (a call pack's export)."""
        wanted = sorted(set(keys))
        found: dict[str, dict[str, Any]] = {}
        with self._lock:
            for i in range(0, len(wanted), 500):  # SQLite's bound on host parameters
                chunk = wanted[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for key, response in self._conn.execute(
                        f"SELECT key, response FROM llm_calls WHERE key IN ({marks})", chunk):
                    found[key] = json.loads(response)
        return found

    def put_many(self, items: Iterable[tuple[str, dict[str, Any]]]) -> int:
        """Insert responses in one transaction; an existing key keeps its response. Returns how many were new."""
        rows = [(k, json.dumps(v)) for k, v in items]
        with self._lock, reported_as_store_full(self.path):
            before = self._conn.total_changes
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany("INSERT OR IGNORE INTO llm_calls (key, response) VALUES (?, ?)", rows)
                added = self._conn.total_changes - before
                # a call pack may come from a store whose keys named the URL
                self._conn.execute("INSERT OR REPLACE INTO llm_meta (name, value) VALUES ('keys', 'mixed')")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            self.may_hold_url_keys = True
            return added

    def all_keys(self) -> list[str]:
        """Every key, in key order, without reading the responses."""
        with self._lock:
            return [k for (k,) in self._conn.execute("SELECT key FROM llm_calls ORDER BY key")]

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every (key, response), in key order (a whole-cache export)."""
        with self._lock:
            rows = self._conn.execute("SELECT key, response FROM llm_calls ORDER BY key").fetchall()
        for key, response in rows:
            yield key, json.loads(response)

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM llm_calls").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


KEYS_BY_MODEL = "model"
OWNER = f"{socket.gethostname()}:{os.getpid()}"  # who holds a claim: a process of this machine can be checked


def _owner_alive(owner: str) -> bool:
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's process: only its age can say it is gone
    return pid_alive(int(pid))


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
