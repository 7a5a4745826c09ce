"""Which experiments asked a question, without opening their files: a projection of the stored questions records.

`<store>/projections/questions/index-<key>.parquet` holds (qid, experiment, dataset), sorted by question in small
row groups, so one question is found in one row group of one file. It is named by what it was made from: each
experiment's questions folder (its modification time) and catalog (`_stamps`), and keeps each experiment's stamps in
its metadata: when experiments were added or run again, the newest cached index is
extended by reading only theirs. Rebuildable: deleting it only means it is made again; a store that cannot be written
gets it in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.atomic import atomic_path
from tracking.store.catalog import CATALOG_DIR, reading
from tracking.store.duck import memory_connection, sql_list
from tracking.store.events import PROJECTIONS_DIR, EventStore
from tracking.store.views import projection_key

INDEX_VERSION = "questions-1"
STAMPS_KEY = b"ragledger.question_index"
ROW_GROUP = 4096


def _stamps(store: EventStore) -> dict[str, list]:
    """What names each experiment's questions files, cheaply: its folder's modification time (segments and packs are
    only ever added, renamed in or deleted, which changes it; never rewritten in place) and its catalog's identity
    (a compaction's commit renames a new one in). Two stats an experiment, not one per file."""
    base, catalogs = store.root / "questions", store.root / CATALOG_DIR
    if not base.is_dir():
        return {}
    out = {}
    for entry in os.scandir(base):
        if entry.is_dir():
            try:
                st = os.stat(os.path.join(catalogs, f"{entry.name}.json"))
                catalog = [st.st_ino, st.st_mtime_ns]
            except FileNotFoundError:
                catalog = None
            out[entry.name] = [entry.stat().st_mtime_ns, catalog]
    return dict(sorted(out.items()))


def _readable(path: Path) -> bool:
    """A whole index file of this version (its footer read, not its rows)."""
    try:
        return json.loads(pq.read_schema(path).metadata[STAMPS_KEY]).get("version") == INDEX_VERSION
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return False


def _load(path: Path) -> tuple[pa.Table, dict] | None:
    try:
        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[STAMPS_KEY])
        return (table, meta["experiments"]) if meta.get("version") == INDEX_VERSION else None
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def _rows(con: duckdb.DuckDBPyConnection, store: EventStore, experiments: list[str]) -> pa.Table:
    files = [str(f) for name in experiments for f in store.segments("questions", name)]
    if not files:
        return pa.table({"qid": pa.array([], pa.string()), "experiment": pa.array([], pa.string()),
                         "dataset": pa.array([], pa.string())})
    return con.sql(f"SELECT DISTINCT qid, experiment, dataset FROM read_parquet({sql_list(files)}, "
                   "union_by_name = true)").to_arrow_table()


def question_index(store: EventStore) -> pa.Table | Path:
    """The index of the store's questions: the cached file when it is current (made or extended now if not), or the
    table itself when it cannot be kept (a read-only store)."""
    with reading(store.root):  # the questions files listed stay until they are read (tracking/store/catalog.py)
        return _current_index(store)


def _current_index(store: EventStore) -> pa.Table | Path:
    stamps = _stamps(store)
    folder = store.root / PROJECTIONS_DIR / "questions"
    path = folder / f"index-{projection_key([INDEX_VERSION, *sorted(stamps.items())])}.parquet"
    if path.exists() and _readable(path):
        return path
    con = memory_connection()
    try:
        base = None
        for other in sorted(folder.glob("index-*.parquet"), key=lambda p: p.stat().st_mtime_ns, reverse=True):
            base = _load(other)
            if base is not None:
                break
        if base is None:
            table = _rows(con, store, list(stamps))
        else:  # keep the unchanged experiments' rows, read the others'
            old, old_stamps = base
            same = [e for e, s in stamps.items() if old_stamps.get(e) == s]
            kept = old.filter(pc.is_in(old["experiment"], value_set=pa.array(same, pa.string())))
            table = pa.concat_tables([kept.select(["qid", "experiment", "dataset"]).replace_schema_metadata(None),
                                      _rows(con, store, [e for e in stamps if e not in same])])
        con.register("unsorted", table)
        table = con.sql("SELECT * FROM unsorted ORDER BY qid, experiment").to_arrow_table()
    finally:
        con.close()
    table = table.replace_schema_metadata({STAMPS_KEY: json.dumps({"version": INDEX_VERSION,
                                                                   "experiments": stamps}).encode()})
    try:
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, row_group_size=ROW_GROUP)
    except OSError:  # a read-only store: use it without keeping it
        return table
    for stale in folder.glob("index-*.parquet"):
        if stale != path:
            with contextlib.suppress(OSError):
                stale.unlink()
    return path


def index_select(con: duckdb.DuckDBPyConnection, store: EventStore) -> str:
    """A FROM-able name of the store's question index on `con`."""
    index = question_index(store)
    if isinstance(index, Path):
        return f"read_parquet({sql_list([str(index)])})"
    con.register("question_index", index)
    return "question_index"


def experiments_asking(store_root: str | Path, qid: str) -> dict[str, str]:
    """Experiment -> dataset, for every experiment that stored question `qid`."""
    con = memory_connection()
    try:
        source = index_select(con, EventStore(store_root))
        return dict(con.execute(f"SELECT experiment, dataset FROM {source} WHERE qid = ?", [qid]).fetchall())
    finally:
        con.close()


def datasets(store_root: str | Path) -> dict[str, str]:
    """Experiment -> its questions' dataset (the first by name when it stored several)."""
    con = memory_connection()
    try:
        source = index_select(con, EventStore(store_root))
        return dict(con.execute(f"SELECT experiment, min(dataset) FROM {source} GROUP BY experiment").fetchall())
    finally:
        con.close()
