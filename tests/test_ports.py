"""A service started on a port another process listens on: one `error:` line naming the address and the setting
that chooses the port, before anything is started or written (core/exposure.py `port_in_use`). MLflow's UI exited
0 with the bind error in its log, and MLflow's server and Prefect's said it in theirs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.exposure import port_in_use

RAGLEDGER = str(Path(sys.executable).parent / "ragledger")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def taken_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_port_in_use(taken_port):
    assert port_in_use("127.0.0.1", taken_port)
    assert port_in_use("0.0.0.0", taken_port)  # a wildcard bind needs the loopback port too
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert not port_in_use("127.0.0.1", free)


@pytest.mark.parametrize("starter", ["ui", "prefect", "mlflow", "dask"])
def test_a_taken_port_is_one_error_line(starter, taken_port, tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "RAGLEDGER_MLFLOW_PORT": str(taken_port),
           "RAGLEDGER_MLFLOW_SERVER_DIR": str(tmp_path / "mlflow-server"), "RAGLEDGER_DASK_DIR": str(tmp_path / "dask")}
    command = {"ui": [RAGLEDGER, "ui", "--port", str(taken_port)],
               "prefect": [RAGLEDGER, "server", "start", "--port", str(taken_port)],
               "mlflow": ["bash", str(REPO / "infra" / "mlflow_server.sh"), "start"],
               "dask": [sys.executable, "-m", "ragledger.dask_cluster", "start", "--port", str(taken_port)]}[starter]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert f"127.0.0.1:{taken_port} is in use by another process" in lines[0] and "choose another port" in lines[0]
    # nothing started or written; the Prefect home only made (its start-up lock, under which the port is asked)
    made = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")]
    assert not [m for m in made if not m.startswith("prefect") or "ragledger-server" in m], made
