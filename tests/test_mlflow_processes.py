"""The MLflow servers ragledger starts carry only what it uses: no MLflow job runner (its huey consumers, for GenAI
jobs ragledger never submits: 8 processes and 1.7 GB on the 2-core machine) beside `ragledger ui` or the tracking
server of infra/mlflow_server.sh, and one worker for `ragledger ui` (docs/operations.md)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.servers import free_port

RAGLEDGER = str(Path(sys.executable).parent / "ragledger")

JOB_RUNNER = ("mlflow.server.jobs", "huey")


def group_commands(pgid: int) -> list[str]:
    """The command lines of the processes of one process group."""
    out = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3]) == pgid:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2):
            return
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)


@contextlib.contextmanager
def ragledger_ui(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """`ragledger ui` on a new SQLite store, in a session of its own, once it answers; its process group ended after."""
    port, log = free_port(), tmp_path / "ui.log"
    with open(log, "w") as out:
        ui = subprocess.Popen([RAGLEDGER, "ui", "--port", str(port), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"],
                              cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", ui, log)
        yield ui
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)


def test_ragledger_ui_runs_one_worker_and_no_job_runner(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"}
    with ragledger_ui(tmp_path, env) as ui:
        time.sleep(3)  # MLflow starts its job runner after the server answers
        commands = group_commands(ui.pid)
        assert not [c for c in commands if any(j in c for j in JOB_RUNNER)], commands
        servers = [c for c in commands if "uvicorn" in c]
        assert len(servers) == 1 and "--workers 1 " in servers[0], commands
        assert not [c for c in commands if "spawn_main" in c], commands  # one worker: uvicorn serves in its own process


def test_the_tracking_server_runs_no_job_runner(mlflow_postgres):
    _, server_dir = mlflow_postgres
    pid = json.loads((Path(server_dir) / "server.json").read_text())["pid"]
    commands = group_commands(pid)  # started in a session of its own (ragledger/mlflow_server.py)
    assert any("mlflow" in c and "server" in c for c in commands), commands
    assert not [c for c in commands if any(j in c for j in JOB_RUNNER)], commands


def test_ragledger_ui_on_a_tracking_server_names_the_servers_own_ui(tmp_path):
    """`mlflow ui` cannot open an http(s) tracking URI (a traceback); a lab's server serves its UI itself."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    done = subprocess.run([RAGLEDGER, "ui"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "open http://127.0.0.1:9 in a browser" in done.stdout and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_killed_ragledger_ui_takes_its_mlflow_ui_with_it(tmp_path):
    with ragledger_ui(tmp_path) as ui:
        ui.kill()  # SIGKILL: nothing of the command runs after it
        ui.wait(timeout=30)
        deadline = time.monotonic() + 30
        while group_commands(ui.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert group_commands(ui.pid) == []
