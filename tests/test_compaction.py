"""Compaction (tracking/store/compaction.py): an experiment's segments rewritten into one pack per kind keep every
event and every query's answer: the views, the reads of a run manifest's segment paths, the per-example records, a
question's history and the leaderboard; overlapping segments from a resumed run included. A kill -9 at each step
leaves a store that verifies and answers the same; a reader running meanwhile sees the old files or the new ones;
an experiment compacted before MLflow logged it is logged from its packs and pulled into a second store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from tests.test_events import outcome_rows
from tracking.analysis.history import leaderboard
from tracking.store.catalog import catalog_path, load_catalog, segment_exists
from tracking.store.compaction import compact_experiment, compact_store, record_files
from tracking.store.events import EventStore, event_id, new_events
from tracking.store.ledger import Ledger
from tracking.store.query import connect, query

REPO = Path(__file__).resolve().parents[1]
CELLS = ["bm25@5 · concatenation · m", "bm25@5 · sure · m"]


def rows(experiment: str, cell: str, qids: range, em: float = 1.0, prompt: str = "v1") -> list[dict]:
    out = []
    for r, i in zip(outcome_rows(len(qids), cell=cell, start=qids.start), qids, strict=True):
        out.append({**r, "event_id": event_id("outcomes", experiment, cell, prompt, i), "em": em if i % 3 else 0.0})
    return out


def question_rows(experiment: str, qids: range) -> list[dict]:
    return [{"event_id": event_id("questions", experiment, i), "cell": "", "qid": f"q{i}", "dataset": "nq",
             "question": f"question {i}?", "answers": [f"a{i}"], "gold_pids": []} for i in qids]


def write(store: EventStore, kind: str, experiment: str, batch: list[dict], shift_s: float = 0.0) -> Path:
    df = new_events(kind, experiment, batch)
    df["created_at"] = df["created_at"] + pd.Timedelta(seconds=shift_s)
    path = store.write(kind, df)
    assert path is not None
    return path


def build(root: Path) -> dict[str, list[Path]]:
    """exp-a: two cells in shards of 4 questions, plus a resumed run's re-sharded segment holding q2-q5 again
    (stamped earlier: its copies are the ones every view shows); exp-b: one cell; both with their questions.
    Returns each experiment's segment paths, as a run manifest would list them."""
    store = EventStore(root)
    segs: dict[str, list[Path]] = {"exp-a": [], "exp-b": []}
    segs["exp-a"].append(write(store, "questions", "exp-a", question_rows("exp-a", range(8))))
    for cell in CELLS:
        for start in (0, 4):
            segs["exp-a"].append(write(store, "outcomes", "exp-a", rows("exp-a", cell, range(start, start + 4))))
    segs["exp-a"].append(write(store, "outcomes", "exp-a", rows("exp-a", CELLS[0], range(2, 6)), shift_s=-60))
    segs["exp-b"].append(write(store, "questions", "exp-b", question_rows("exp-b", range(6))))
    segs["exp-b"].append(write(store, "outcomes", "exp-b", rows("exp-b", CELLS[1], range(6), em=0.0)))
    return segs


def plain(df: pd.DataFrame) -> list[dict]:
    """Rows as comparable values: a missing value is None (NaN never equals NaN)."""
    df = df.reset_index(drop=True).astype(object)
    return df.where(df.notna(), None).to_dict("records")


def answers(root: Path, segs: dict[str, list[Path]]) -> dict[str, object]:
    """Every query's answer worth keeping the same, as plain values."""
    store = EventStore(root)
    out: dict[str, object] = {}
    for scope in (None, "exp-a", "exp-b"):
        df = query(root, "SELECT * FROM outcomes ORDER BY event_id", scope)
        out[f"view:{scope}"] = plain(df)
        out[f"read:{scope}"] = plain(store.read("outcomes", scope).sort_values("event_id"))
    out["questions"] = plain(query(root, "SELECT qid, dataset FROM questions ORDER BY experiment, qid"))
    for name, paths in segs.items():
        for p in paths:
            kind = p.parents[1].name
            out[f"segment:{p.name}"] = sorted(store.read(kind, paths=[p])["event_id"])
        out[f"records:{name}"] = sorted(Ledger(root).records("outcomes", name, qids=["q2", "q3"], paths=paths)["event_id"])
    out["history"] = plain(Ledger(root).question_history("q2"))
    out["leaderboard"] = plain(leaderboard(root, top=None))
    return out


def test_compaction_keeps_every_event_and_every_answer(tmp_path):
    segs = build(tmp_path)
    before = answers(tmp_path, segs)
    assert len(before["view:exp-a"]) == 16 and len(before["view:exp-b"]) == 6  # q2-q3 of cell 0 once each
    files = record_files(EventStore(tmp_path))
    r = compact_store(EventStore(tmp_path))
    assert r.experiments == 2 and r.rows == 16 + 8 + 6 + 6
    assert record_files(EventStore(tmp_path)) == 4 + 2 < files  # a pack per kind and experiment, a catalog each
    assert not list(tmp_path.glob("*/*/seg-*.parquet"))
    assert answers(tmp_path, segs) == before
    assert all(segment_exists(p) for paths in segs.values() for p in paths)
    assert EventStore(tmp_path).verify() == (4, [])
    entry = load_catalog(tmp_path, "exp-a").entry("outcomes")
    assert entry.rows == 16 and entry.one_per_cell_question  # one execution: each (cell, question) once


def test_writes_after_compaction_are_no_ops_or_new_segments_and_compact_again(tmp_path):
    segs = build(tmp_path)
    compact_store(EventStore(tmp_path))
    store = EventStore(tmp_path)
    again = write(store, "outcomes", "exp-a", rows("exp-a", CELLS[0], range(0, 4)))  # a rerun's same events
    assert again == segs["exp-a"][1] and not again.exists()  # held by the pack: nothing written
    new = write(store, "outcomes", "exp-a", rows("exp-a", CELLS[0], range(0, 8), em=0.0, prompt="v2"))
    assert new.exists() and len(store.read("outcomes", "exp-a")) == 24  # a second execution's outcomes
    before = answers(tmp_path, {**segs, "exp-a": [*segs["exp-a"], new]})
    compact_experiment(store, "exp-a")
    assert not new.exists() and segment_exists(new)
    assert answers(tmp_path, {**segs, "exp-a": [*segs["exp-a"], new]}) == before
    assert not load_catalog(tmp_path, "exp-a").entry("outcomes").one_per_cell_question  # two executions
    board = leaderboard(tmp_path, top=None)  # the latest outcome of each (cell, question): v2's, all wrong
    row = board[(board["experiment"] == "exp-a") & (board["cell"] == CELLS[0])]
    assert row["em"].item() == 0.0 and row["questions"].item() == 8


COMPACT = ("import sys; from tracking.store.compaction import compact_store; "
           "from tracking.store.events import EventStore; compact_store(EventStore(sys.argv[1]))")


@pytest.mark.parametrize("point", ["compact.before_pack_rename:2", "compact.pack_written:1", "compact.pack_written:2",
                                   "compact.committed:1", "compact.deleting:3"])
def test_a_kill_at_any_step_leaves_a_store_that_verifies_and_answers_the_same(tmp_path, point):
    segs = build(tmp_path)
    before = answers(tmp_path, segs)
    env = {**os.environ, "RAGLEDGER_CRASH_AT": point}
    proc = subprocess.run([sys.executable, "-c", COMPACT, str(tmp_path)], cwd=REPO, env=env, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    store = EventStore(tmp_path)
    checked, problems = store.verify()
    assert checked > 0 and problems == [], problems
    assert answers(tmp_path, segs) == before
    compact_store(store)  # the next compaction finishes the work and removes what the kill left
    assert answers(tmp_path, segs) == before
    assert store.verify()[1] == [] and not list(tmp_path.rglob(".tmp-*"))
    assert not list(tmp_path.glob("*/*/seg-*.parquet")) and record_files(store) == 6


READER = """
import json, sys, time
from tracking.store.query import query
from tracking.store.events import EventStore
root, until = sys.argv[1], float(sys.argv[2])
seen = []
while time.time() < until:
    n = query(root, "SELECT count(*) AS n, sum(em) AS s FROM outcomes")
    seen.append([int(n["n"][0]), float(n["s"][0]), len(EventStore(root).read("outcomes"))])
print(json.dumps(seen))
"""


def test_a_reader_during_compaction_sees_the_old_files_or_the_new_never_both_or_neither(tmp_path):
    store = EventStore(tmp_path)
    for e in range(12):  # 12 experiments of 8 segments: compacting them takes long enough to read meanwhile
        for start in range(0, 32, 4):
            write(store, "outcomes", f"e{e:02d}", rows(f"e{e:02d}", CELLS[0], range(start, start + 4)))
    expected = query(tmp_path, "SELECT count(*) AS n, sum(em) AS s FROM outcomes")
    want = [int(expected["n"][0]), float(expected["s"][0]), int(expected["n"][0])]
    reader = subprocess.Popen([sys.executable, "-c", READER, str(tmp_path), str(time.time() + 8)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)  # the reader's imports
    for e in range(12):
        compact_experiment(store, f"e{e:02d}")
    out, errors = reader.communicate(timeout=120)
    assert reader.returncode == 0, errors[-3000:]
    seen = json.loads(out)
    assert len(seen) > 3 and all(s == want for s in seen), [s for s in seen if s != want][:3]


def test_an_experiment_compacted_before_mlflow_logged_it_is_synced_then_pulled_into_a_second_store(tmp_path):
    """The run compacts its experiment at its end although MLflow was down; `ragledger sync` logs its segments
    written out of the packs; `ragledger pull` rebuilds the experiment on store B with the same events."""
    from tests.fakes.openai_server import ScriptedServer
    from tests.test_reliability import cli, make_data, reader, write_spec
    from tracking.store.ledger import Ledger

    make_data(tmp_path, 6)
    a, b = tmp_path / "A", tmp_path / "B"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(tmp_path, model.base_url, name="packed")
        down = cli(tmp_path, "run", str(spec), "--store", str(a), env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
        assert down.returncode == 2, down.stdout[-2000:] + down.stderr[-2000:]  # stored; MLflow logging pending
        assert catalog_path(a, "packed").exists() and not list(a.glob("*/packed/seg-*.parquet"))
        synced = cli(tmp_path, "sync", "--all", "--store", str(a), "--tracking-uri", uri)
        assert synced.returncode == 0 and "1 execution(s) logged" in synced.stdout, synced.stdout + synced.stderr
        pulled = cli(tmp_path, "pull", "packed", "--store", str(b), "--mlflow-uri", uri)
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert EventStore(b).verify()[1] == []
    for kind in ("questions", "retrievals", "generations", "votes", "outcomes"):
        assert set(EventStore(b).read(kind, "packed")["event_id"]) == set(EventStore(a).read(kind, "packed")["event_id"])
    key = ["cell", "qid", "prediction", "em"]

    def latest(store: Path) -> pd.DataFrame:
        df = Ledger(store).outcomes("packed", Ledger(store).latest_execution("packed"))
        return df[key].sort_values(key[:2]).reset_index(drop=True)

    pd.testing.assert_frame_equal(latest(b), latest(a))
    assert json.loads(catalog_path(a, "packed").read_text())["kinds"]["outcomes"]["rows"] == 12


def test_a_view_over_named_experiments_opens_only_their_files(tmp_path):
    build(tmp_path)
    compact_store(EventStore(tmp_path))
    con = connect(tmp_path, experiments=["exp-b"], read_only=True)  # confined to the files its views cover
    try:
        assert con.execute("SELECT DISTINCT experiment FROM outcomes").fetchall() == [("exp-b",)]
        (other,) = EventStore(tmp_path).segments("outcomes", "exp-a")
        with pytest.raises(duckdb.Error):
            con.execute(f"SELECT count(*) FROM read_parquet('{other}')").fetchall()
    finally:
        con.close()
