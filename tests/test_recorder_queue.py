"""ragledger/recorder.py's queue of recordings: a recorder takes those of its own working directory, oldest first,
and drops those with nothing left to record (their store or manifest gone) or unreadable."""

from __future__ import annotations

import json
from pathlib import Path

from ragledger import recorder


def queue(home: Path, name: str, job: dict | str) -> Path:
    path = home / "recordings" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job if isinstance(job, str) else json.dumps(job))
    return path


def test_a_recorder_takes_its_directorys_recordings_oldest_first_and_drops_what_is_gone(tmp_path, monkeypatch):
    home, here, elsewhere = tmp_path / "home", tmp_path / "here", tmp_path / "elsewhere"
    for d, store in ((here, "store"), (elsewhere, "its-store")):
        (d / store / "runs").mkdir(parents=True)
        (d / store / "runs" / "m.json").write_text("{}")
    monkeypatch.setenv("RAGLEDGER_HOME", str(home))
    monkeypatch.chdir(here)

    def job(cwd: Path, store: str = "store", manifest: str | None = "store/runs/m.json") -> dict:
        return {"store_root": store, "tracking_uri": "sqlite:///x.db", "manifest": manifest, "spec_json": "{}",
                "cwd": str(cwd)}

    second = queue(home, "20-1", job(here))
    first = queue(home, "3-1", job(here, manifest=None))  # a logging only, queued earlier (ordered by time, not text)
    other = queue(home, "1-1", job(elsewhere, "its-store", "its-store/runs/m.json"))  # its own recorder's
    gone = [queue(home, "4-1", job(here, store="no-store")), queue(home, "5-1", job(here, manifest="store/runs/x.json")),
            queue(home, "6-1", "{not json")]
    at_a_url = queue(home, "7-1", job(here, store="s3://bucket/store", manifest="s3-mirror/runs/m.json"))
    gone.append(queue(home, "8-1", job(tmp_path / "deleted")))  # a directory removed since (a test's, say)
    being_written = queue(home, ".tmp-1-ab", job(here))  # core/atomic.py's temporary name: not a recording yet

    assert [path for path, _ in recorder._queued_here(str(here))] == [first, at_a_url, second]
    assert not any(p.exists() for p in gone) and other.exists()  # the other directory's store is not looked for here
    assert being_written.exists()
