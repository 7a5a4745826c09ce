"""`ragledger query` (tracking.store.query.query) only reads: one SELECT over the views; COPY, ATTACH, INSTALL, LOAD and
every other statement are refused before anything runs, and the connection itself can open no file but the
segments its views cover (a SELECT through a table function cannot read /etc/passwd or write a file)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import tracking.store.query as tq
from tests.test_events import outcome_rows
from tests.test_query_projections import write
from tracking.store.events import EventStore

RAGLEDGER = str(Path(sys.executable).parent / "ragledger")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    es = EventStore(root)
    write(es, outcome_rows(5))
    write(es, outcome_rows(4, start=3), shift_s=-3600)  # overlapping segments: the deduping view reads both
    return root


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root` (the workspace): name -> (size, mtime)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_selects_still_run(store):
    df = tq.query(store, "WITH o AS (SELECT * FROM outcomes) SELECT count(*) AS n FROM o")
    assert int(df["n"][0]) == 7  # q0-q6, each once
    assert len(tq.query(store, "FROM outcomes")) == 7
    assert list(tq.query(store, "SELECT count(*) AS n FROM outcomes WHERE qid = 'q3'")["n"]) == [1]


REFUSED = {
    "COPY to a file": "COPY (SELECT 42) TO '{ws}/x.csv'",
    "COPY over a segment": "COPY (SELECT * FROM outcomes) TO '{segment}' (FORMAT parquet)",
    "ATTACH": "ATTACH '{ws}/other.duckdb' AS other",
    "INSTALL": "INSTALL httpfs",
    "LOAD": "LOAD httpfs",
    "CREATE": "CREATE TABLE t AS SELECT * FROM outcomes",
    "SET": "SET enable_external_access = true",
    "two statements": "SELECT 1; COPY (SELECT 42) TO '{ws}/y.csv'",
    "EXPORT": "EXPORT DATABASE '{ws}/dump'",
    "INSERT via WITH": "WITH x AS (SELECT 1) INSERT INTO outcomes SELECT * FROM x",
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_statements_that_are_not_one_select_are_refused_and_write_nothing(store, case):
    ws = store.parent
    segment = sorted(store.rglob("seg-*.parquet"))[0]
    before = snapshot(ws)
    with pytest.raises(tq.ReadOnlyQueryError, match=r"only reads|one statement at a time"):
        tq.query(store, REFUSED[case].format(ws=ws, segment=segment))
    assert snapshot(ws) == before


@pytest.mark.parametrize("sql", ["SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM glob('/*')",
                                 "SELECT * FROM read_parquet('{ws}/elsewhere.parquet')",
                                 "SELECT * FROM read_parquet('{store}/*/*/*.parquet')"])
def test_a_select_reads_nothing_outside_the_views_segments(store, sql):
    import duckdb

    ws = store.parent
    duckdb.sql(f"COPY (SELECT 1 AS a) TO '{ws}/elsewhere.parquet'")
    with pytest.raises(duckdb.PermissionException):
        tq.query(store, sql.format(ws=ws, store=store))


def test_the_connection_cannot_be_unlocked(store):
    import duckdb

    con = tq.connect(store, read_only=True)
    try:
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"COPY (SELECT 42) TO '{store.parent}/z.csv'")  # even bypassing the statement check
    finally:
        con.close()
    assert not (store.parent / "z.csv").exists()


def test_cli_query_refuses_a_write_with_one_error_line(store):
    ws = store.parent
    proc = subprocess.run([RAGLEDGER, "query", "COPY (SELECT 42) TO 'x.csv'", "--store", str(store)], cwd=ws,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: SQL: COPY statements are not run"), proc.stderr
    assert not (ws / "x.csv").exists()
    ok = subprocess.run([RAGLEDGER, "query", "SELECT count(*) AS n FROM outcomes", "--store", str(store), "--format",
                         "csv"], cwd=ws, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.split() == ["n", "7"], ok.stdout + ok.stderr
