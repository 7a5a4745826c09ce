"""MLflow down: the event store is the source of truth and MLflow a projection of it (tracking/mlflow/sync.py).

A run whose MLflow tracking server (PostgreSQL-backed, infra/mlflow_server.sh) is stopped before the run, or stops
while the run logs, stores all its events, ends with one `error:` line naming the MLflow URI and saying the logging
is pending (exit 2), and `ragledger sync` or the next run logs it once the server is back: exactly one parent run
and one run per cell for each execution, all FINISHED, with the cells' metrics. A run killed while logging is
completed by `ragledger sync`; `ragledger sync --all` rebuilds a new MLflow database from the store."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.servers import MlflowServer
from tests.test_reliability import cli, make_data, outcome_table, reader, write_spec

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "mlflow-server")
    server.start()
    try:
        yield server
    finally:
        server.drop()


class StoppingProxy:
    """An HTTP proxy in front of the MLflow server that stops the server (really: infra/mlflow_server.sh stop) when
    the client asks for its `stop_at`-th run: the run's logging is cut part-way, after the parent run and some cell
    runs exist."""

    def __init__(self, server: MlflowServer, stop_at: int):
        self.server, self.stop_at, self.creates, self.stopped = server, stop_at, 0, False
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy.lock:
                    if self.path.endswith("/runs/create"):
                        proxy.creates += 1
                        if proxy.creates == proxy.stop_at and not proxy.stopped:
                            proxy.server.stop()
                            proxy.stopped = True
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", proxy.server.port, timeout=60)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except OSError:
                    self.send_error(503, "MLflow server stopped")
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> StoppingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def with_tracking(spec: Path, uri: str) -> Path:
    data = yaml.safe_load(spec.read_text())
    data["tracking"] = {"mlflow_uri": uri}
    spec.write_text(yaml.safe_dump(data))
    return spec


def mlflow_runs(uri: str, experiment: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else list(client.search_runs([exp.experiment_id], max_results=1000))


def executions(store: Path, experiment: str) -> list[str]:
    return sorted(p.stem for p in (store / "runs" / experiment).glob("*.json"))


def assert_logged_once(uri: str, experiment: str, store: Path, recorded: bool = True) -> dict[str, list]:
    """Every execution in the store has exactly one parent run and one run per cell, FINISHED, with the cell
    metrics of its manifest; no other runs."""
    runs = mlflow_runs(uri, experiment)
    by_execution: dict[str, list] = {}
    for r in runs:
        by_execution.setdefault(r.data.tags.get("ragledger.execution", "?"), []).append(r)
    assert sorted(by_execution) == executions(store, experiment), sorted(by_execution)
    for execution, group in by_execution.items():
        manifest = json.loads((store / "runs" / experiment / f"{execution}.json").read_text())
        cells = manifest["summary"]["cells"]
        levels = sorted((r.data.tags.get("ragledger.level"), r.data.tags.get("ragledger.cell", "")) for r in group)
        assert levels == sorted([("experiment", "")] + [("cell", c) for c in cells]), levels
        assert all(r.info.status == "FINISHED" for r in group), [(r.info.run_name, r.info.status) for r in group]
        parent = next(r for r in group if r.data.tags.get("ragledger.level") == "experiment")
        if recorded:  # the manifest names the runs of the MLflow it was logged to
            assert manifest["summary"]["mlflow_parent_run_id"] == parent.info.run_id
        for r in group:
            if r.data.tags.get("ragledger.level") == "cell":
                assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
                assert r.data.metrics["em"] == pytest.approx(cells[r.data.tags["ragledger.cell"]]["em"])
    return by_execution


def one_error_line(proc) -> str:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    return errors[0]


def test_mlflow_stopped_before_the_run_then_sync_logs_it_exactly_once(tmp_path, mlflow_server):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_data(ws, 8)
    store = ws / ".ragledger" / "store"
    mlflow_server.stop()
    with ScriptedServer(answer=reader) as model:
        spec = with_tracking(write_spec(ws, model.base_url, name="down"), mlflow_server.url)
        proc = cli(ws, "run", str(spec))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = one_error_line(proc)
    assert f"MLflow at {mlflow_server.url}" in line and "pending" in line and "ragledger sync" in line, line
    assert not line.startswith("error: MlflowLoggingPending"), line  # a user-facing line, not a class name
    assert "EM" in proc.stdout and "model calls this run" in proc.stdout, proc.stdout  # the results, before the error
    assert len(outcome_table(ws)) == 2 * 8  # every event stored
    assert [p.stem for p in (store / "mlflow-pending" / "down").glob("*.json")] == executions(store, "down")

    still_down = cli(ws, "sync")  # the server is still down: the marker stays, the error names the URI
    assert still_down.returncode == 2 and mlflow_server.url in one_error_line(still_down)
    mlflow_server.start()
    synced = cli(ws, "sync")
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "1 execution(s) logged" in synced.stdout, synced.stdout
    assert_logged_once(mlflow_server.url, "down", store)
    again = cli(ws, "sync")  # nothing left: no second set of runs
    assert again.returncode == 0 and "0 execution(s) logged" in again.stdout, again.stdout
    assert len(mlflow_runs(mlflow_server.url, "down")) == 3
    assert not list((store / "mlflow-pending").rglob("*.json"))
    print(f"MLflow down before the run: {line}")


def test_mlflow_stopped_while_logging_then_the_next_run_logs_it_exactly_once(tmp_path, mlflow_server):
    ws = tmp_path / "ws"
    ws.mkdir()
    make_data(ws, 8)
    store = ws / ".ragledger" / "store"
    with ScriptedServer(answer=reader) as model, StoppingProxy(mlflow_server, stop_at=3) as proxy:
        spec = with_tracking(write_spec(ws, model.base_url, name="cut"), proxy.url)
        proc = cli(ws, "run", str(spec))
        assert proxy.stopped, "the server should have been stopped while the run logged"
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
        line = one_error_line(proc)
        assert f"MLflow at {proxy.url}" in line and "pending" in line, line
        mlflow_server.start()
        partial = mlflow_runs(proxy.url, "cut")
        assert len(partial) == 2, [r.info.run_name for r in partial]  # the parent and the first cell's run
        # the next run logs itself and the pending execution, completing the runs the cut left (no second set)
        nxt = cli(ws, "run", str(spec), "--json", str(ws / "summary.json"))
        assert nxt.returncode == 0, nxt.stdout[-2000:] + nxt.stderr[-3000:]
    summary = json.loads((ws / "summary.json").read_text())
    assert summary["mlflow_synced"] == executions(store, "cut")[:1]
    by_execution = assert_logged_once(mlflow_server.url, "cut", store)
    assert len(by_execution) == 2
    assert {r.info.run_id for r in partial} <= {r.info.run_id for g in by_execution.values() for r in g}
    print(f"MLflow stopped while logging: {line}")


def test_a_kill_while_logging_is_completed_by_sync_and_sync_all_rebuilds_mlflow(tmp_path):
    make_data(tmp_path, 8)
    store = tmp_path / ".ragledger" / "store"
    uri = f"sqlite:///{tmp_path / '.ragledger' / 'mlflow.db'}"
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(tmp_path, model.base_url, name="killed")
        proc = cli(tmp_path, "run", str(spec), env={"RAGLEDGER_CRASH_AT": "mlflow.log:3"})
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert 0 < len(mlflow_runs(uri, "killed")) < 3  # part of the execution logged
    synced = cli(tmp_path, "sync")
    assert synced.returncode == 0 and "1 execution(s) logged" in synced.stdout, synced.stdout + synced.stderr
    assert_logged_once(uri, "killed", store)

    # MLflow is a projection: a new database is rebuilt from the store, once however often sync runs
    rebuilt = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    for _ in range(2):
        proc = cli(tmp_path, "sync", "--all", "--tracking-uri", rebuilt)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_logged_once(rebuilt, "killed", store, recorded=False)
    assert_logged_once(uri, "killed", store)  # the manifest still names the runs of its own MLflow
    # or to where MLFLOW_TRACKING_URI points now
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    proc = cli(tmp_path, "sync", "--all", env={"MLFLOW_TRACKING_URI": elsewhere})
    assert proc.returncode == 0 and "1 execution(s) logged" in proc.stdout, proc.stdout + proc.stderr
    assert_logged_once(elsewhere, "killed", store, recorded=False)
