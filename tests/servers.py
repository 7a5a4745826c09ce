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
    the user and password of its basic-auth app."""

    def __init__(self, server_dir: Path, password: str | None = None, auth: tuple[str, str] | None = None):
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
