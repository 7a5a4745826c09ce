"""The query layer's views against a plain pandas dedupe of every segment: overlapping segments (each
event once, the earliest copy), the cached overlap projection (rebuildable: deleting it, bypassing it,
corrupting it or a store that cannot be written give the same answers), and a new segment making the
cached projection stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import tracking.store.query as tq
from tests.test_events import outcome_rows
from tracking.store import views
from tracking.store.events import PROJECTIONS_DIR, EventStore, event_id, new_events
from tracking.store.ledger import Ledger


def write(store: EventStore, rows: list[dict], experiment: str = "exp", shift_s: float = 0.0) -> Path:
    df = new_events("outcomes", experiment, rows)
    df["created_at"] = df["created_at"] + pd.Timedelta(seconds=shift_s)
    path = store.write("outcomes", df)
    assert path is not None
    return path


def reference(root: Path, experiment: str | None = None) -> pd.DataFrame:
    """Every segment read with pyarrow, each event once: its earliest copy."""
    files = EventStore(root).segments("outcomes", experiment)
    df = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    df = df.sort_values("created_at", kind="stable").drop_duplicates("event_id", keep="first")
    return df.sort_values("event_id").reset_index(drop=True)


def viewed(root: Path, experiment: str | None = None, use_cache: bool = True) -> pd.DataFrame:
    con = tq.connect(root, experiment, use_cache=use_cache)
    try:
        df = con.execute("SELECT * FROM outcomes ORDER BY event_id").fetch_df()
    finally:
        con.close()
    return df[list(reference(root, experiment).columns)]


def same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)


@pytest.fixture
def overlapping_store(tmp_path):
    """exp: A (q0-q4), B (q3-q6, written later but stamped an hour earlier: its q3, q4 are the earliest
    copies), C (q7-q9, shares nothing); other: D (q0-q2 under another experiment: ids hash the experiment,
    so they are other events than A's)."""
    store = EventStore(tmp_path)
    other = [{**r, "event_id": event_id("outcomes", "other", r["cell"], i)} for i, r in enumerate(outcome_rows(3))]
    segs = {"A": write(store, outcome_rows(5)), "B": write(store, outcome_rows(4, start=3), shift_s=-3600),
            "C": write(store, outcome_rows(3, start=7)), "D": write(store, other, experiment="other")}
    return tmp_path, segs


def test_views_equal_a_full_dedupe_and_keep_the_earliest_copy(overlapping_store):
    root, segs = overlapping_store
    ref = reference(root)
    assert len(ref) == 13 and len(reference(root, "other")) == 3  # exp's q0-q9 and other's q0-q2
    same(viewed(root), ref)
    same(viewed(root, "exp"), reference(root, "exp"))
    same(viewed(root, "other"), reference(root, "other"))
    # a read of the records (pyarrow) keeps the same copies as the views (DuckDB): one rule, tracking/store/duck.py
    same(EventStore(root).read("outcomes").sort_values("event_id")[ref.columns], ref)
    con = tq.connect(root, "exp")
    rows = con.execute("SELECT qid, created_at FROM outcomes WHERE qid = 'q3'").fetchall()
    con.close()
    b_q3 = pq.read_table(segs["B"]).to_pandas().set_index("qid").loc["q3", "created_at"]
    assert len(rows) == 1 and pd.Timestamp(rows[0][1]) == b_q3


def test_overlap_projection_is_cached_per_scope_and_rebuildable(overlapping_store):
    root, segs = overlapping_store
    viewed(root, "exp")
    first = viewed(root)
    # one projection per experiment with several segments, which the view over every experiment uses too
    cached = sorted((root / PROJECTIONS_DIR).rglob("overlaps-*.json"))
    assert [p.parent.relative_to(root / PROJECTIONS_DIR).as_posix() for p in cached] == ["outcomes/exp"]
    rel = {k: p.relative_to(root).as_posix() for k, p in segs.items()}
    exp = json.loads(cached[0].read_text())
    assert exp["overlapping"] == [rel["A"], rel["B"]]
    same(viewed(root), first)  # from the cache
    same(viewed(root, use_cache=False), first)  # recomputed without it
    shutil.rmtree(root / PROJECTIONS_DIR)  # deleting every projection and rebuilding gives the same answers
    same(viewed(root), first)
    cached[0].write_text("{not json")  # a damaged projection is computed again
    same(viewed(root), first)
    assert json.loads(cached[0].read_text())["overlapping"] == exp["overlapping"]


def test_a_new_segment_extends_the_cached_projection(overlapping_store, monkeypatch):
    root, segs = overlapping_store
    viewed(root, "exp")
    before = sorted((root / PROJECTIONS_DIR / "outcomes" / "exp").glob("overlaps-*.json"))
    new = write(EventStore(root), outcome_rows(2, start=9))  # q9 again (C's), q10 new
    after = sorted((root / PROJECTIONS_DIR / "outcomes" / "exp").glob("overlaps-*.json"))
    assert after == before  # nothing is recomputed until the next query

    def no_full_scan(con, files):
        raise AssertionError(f"full overlap scan over {len(files)} files; expected the incremental one")

    with monkeypatch.context() as m:
        m.setattr(views, "overlapping_segments", no_full_scan)
        same(viewed(root, "exp"), reference(root, "exp"))  # A, B from the cache; C and the new one found now
    now = sorted((root / PROJECTIONS_DIR / "outcomes" / "exp").glob("overlaps-*.json"))
    assert len(now) == 1 and now != before  # the stale one is replaced
    rel = {k: p.relative_to(root).as_posix() for k, p in {**segs, "new": new}.items()}
    assert json.loads(now[0].read_text())["overlapping"] == sorted([rel["A"], rel["B"], rel["C"], rel["new"]])
    assert len(viewed(root, "exp")) == 11


def test_a_removed_segment_is_not_taken_from_the_cache(overlapping_store):
    root, segs = overlapping_store
    viewed(root, "exp")
    segs["B"].unlink()  # A no longer overlaps anything: the cached projection holds B, so it is not a base
    same(viewed(root, "exp"), reference(root, "exp"))
    (cached,) = (root / PROJECTIONS_DIR / "outcomes" / "exp").glob("overlaps-*.json")
    assert json.loads(cached.read_text())["overlapping"] == []


def test_a_store_that_cannot_be_written_still_answers(overlapping_store, monkeypatch):
    root, _ = overlapping_store

    def refuse(path, text):
        raise PermissionError(f"read-only: {path}")

    monkeypatch.setattr(views, "_write_atomically", refuse)
    same(viewed(root), reference(root))
    assert not (root / PROJECTIONS_DIR).exists()


def test_records_of_some_questions_are_read_alone_and_once(overlapping_store):
    root, segs = overlapping_store
    got = Ledger(root).records("outcomes", "exp", qids=["q3", "q8", "nope"]).sort_values("qid")
    ref = reference(root, "exp")
    same(got[ref.columns], ref[ref["qid"].isin(["q3", "q8"])].sort_values("qid"))
    only_a = Ledger(root).records("outcomes", qids=["q3", "q8"], paths=[segs["A"]])
    assert list(only_a["qid"]) == ["q3"]
    assert Ledger(root).records("outcomes", "exp", qids=[]).empty
