"""How ragledger reads with DuckDB: an in-memory connection that prints nothing, and the one rule for copies of an event.

Segments may overlap (a resumed or re-sharded run writes some events again, into another segment): every reader shows
each event once, its earliest written copy, ties by file name (`COPY_RANK` = 1). The views (tracking/store/views.py),
a read of records (tracking/store/events.py), and a pack written by compaction (tracking/store/compaction.py) all
choose by this rule, so they always show the same copy. Every kind has `qid` and an event has one, so partitioning by
(qid, event_id) is the same as by event_id, and lets DuckDB push a `WHERE qid = ...` below the window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

# the rank of a copy of an event among its copies, over rows with a `filename` column (read_parquet's filename = true)
COPY_RANK = "row_number() OVER (PARTITION BY qid, event_id ORDER BY created_at, filename)"


def memory_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory connection that prints nothing: DuckDB's progress bar on a long query goes to stdout, into a
    command's table, CSV or JSON output. In a Jupyter kernel DuckDB starts with the bar off and refuses the setting
    unless ipywidgets is installed (docs/walkthrough.ipynb runs in one: tests/test_notebook.py)."""
    import duckdb  # here: a process that reads no overlapping copies never imports it (docs/performance.md)

    con = duckdb.connect(":memory:")
    with contextlib.suppress(duckdb.InvalidInputException):
        con.execute("SET enable_progress_bar = false")
    return con


def sql_list(files: Sequence[str]) -> str:
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


def earliest_select(source: str, where: str = "") -> str:
    """Each event of `source` (a FROM-able with a `filename` column) once, by COPY_RANK, without `filename`; `where` (a
    condition on qid only) applies before the window, so DuckDB pushes it into the scan."""
    return (f"SELECT * EXCLUDE (__copy, filename) FROM (SELECT *, {COPY_RANK} AS __copy FROM {source}"
            f"{f' WHERE {where}' if where else ''}) WHERE __copy = 1")


def earliest_rows(events: pd.DataFrame, files: Sequence[str]) -> list[int]:
    """The positions of the rows of `events` that COPY_RANK keeps, in order; `files[i]` is the file row i came from."""
    frame = events[["qid", "event_id", "created_at"]].astype({"qid": object, "event_id": object}).reset_index(drop=True)
    frame["filename"], frame["row"] = list(files), range(len(frame))
    con = memory_connection()
    try:
        con.register("events", frame)
        return [r[0] for r in con.execute(f"SELECT row FROM ({earliest_select('events')}) ORDER BY row").fetchall()]
    finally:
        con.close()
