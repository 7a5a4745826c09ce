"""The one way ragledger opens DuckDB: in memory, and silent."""

from __future__ import annotations

import duckdb


def memory_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory connection that prints nothing: DuckDB's progress bar on a long query goes to stdout, into a
    command's table, CSV or JSON output."""
    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")
    return con
