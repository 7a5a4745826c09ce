import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from schemas.records import RecordValidationError
from tracking.store.events import EventStore, event_id, new_events
from tracking.store.ledger import Ledger
from tracking.store.query import connect


def outcome_rows(n=3, cell="bm25@5 · concatenation · m", start=0):
    return [
        {
            "event_id": event_id("outcomes", "exp", cell, i), "cell": cell, "qid": f"q{i}", "retriever": "bm25@5",
            "reader": "concatenation", "model": "m", "prediction": "x", "em": 1.0, "f1": 1.0, "semantic_match": None,
            "is_unknown": False, "gold_in_context": True, "pool_has_correct": None, "error_type": "correct",
            "tokens_in": 10, "tokens_out": 2, "llm_calls": 1,
        }
        for i in range(start, start + n)
    ]


def test_write_is_idempotent(tmp_path):
    store = EventStore(tmp_path)
    p1 = store.write("outcomes", new_events("outcomes", "exp", outcome_rows()))
    p2 = store.write("outcomes", new_events("outcomes", "exp", outcome_rows()))  # same events, later created_at
    assert p1 == p2
    assert len(store.segments("outcomes")) == 1
    assert len(store.read("outcomes")) == 3


def outcomes(root) -> pd.DataFrame:
    """Every outcome through the views, in (cell, question) order."""
    return Ledger(root).sql("SELECT * FROM outcomes ORDER BY cell, qid")


def test_overlapping_segments_read_each_event_once(tmp_path):
    store = EventStore(tmp_path)
    store.write("outcomes", new_events("outcomes", "exp", outcome_rows(3)))
    store.write("outcomes", new_events("outcomes", "exp", outcome_rows(3, start=2)))  # q2 in both
    assert len(store.segments("outcomes")) == 2
    assert sorted(store.read("outcomes")["qid"]) == ["q0", "q1", "q2", "q3", "q4"]
    # the DuckDB projection agrees, and rebuilding it from the segments gives the same answer
    first = outcomes(tmp_path)
    assert len(first) == 5
    pd.testing.assert_frame_equal(first, outcomes(tmp_path))


def test_failed_validation_writes_nothing(tmp_path):
    store = EventStore(tmp_path)
    rows = outcome_rows()
    rows[1]["em"] = 1.5  # out of range
    rows[2]["error_type"] = "bad_luck"
    with pytest.raises(RecordValidationError) as exc:
        store.write("outcomes", new_events("outcomes", "exp", rows))
    msg = str(exc.value)
    assert "outcomes" in msg and "column=em" in msg and "column=error_type" in msg and "nothing was written" in msg
    assert not list(tmp_path.rglob("*.parquet")) and not list(tmp_path.rglob(".tmp-*"))


def test_missing_column_rejected(tmp_path):
    rows = outcome_rows()
    for r in rows:
        del r["f1"]
    with pytest.raises(RecordValidationError, match="f1"):
        EventStore(tmp_path).write("outcomes", new_events("outcomes", "exp", rows))


def test_crash_mid_write_leaves_no_segment(tmp_path, monkeypatch):
    store = EventStore(tmp_path)

    def boom(table, where, **kw):
        where.write(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        store.write("outcomes", new_events("outcomes", "exp", outcome_rows()))
    assert store.segments("outcomes") == []
    assert not list(tmp_path.rglob(".tmp-*"))


def test_verify_detects_truncation_and_alteration(tmp_path):
    store = EventStore(tmp_path)
    a = store.write("outcomes", new_events("outcomes", "exp", outcome_rows(3)))
    b = store.write("outcomes", new_events("outcomes", "exp", outcome_rows(3, start=10)))
    checked, problems = store.verify()
    assert checked == 2 and problems == []
    data = a.read_bytes()
    a.write_bytes(data[: len(data) // 2])  # truncated
    table = pq.read_table(b)
    altered = table.set_column(table.schema.get_field_index("em"), "em", pa.array([0.0, 0.0, 0.0]))
    pq.write_table(altered.replace_schema_metadata(table.schema.metadata), b)  # same metadata, other data
    checked, problems = store.verify()
    by_path = {p.path: p.problem for p in problems}
    assert "unreadable" in by_path[a]
    assert "checksum mismatch" in by_path[b]


def test_query_views_exist_even_when_empty(tmp_path):
    con = connect(tmp_path)
    for view in ("questions", "retrievals", "generations", "votes", "outcomes"):
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone()[0] == 0


def test_segments_from_before_gold_in_feedback_stay_readable(tmp_path):
    """OutcomeRecord.gold_in_feedback is optional: old segments (without it) verify, read and query beside new ones."""
    store = EventStore(tmp_path)
    store.write("outcomes", new_events("outcomes", "exp", outcome_rows(2)))  # written as before the column existed
    new = outcome_rows(2, start=2)
    for r, v in zip(new, (True, None), strict=True):
        r["gold_in_feedback"] = v
    store.write("outcomes", new_events("outcomes", "exp", new))
    checked, problems = store.verify()
    assert checked == 2 and problems == []
    df = store.read("outcomes").set_index("qid")
    assert df.loc["q2", "gold_in_feedback"] == True and pd.isna(df.loc["q0", "gold_in_feedback"])  # noqa: E712
    assert outcomes(tmp_path).set_index("qid")["gold_in_feedback"].isna().tolist() == [True, True, False, True]
