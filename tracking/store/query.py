"""Query layer: DuckDB views over every stored event segment (projections, never the source of truth), each event
once although segments may overlap (tracking/store/views.py says how, and what is cached).

`query` (and `ragledger query`) only reads: it runs one statement, a SELECT (or WITH ... SELECT), and refuses
any other (COPY, ATTACH, INSTALL, LOAD, CREATE, SET, PRAGMA, ...) before running anything; its connection then
reads only the segments its views cover (`enable_external_access` off, `allowed_paths` those files, extensions
neither installed nor loaded, the configuration locked), so no statement can write a file, overwrite a segment
or reach outside the store (tests/test_query_readonly.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb
import pandas as pd

from schemas.records import RECORD_MODELS
from tracking.store.catalog import reading
from tracking.store.duck import memory_connection, sql_list
from tracking.store.events import EventStore
from tracking.store.views import current_names_select, empty_select, kind_select


def connect(store_root: str | Path, experiment: str | None = None, use_cache: bool = True,
            read_only: bool = False, experiments: Sequence[str] | None = None,
            kinds: Sequence[str] = tuple(RECORD_MODELS)) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with views questions, retrievals, generations, votes, outcomes (or only the
    named `kinds`) over one experiment, the named `experiments`, or the whole store: only their files are opened.

    `use_cache=False` recomputes the overlap projections instead of reading (or writing) them. `read_only` confines
    the connection, once its views exist, to reading the files they cover (`confine`)."""
    store = EventStore(store_root)
    scope = [experiment] if experiment else (list(experiments) if experiments is not None else None)
    for attempt in range(3):
        con = memory_connection()
        try:
            covered: list[str] = []
            for kind in kinds:
                select, files = kind_select(con, store, kind, scope, use_cache)
                con.execute(f"CREATE VIEW {kind} AS {current_names_select(kind, select or empty_select(kind))}")
                covered += files
            if read_only:
                confine(con, covered)
            return con
        except (duckdb.IOException, FileNotFoundError):  # a compaction replaced a file meanwhile: list again
            con.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class ReadOnlyQueryError(duckdb.Error):
    """A statement the query layer does not run (it only reads). A duckdb.Error, so callers that report SQL
    errors (`ragledger query`) report this one the same way."""


def check_read_only(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse anything but one SELECT (or WITH ... SELECT, FROM ..., VALUES, DESCRIBE/SUMMARIZE/SHOW, which DuckDB
    types as SELECT): COPY ... TO wrote files, and ATTACH/INSTALL/LOAD reached outside the store."""
    statements = con.extract_statements(sql)  # a parser error is raised as DuckDB reports it
    if len(statements) != 1:
        raise ReadOnlyQueryError(f"one statement at a time, got {len(statements)}: the query layer runs a single SELECT")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise ReadOnlyQueryError(f"{kind.name} statements are not run: the query layer only reads (one SELECT or "
                                 "WITH ... SELECT over questions, retrievals, generations, votes, outcomes)")


def confine(con: duckdb.DuckDBPyConnection, files: Sequence[str]) -> None:
    """From now on the connection opens only `files` (the views' segments), for reading: no other file, no
    extension installed or loaded, and no setting may be changed back (lock_configuration)."""
    con.execute(f"SET allowed_paths = {sql_list(list(files))}")  # before external access goes: set only while on
    con.execute("SET enable_external_access = false")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def query(store_root: str | Path, sql: str, experiment: str | None = None) -> pd.DataFrame:
    """Run one read-only SELECT over the store's views (see the module doc); ReadOnlyQueryError for anything else."""
    con = memory_connection()
    try:
        check_read_only(con, sql)  # before the views are built: a refused statement costs nothing
    finally:
        con.close()
    with reading(store_root):  # the views' files stay until the answer is read (tracking/store/catalog.py)
        con = connect(store_root, experiment, read_only=True)
        try:
            return con.execute(sql).fetch_df()
        finally:
            con.close()
