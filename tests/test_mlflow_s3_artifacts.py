"""A lab's MLflow across machines: the tracking server (infra/mlflow_server.sh, PostgreSQL) keeps its artifacts in a
bucket of an S3-compatible server (moto's server mode as its own process: RAGLEDGER_MLFLOW_ARTIFACTS=s3://...), the
same service that holds the ledger (`--store s3://...`). Machine A runs an experiment into the bucket's store and
logs it; machine C, with no S3 credential at all, pulls it from MLflow into an empty folder (the artifacts proxied by
the server) and has A's outcomes. A missing bucket stops the server's start with one error line."""

from __future__ import annotations

import io
import subprocess

import pandas as pd
import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.servers import REPO, MlflowServer, S3Server
from tests.test_reliability import cli, make_data, reader, write_spec

OUTCOMES = "SELECT cell, qid, prediction, em, f1, error_type FROM outcomes ORDER BY cell, qid"


def _frame(proc) -> pd.DataFrame:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_json(io.StringIO(proc.stdout))


def test_artifacts_in_a_bucket_and_a_pull_by_a_machine_without_s3_credentials(tmp_path):
    if S3Server().lab:
        pytest.skip("the MLflow server here is started against moto's endpoint")
    ws = tmp_path / "ws"
    ws.mkdir()
    make_data(ws, 6)
    with S3Server() as s3:
        artifacts = s3.url("mlflow")
        server = MlflowServer(tmp_path / "mlflow-server", env={**s3.env, "RAGLEDGER_MLFLOW_ARTIFACTS": artifacts})
        server.start()
        try:
            store = s3.url("store")
            with ScriptedServer(answer=reader) as model:
                spec = write_spec(ws, model.base_url, name="shared")
                done = cli(ws, "run", str(spec), "--store", store,
                           env={**s3.env, "RAGLEDGER_HOME": str(ws / "machine-a"), "MLFLOW_TRACKING_URI": server.url})
                assert done.returncode == 0, done.stderr[-3000:]
            logged = s3.keys(artifacts)  # the records MLflow keeps went to the bucket, through the server
            assert any(k.endswith(".parquet") and "/artifacts/records/outcomes/" in k for k in logged), logged
            assert not list((tmp_path / "mlflow-server").rglob("*.parquet"))

            c = tmp_path / "machine-c"
            c.mkdir()
            pulled = cli(c, "pull", "shared", "--store", str(c / "store"), "--mlflow-uri", server.url,
                         env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_ENDPOINT_URL": ""})
            assert pulled.returncode == 0, pulled.stderr[-3000:]
            mine = _frame(cli(c, "query", OUTCOMES, "--store", str(c / "store"), "--format", "json"))
            theirs = _frame(cli(ws, "query", OUTCOMES, "--store", store, "--format", "json",
                                env={**s3.env, "RAGLEDGER_HOME": str(ws / "machine-b")}))
            assert len(mine) == 12
            pd.testing.assert_frame_equal(mine, theirs)
        finally:
            server.drop()

        missing = MlflowServer(tmp_path / "no-bucket",
                               env={**s3.env, "RAGLEDGER_MLFLOW_ARTIFACTS": "s3://no-such-bucket-here/mlflow"})
        started = subprocess.run(["bash", str(REPO / "infra" / "mlflow_server.sh"), "start"], env=missing.env,
                                 capture_output=True, text=True, timeout=120)
        assert started.returncode == 1 and started.stderr.strip().splitlines() == [
            "error: RAGLEDGER_MLFLOW_ARTIFACTS s3://no-such-bucket-here/mlflow: no bucket 'no-such-bucket-here' at "
            f"{s3.endpoint}"], started.stderr
