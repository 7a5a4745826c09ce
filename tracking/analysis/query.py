"""Query layer: DuckDB views over every stored event segment (projections, never the source of truth), each event
once although segments may overlap (tracking/analysis/overlaps.py says how, and what is cached).

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

from schemas.records import RECORD_MODELS, columns_of, current_names
from tracking.analysis.overlaps import (
    current_names_select,
    dedupe_select,
    empty_select,
    overlap_projection,
    sql_list,
    view_select,
)
from tracking.store.events import EventStore


def connect(store_root: str | Path, experiment: str | None = None, use_cache: bool = True,
            read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with views questions, retrievals, generations, votes, outcomes.

    `use_cache=False` recomputes the overlap projections instead of reading (or writing) them. `read_only` confines
    the connection, once its views exist, to reading the segments they cover (`confine`)."""
    store = EventStore(store_root)
    con = duckdb.connect(":memory:")
    covered: list[str] = []
    for kind in RECORD_MODELS:
        segments = store.segments(kind, experiment)
        if segments:
            overlapping = overlap_projection(con, store, kind, experiment, segments, use_cache)
            files = {str(p): p.relative_to(store.root).as_posix() for p in segments}
            select = view_select(con, list(files), {f for f, rel in files.items() if rel in overlapping})
            con.execute(f"CREATE VIEW {kind} AS {current_names_select(kind, select)}")
            covered += files
        else:
            con.execute(f"CREATE VIEW {kind} AS {current_names_select(kind, empty_select(kind))}")
    if read_only:
        confine(con, covered)
    return con


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
    con = duckdb.connect(":memory:")
    try:
        check_read_only(con, sql)  # before the views are built: a refused statement costs nothing
    finally:
        con.close()
    con = connect(store_root, experiment, read_only=True)
    try:
        return con.execute(sql).fetch_df()
    finally:
        con.close()


def outcomes(store_root: str | Path, experiment: str | None = None) -> pd.DataFrame:
    df = query(store_root, "SELECT * FROM outcomes ORDER BY cell, qid", experiment)
    return df[[c for c in columns_of("outcomes") if c in df.columns]]


def records_for(store_root: str | Path, kind: str, qids: Sequence[str], experiment: str | None = None,
                paths: Sequence[str | Path] | None = None) -> pd.DataFrame:
    """The records of one kind for the given questions, each event once: from `paths` (e.g. one
    execution's segments) when given, else from every segment of the experiment (or store). Columns of an earlier
    name read under their name now (schemas/records.current_names)."""
    store = EventStore(store_root)
    files = [str(p) for p in paths] if paths is not None else [str(p) for p in store.segments(kind, experiment)]
    if not files or not qids:
        return pd.DataFrame(columns=columns_of(kind))
    con = duckdb.connect(":memory:")
    try:
        con.execute("CREATE TEMP TABLE wanted (qid VARCHAR)")
        con.executemany("INSERT INTO wanted VALUES (?)", [(str(q),) for q in dict.fromkeys(qids)])
        return current_names(con.execute(dedupe_select(files, "qid IN (SELECT qid FROM wanted)")).fetch_df())
    finally:
        con.close()
