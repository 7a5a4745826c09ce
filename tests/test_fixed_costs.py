"""What an identical rerun no longer recomputes: a dataset file parsed once per process, and cell metrics kept as a
projection of their (immutable, content-addressed) segments."""

from __future__ import annotations

import json
import math
import os

from core.datasets import load_questions
from tracking.analysis.metrics import cached_cell_metrics


def test_cell_metrics_are_computed_once_per_segment_set_and_read_back_equal(tmp_path):
    calls = []
    metrics = {"questions": 3, "em": 33.33, "nm_pct": math.nan, "calls_per_q": 1.0}

    def compute():
        calls.append(1)
        return dict(metrics)

    first = cached_cell_metrics(tmp_path / "projections", "k1", compute)
    again = cached_cell_metrics(tmp_path / "projections", "k1", compute)
    assert len(calls) == 1
    assert again == first == metrics  # NaN comes back as math.nan itself, so dicts still compare equal
    assert again["nm_pct"] is math.nan
    assert not list((tmp_path / "projections").glob(".tmp-*"))  # written aside and renamed
    other = cached_cell_metrics(tmp_path / "projections", "k2", compute)  # another segment set: computed
    assert len(calls) == 2 and other == metrics
    (tmp_path / "projections" / "cell-metrics-k1.json").write_text("{truncated")  # a damaged projection
    assert cached_cell_metrics(tmp_path / "projections", "k1", compute) == metrics and len(calls) == 3
    assert json.loads((tmp_path / "projections" / "cell-metrics-k1.json").read_text())["em"] == 33.33


def test_a_dataset_file_is_parsed_once_per_process_and_again_when_it_changes(tmp_path, monkeypatch):
    import core.datasets as ds

    path = tmp_path / "qa.jsonl"
    path.write_text('{"id": "a", "question": "Who?", "answers": ["Ann"]}\n{"id": "b", "question": "What?", "answers": ["B"]}\n')
    parsed = []
    real = ds._parse_questions
    monkeypatch.setattr(ds, "_parse_questions", lambda name, p: parsed.append(p) or real(name, p))
    first = load_questions("jsonl", str(path))
    first[0].qid = "mutated by a caller"  # callers get copies: the cache is not changed through them
    second = load_questions("jsonl", str(path))
    assert len(parsed) == 1 and [q.qid for q in second] == ["a", "b"]
    path.write_text('{"id": "c", "question": "Where?", "answers": ["Here"]}\n')
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # a new modification time
    assert [q.qid for q in load_questions("jsonl", str(path))] == ["c"] and len(parsed) == 2


def test_projection_temp_files_follow_the_stores_clean_up_convention(tmp_path):
    """A projection written aside by a writer that was killed is removed once its pid is gone, like an interrupted
    segment write (the temp names carry the writer's pid). `store verify` reports only a live writer's: a killed
    writer's is never read, so a store killed at any moment still verifies."""
    from core.atomic import temp_path
    from tracking.store.events import EventStore

    projections = tmp_path / "projections" / "metrics"
    projections.mkdir(parents=True)
    live = temp_path(projections, ".json")
    live.write_text("{}")
    dead = projections / live.name.replace(f".tmp-{os.getpid()}-", ".tmp-999999999-")  # above any pid_max
    dead.write_text("{")
    store = EventStore(tmp_path)
    assert {p.path.name for p in store.verify()[1]} == {live.name}
    assert store.remove_abandoned_temp_files() == 1
    assert live.exists() and not dead.exists()
