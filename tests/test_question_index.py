"""The question index (tracking/store/question_index.py): which experiments asked a question, a projection of the
questions records that is made once, extended by reading only the experiments added or run again, rebuilt when
deleted, and kept in memory for a store that cannot be written."""

from __future__ import annotations

import shutil

import pytest

from tests.test_compaction import question_rows, write
from tracking.store import question_index as qi
from tracking.store.compaction import compact_store
from tracking.store.events import PROJECTIONS_DIR, EventStore


def add(store: EventStore, name: str, qids: range, dataset: str = "nq") -> None:
    write(store, "questions", name, [{**r, "dataset": dataset} for r in question_rows(name, qids)])


def test_the_index_names_the_experiments_that_asked_and_is_extended_not_rebuilt(tmp_path, monkeypatch):
    store = EventStore(tmp_path)
    add(store, "a", range(0, 4))
    add(store, "b", range(2, 6), dataset="tqa")
    assert qi.experiments_asking(tmp_path, "q3") == {"a": "nq", "b": "tqa"}
    assert qi.experiments_asking(tmp_path, "q0") == {"a": "nq"} and qi.experiments_asking(tmp_path, "q9") == {}
    (first,) = (tmp_path / PROJECTIONS_DIR / "questions").glob("index-*.parquet")
    add(store, "c", range(8, 10))
    read = []
    real = qi._rows
    monkeypatch.setattr(qi, "_rows", lambda con, store, names: read.append(sorted(names)) or real(con, store, names))
    assert qi.experiments_asking(tmp_path, "q9") == {"c": "nq"}
    assert read == [["c"]]  # only the new experiment's questions were read
    (second,) = (tmp_path / PROJECTIONS_DIR / "questions").glob("index-*.parquet")
    assert second != first  # the stale index is gone
    compact_store(store)  # a compaction changes the files, not the answers
    assert qi.experiments_asking(tmp_path, "q3") == {"a": "nq", "b": "tqa"}
    assert qi.datasets(tmp_path) == {"a": "nq", "b": "tqa", "c": "nq"}
    shutil.rmtree(tmp_path / PROJECTIONS_DIR)  # deleted: made again, the same answers
    assert qi.experiments_asking(tmp_path, "q3") == {"a": "nq", "b": "tqa"}


def test_a_store_that_cannot_be_written_gets_the_index_in_memory(tmp_path, monkeypatch):
    add(EventStore(tmp_path), "a", range(0, 4))

    def refuse(*args, **kwargs):
        raise PermissionError("read-only")

    monkeypatch.setattr(qi, "atomic_path", refuse)
    assert qi.experiments_asking(tmp_path, "q1") == {"a": "nq"}
    assert not (tmp_path / PROJECTIONS_DIR / "questions").exists() or not list(
        (tmp_path / PROJECTIONS_DIR / "questions").glob("index-*.parquet"))


@pytest.mark.parametrize("qid", ["q0", "nope"])
def test_history_opens_only_the_experiments_that_asked(tmp_path, qid, monkeypatch):
    from tests.test_compaction import CELLS, rows
    from tracking.store import ledger

    store = EventStore(tmp_path)
    for name in ("a", "b"):
        add(store, name, range(0, 2) if name == "a" else range(5, 7))
        write(store, "outcomes", name, rows(name, CELLS[0], range(0, 2) if name == "a" else range(5, 7)))
    opened = []
    real = ledger.Ledger.connect
    monkeypatch.setattr(ledger.Ledger, "connect", lambda self, names, kinds: opened.append(names) or real(self, names, kinds))
    df = ledger.Ledger(tmp_path).question_history(qid)
    assert opened == ([["a"]] if qid == "q0" else []) and len(df) == (1 if qid == "q0" else 0)
    assert list(df.columns) == ledger.HISTORY_COLUMNS
