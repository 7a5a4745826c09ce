"""The MLflow tracking server on PostgreSQL (infra/mlflow_server.sh): a small experiment logs to it over HTTP
with proxied artifacts, and another process reads the runs back with `mlflow.search_runs` and downloads a
record segment through the server. The database password given to the server is nowhere to be found."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli, make_data, reader, write_spec

REPO = Path(__file__).resolve().parent.parent
PASSWORD = "pg-Secret-" + uuid.uuid4().hex[:10]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    from ragledger.mlflow_server import MlflowServerError, PgSettings, drop_database, ensure_database

    db = f"ragledger_test_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "RAGLEDGER_PG_DB": db, "RAGLEDGER_PG_PASSWORD": PASSWORD,
           "RAGLEDGER_MLFLOW_PORT": str(_free_port()), "RAGLEDGER_MLFLOW_SERVER_DIR": str(tmp_path / "server")}
    pg = PgSettings(database=db)
    try:
        ensure_database(pg)
    except MlflowServerError as exc:
        pytest.fail(f"{exc}: these tests need PostgreSQL on 127.0.0.1:5432 (started on this machine kind; "
                    "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)")
    script = [str(REPO / "infra" / "mlflow_server.sh")]
    started = subprocess.run(["bash", *script, "start"], env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    url = f"http://127.0.0.1:{env['RAGLEDGER_MLFLOW_PORT']}"
    try:
        yield url, tmp_path / "server"
    finally:
        subprocess.run(["bash", *script, "stop"], env=env, capture_output=True, text=True, timeout=60)
        drop_database(pg)


def test_experiment_logs_to_mlflow_on_postgres_and_another_process_reads_it(tmp_path, mlflow_server):
    url, server_dir = mlflow_server
    ws = tmp_path / "ws"
    ws.mkdir()
    make_data(ws, 6)
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(ws, model.base_url, name="pgexp")
        data = yaml.safe_load(spec.read_text())
        data["tracking"] = {"mlflow_uri": url}
        spec.write_text(yaml.safe_dump(data))
        proc = cli(ws, "run", str(spec), "--json", str(ws / "summary.json"))
        assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((ws / "summary.json").read_text())
    assert summary["tracking_uri"] == url

    reader_code = f"""
import json, mlflow, pandas as pd
mlflow.set_tracking_uri({url!r})
runs = mlflow.search_runs(experiment_names=["pgexp"], output_format="list")
client = mlflow.MlflowClient()
cells = [r for r in runs if r.data.tags.get("ragledger.level") == "cell"]
folder = client.download_artifacts(cells[0].info.run_id, "records/outcomes")
import glob
rows = sum(len(pd.read_parquet(f)) for f in glob.glob(folder + "/*.parquet"))
print(json.dumps({{"runs": [{{"id": r.info.run_id, "name": r.info.run_name, "level": r.data.tags.get("ragledger.level"),
                  "em": r.data.metrics.get("em"), "f1": r.data.metrics.get("f1"), "artifact_uri": r.info.artifact_uri,
                  "params": r.data.params, "tags": r.data.tags}} for r in runs], "outcome_rows": rows}}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run([sys.executable, "-c", reader_code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    levels = sorted(r["level"] for r in got["runs"])
    assert levels == ["cell", "cell", "experiment"], levels
    for r in got["runs"]:
        assert r["artifact_uri"].startswith("mlflow-artifacts:"), r["artifact_uri"]  # proxied through the server
        if r["level"] == "cell":
            assert r["em"] == pytest.approx(summary["cells"][r["name"]]["em"])
            assert r["f1"] == pytest.approx(summary["cells"][r["name"]]["f1"])
    assert got["outcome_rows"] == 6
    # the database password reached the server only through its environment
    assert PASSWORD not in json.dumps(got)
    for f in server_dir.rglob("*"):
        if f.is_file():
            assert PASSWORD.encode() not in f.read_bytes(), f
    print(f"MLflow on PostgreSQL: {len(got['runs'])} runs read back from another process; cell EM/F1 match; "
          f"artifacts proxied ({got['runs'][0]['artifact_uri'].split('/')[0]}...)")
