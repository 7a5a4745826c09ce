"""The MLflow tracking server on PostgreSQL (infra/mlflow_server.sh): a small experiment logs to it over HTTP
with proxied artifacts, and another process reads the runs back with `mlflow.search_runs` and downloads a
record segment through the server. The database password given to the server is nowhere to be found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import PG_PASSWORD as PASSWORD
from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli, make_data, reader, write_spec

REPO = Path(__file__).resolve().parent.parent


def test_experiment_logs_to_mlflow_on_postgres_and_another_process_reads_it(tmp_path, mlflow_postgres):
    url, server_dir = mlflow_postgres
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
