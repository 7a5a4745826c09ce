"""ragledger/recorder.py's queue of recordings: a recorder takes those of its own working directory, oldest first,
and drops those with nothing left to record (their store or manifest gone) or unreadable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


YIELD_AND_SAY = ("import os; from ragledger.recorder import _yield_the_cores; _yield_the_cores(); "
                 "print(os.sched_getscheduler(0) == os.SCHED_IDLE); print(open('/proc/self/autogroup').read())")


def autogroup_nice(autogroup: str) -> str | None:
    """The niceness in a /proc/<pid>/autogroup text; None where the process is in no autogroup: Linux prints nothing
    there, as when a container's CPU cgroup, not the autogroup, shares out the CPU."""
    words = autogroup.split()
    return words[-1] if words else None


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling on this kernel")
def test_a_recorder_in_a_session_of_its_own_gives_its_sessions_cpu_share_away():
    """Linux gives each session's autogroup an equal share of the CPU, so SCHED_IDLE alone left a recorder (a session
    of its own) half the cores beside the user's next run; its autogroup goes to niceness 19. A process of the
    user's own session leaves the session's autogroup alone: the user's other commands share it."""
    import subprocess
    import sys

    def child(new_session: bool) -> tuple[str, str | None]:
        out = subprocess.run([sys.executable, "-c", YIELD_AND_SAY], capture_output=True, text=True, check=True,
                             start_new_session=new_session).stdout
        idle, _, autogroup = out.partition("\n")
        return idle, autogroup_nice(autogroup)

    may_lower = subprocess.run([sys.executable, "-c", "open('/proc/self/autogroup', 'w').write('19')"],
                               capture_output=True, start_new_session=True)
    if may_lower.returncode:  # a /proc mounted read-only (a container): the recorder goes on without it
        pytest.skip("this machine refuses a process its autogroup's niceness")
    own_nice = autogroup_nice(Path("/proc/self/autogroup").read_text())
    if own_nice is None:
        pytest.skip("this process is in no autogroup (its cgroup shares out the CPU): nothing to give away")
    assert child(new_session=True) == ("True", "19")
    assert child(new_session=False) == ("True", own_nice)
