"""Disk full: the store lives on a small tmpfs mounted for the test and a ballast file leaves it too little room for
the run. The run must stop with one `error:` line naming the file it could not write (exit 2), leave no partial or
corrupt segment (`store verify` clean), and, once the ballast is deleted, resume to the outcome table of a run that
never ran out of space."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli, make_data, outcome_table, reader, write_spec


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs: a real filesystem that fills (root is needed to mount it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def store_table(store: Path) -> list[tuple]:
    from tracking.store.query import query

    df = query(store, "SELECT cell, qid, prediction, em, f1, error_type FROM outcomes ORDER BY cell, qid")
    return [tuple(r) for r in df.itertuples(index=False)]


def test_disk_full_stops_cleanly_and_resumes_to_the_same_outcomes(tmp_path, small_fs):
    clean_ws, full_ws = tmp_path / "clean", tmp_path / "full"
    for ws in (clean_ws, full_ws):
        ws.mkdir()
        make_data(ws, 12)
    store = small_fs / "store"
    with ScriptedServer(answer=reader) as server:
        proc = cli(clean_ws, "run", str(write_spec(clean_ws, server.base_url)))
        assert proc.returncode == 0, proc.stderr[-3000:]
        expected = outcome_table(clean_ws)
        # what an uninterrupted run keeps in its store (segments, call cache, projections, manifest)
        files = [f for f in (clean_ws / ".ragledger" / "store").rglob("*") if f.is_file()]
        needed = sum(f.stat().st_blocks * 512 for f in files)
        calls = sum(f.stat().st_blocks * 512 for f in files if f.name.startswith("llm_cache.sqlite"))

        # the call cache fills first (ragledger run sends the first calls before the flow starts): leave it room,
        # and the rest about 40% of what it needs, so the store fills after the first segments, mid-run
        spec = write_spec(full_ws, server.base_url)
        ballast = small_fs / "ballast"
        room = int(calls + (needed - calls) * 0.4)
        with open(ballast, "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, shutil.disk_usage(small_fs).free - room)
        full = cli(full_ws, "run", str(spec), "--store", str(store))
        assert full.returncode == 2, full.stdout[-2000:] + full.stderr[-3000:]
        errors = [ln for ln in full.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1, full.stderr[-3000:]
        assert "no space left on device writing " + str(store) in errors[0], errors[0]
        assert full.stderr.strip().splitlines()[-1] == errors[0]  # the error line ends the output
        written = list(store.rglob("seg-*.parquet"))
        assert any("/retrievals/" in str(p) for p in written), "the disk should fill mid-run, after some segments"
        # nothing partial: every segment passes its checksum and no temp file was left
        verify = cli(full_ws, "store", "verify", "--store", str(store))
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert not list(store.rglob(".tmp-*"))

        ballast.unlink()  # space freed: the same command resumes
        resumed = cli(full_ws, "run", str(spec), "--store", str(store))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert store_table(store) == expected
    verify = cli(full_ws, "store", "verify", "--store", str(store))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print(f"disk full after {len(written)} segment(s): {errors[0]}")


def _fill(fs: Path) -> Path:
    ballast = fs / "ballast"
    with open(ballast, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, shutil.disk_usage(fs).free)
    return ballast


def test_a_segment_that_does_not_fit_names_itself_and_leaves_nothing(small_fs):
    import pandas as pd

    from core.diskfull import StoreFullError
    from tracking.store.events import EventStore, new_events

    store = EventStore(small_fs / "store")
    rows = [{"event_id": f"{i:032d}", "cell": "", "qid": f"q{i}", "dataset": "jsonl", "question": "x" * 2000,
             "answers": ["a"], "gold_pids": []} for i in range(200)]
    (small_fs / "store" / "questions" / "exp").mkdir(parents=True)  # the directory fits; the segment will not
    ballast = _fill(small_fs)
    with pytest.raises(StoreFullError) as info:
        store.write("questions", new_events("questions", "exp", rows))
    assert f"no space left on device writing {small_fs / 'store' / 'questions' / 'exp'}/seg-" in str(info.value)
    assert os.listdir(small_fs / "store" / "questions" / "exp") == []  # no temp file, no partial segment
    ballast.unlink()
    path = store.write("questions", new_events("questions", "exp", rows))
    assert len(pd.read_parquet(path)) == 200 and store.verify() == (1, [])


def test_the_call_cache_on_a_full_disk_names_itself_and_keeps_what_it_had(small_fs):
    from core.diskfull import StoreFullError
    from engines.llm_cache import LLMCallCache

    cache = LLMCallCache(small_fs / "store" / "llm_cache.sqlite")
    cache.put("k0", {"text": "kept"})
    ballast = _fill(small_fs)
    with pytest.raises(StoreFullError, match=f"no space left on device writing {small_fs / 'store' / 'llm_cache.sqlite'}"):
        for i in range(1, 200):  # the WAL grows until the filesystem refuses a page
            cache.put(f"k{i}", {"text": "y" * 4000})
    ballast.unlink()
    assert cache.get("k0") == {"text": "kept"}
    cache.put("after", {"text": "fits again"})
    assert cache.get("after") == {"text": "fits again"}
