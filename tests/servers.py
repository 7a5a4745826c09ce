"""Servers the tests start as a user would (infra scripts), and the free port each listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port nothing on 127.0.0.1 listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """The project's MLflow tracking server (infra/mlflow_server.sh) on a fresh PostgreSQL database of its own, on a
    free port; it can be stopped and started again on the same port and database. `password`, when given, reaches
    the server through its environment only (the secrets test looks for it everywhere else); `auth`, when given, is
    the user and password of its basic-auth app; `env`, more of the server's environment."""

    def __init__(self, server_dir: Path, password: str | None = None, auth: tuple[str, str] | None = None,
                 env: dict[str, str] | None = None):
        self.db = f"ragledger_test_{uuid.uuid4().hex[:8]}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server_dir = server_dir
        self.env = {**os.environ, "RAGLEDGER_PG_DB": self.db, "RAGLEDGER_MLFLOW_PORT": str(self.port),
                    "RAGLEDGER_MLFLOW_SERVER_DIR": str(server_dir)}
        if password is not None:
            self.env["RAGLEDGER_PG_PASSWORD"] = password
        if auth is not None:  # MLflow's basic-auth app, `auth` its admin user (ragledger/mlflow_server.py)
            self.env["MLFLOW_TRACKING_USERNAME"], self.env["MLFLOW_TRACKING_PASSWORD"] = auth
        self.env.update(env or {})  # e.g. RAGLEDGER_MLFLOW_ARTIFACTS and the AWS variables of an S3 artifact root

    def _script(self, command: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "infra" / "mlflow_server.sh"), command], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        """Start it (creating its database on first start); an unreachable PostgreSQL is one clear failure."""
        from ragledger.mlflow_server import MlflowServerError, PgSettings, ensure_database

        try:
            ensure_database(PgSettings(database=self.db))
        except MlflowServerError as exc:
            raise MlflowServerError(f"{exc}: these tests need PostgreSQL on 127.0.0.1:5432 (start it with: "
                                    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start)") from None
        done = self._script("start")
        assert done.returncode == 0, done.stdout + done.stderr

    def stop(self) -> None:
        done = self._script("stop", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

    def drop(self) -> None:
        """Stop it if it runs, and drop its database."""
        from ragledger.mlflow_server import PgSettings, drop_database

        self._script("stop", timeout=60)
        drop_database(PgSettings(database=self.db))


class S3Server:
    """An S3-compatible service for the object-store tests: moto's server mode started as its own process on a free
    port and talked to over HTTP by boto3, or, when RAGLEDGER_TEST_S3_URL names a bucket (s3://BUCKET[/PREFIX]) and
    the AWS_* variables its endpoint and credentials, a lab's own service (MinIO, Ceph, AWS). `env` is what a
    ragledger process needs to reach it; `url(name)` a fresh store URL in the bucket. `no_auth_actions` starts moto
    enforcing credentials after that many requests (moto's INITIAL_NO_AUTH_ACTION_COUNT): a wrong key is refused."""

    BUCKET = "ragledger-test"

    def __init__(self, no_auth_actions: int | None = None):
        self.proc: subprocess.Popen | None = None
        self.lab = os.environ.get("RAGLEDGER_TEST_S3_URL")
        self.no_auth_actions = no_auth_actions
        self.env: dict[str, str] = {}

    def __enter__(self) -> S3Server:
        import sys
        import time
        import urllib.request

        if self.lab:
            bucket, _, prefix = self.lab.removeprefix("s3://").partition("/")
            self.bucket, self.prefix = bucket, prefix.strip("/")
            self.env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
            return self
        self.bucket, self.prefix = self.BUCKET, ""
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        server_env = {**os.environ}
        if self.no_auth_actions is not None:
            server_env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(self.no_auth_actions)
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                     env=server_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start on port {port}") from None
                time.sleep(0.2)
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "ragledger-test-key",
                    "AWS_SECRET_ACCESS_KEY": "ragledger-test-secret", "AWS_REGION": "us-east-1"}
        if self.no_auth_actions is None:
            self.client().create_bucket(Bucket=self.bucket)
        return self

    def client(self, **overrides: str):
        import boto3

        env = {**self.env, **overrides}
        return boto3.session.Session(aws_access_key_id=env.get("AWS_ACCESS_KEY_ID"),
                                     aws_secret_access_key=env.get("AWS_SECRET_ACCESS_KEY"),
                                     region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
                                     ).client("s3", endpoint_url=env.get("AWS_ENDPOINT_URL"))

    def iam_users(self, policies: dict[str, list[str]]) -> dict[str, dict[str, str]]:
        """IAM users of moto's server, each allowed the S3 actions its `policies` entry lists: each user's AWS
        variables, by name. Three requests a user, made before moto enforces credentials (`no_auth_actions`)."""
        import json

        import boto3

        iam = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup",
                                    region_name="us-east-1").client("iam", endpoint_url=self.endpoint)
        users = {}
        for user, actions in policies.items():
            iam.create_user(UserName=user)
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
            iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(policy))
            key = iam.create_access_key(UserName=user)["AccessKey"]
            users[user] = {**self.env, "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                           "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        return users

    def point(self, monkeypatch) -> S3Server:
        """Point this process's AWS variables at this service only (no endpoint, profile or session token of the
        environment's own left to mix in)."""
        for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        return self

    def url(self, name: str) -> str:
        """A store URL no other test uses."""
        return f"s3://{self.bucket}/" + "/".join(p for p in (self.prefix, f"{name}-{uuid.uuid4().hex[:8]}") if p)

    def keys(self, url: str) -> list[str]:
        """Every key under a store URL, relative to it."""
        prefix = url.removeprefix(f"s3://{self.bucket}/") + "/"
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
