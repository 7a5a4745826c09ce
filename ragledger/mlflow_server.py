"""A local MLflow tracking server on PostgreSQL with proxied artifact storage (`infra/mlflow_server.sh`).

Clients log to `http://127.0.0.1:<port>` and upload artifacts through the server (`mlflow-artifacts:/` URIs),
so no client needs database credentials or direct access to the artifact directory. Credentials come
only from the environment: the database URI the server gets has no password in it; the password
(RAGLEDGER_PG_PASSWORD) reaches libpq as PGPASSWORD in the server's environment, so it is never part of
a command line, a log line or a state file.

With MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD set, the server runs MLflow's basic-auth app: that user
is its admin (created on the first start; its password hashed in the auth database beside the server's state), every
request but /health needs a user, and ragledger's clients send those same variables (MLflow's own). Bound beyond
127.0.0.1 (RAGLEDGER_MLFLOW_HOST) it must have them (core/exposure.py).

    python -m ragledger.mlflow_server start|stop|status   (see infra/mlflow_server.sh for the variables)
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from core.exposure import ExposureError, local_address, port_in_use, require_credentials
from core.processes import pid_alive, stop_process_group

AUTH_ENV = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")  # MLflow's client variables


def without_job_runner(env: dict[str, str]) -> dict[str, str]:
    """A server's environment without MLflow's job runner, unless the environment asks for it. MLflow 3 starts one
    beside every server on a database (8 processes of huey consumers, 1.7 GB of memory and seconds of CPU at start on
    a 2-core machine; docs/operations.md) for its GenAI jobs, which ragledger never submits."""
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **env}


class MlflowServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class PgSettings:
    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    database: str = "ragledger_mlflow"

    @classmethod
    def from_env(cls) -> PgSettings:
        env = os.environ
        return cls(env.get("RAGLEDGER_PG_HOST", cls.host), int(env.get("RAGLEDGER_PG_PORT", cls.port)),
                   env.get("RAGLEDGER_PG_USER", cls.user), env.get("RAGLEDGER_PG_DB", cls.database))

    @property
    def uri(self) -> str:  # no password: libpq takes it from PGPASSWORD
        return f"postgresql+psycopg2://{self.user}@{self.host}:{self.port}/{self.database}"


def _connect(pg: PgSettings, database: str):
    import psycopg2

    try:
        return psycopg2.connect(host=pg.host, port=pg.port, user=pg.user, dbname=database,
                                password=os.environ.get("RAGLEDGER_PG_PASSWORD"), connect_timeout=5)
    except psycopg2.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MlflowServerError(f"PostgreSQL at {pg.host}:{pg.port} (user {pg.user}): {first}") from None


def ensure_database(pg: PgSettings) -> bool:
    """Create the tracking database if it does not exist. Returns True when it was created."""
    con = _connect(pg, "postgres")
    try:
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (pg.database,))
            if cur.fetchone():
                return False
            cur.execute(f'CREATE DATABASE "{pg.database}"')
            return True
    finally:
        con.close()


def drop_database(pg: PgSettings) -> None:
    con = _connect(pg, "postgres")
    try:
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{pg.database}" WITH (FORCE)')
    finally:
        con.close()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def state_dir() -> Path:
    return Path(os.environ.get("RAGLEDGER_MLFLOW_SERVER_DIR", ".ragledger/mlflow-server")).resolve()


def status() -> str | None:
    try:
        state = json.loads((state_dir() / "server.json").read_text())
    except (OSError, ValueError):
        return None
    return state["url"] if pid_alive(int(state["pid"])) and _healthy(state["url"]) else None


def _basic_auth(base: Path, env: dict[str, str]) -> list[str]:
    """The server arguments and environment of MLflow's basic-auth app, its admin the client's own credentials.
    The password goes only into the server's environment (MLflow's MLFLOW_AUTH_ADMIN_PASSWORD), never a file."""
    config = base / "basic_auth.ini"
    config.write_text("[mlflow]\ndefault_permission = READ\n"
                      f"database_uri = sqlite:///{base / 'basic_auth.db'}\n"
                      "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    env.update({"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_AUTH_ADMIN_USERNAME": os.environ[AUTH_ENV[0]],
                "MLFLOW_AUTH_ADMIN_PASSWORD": os.environ[AUTH_ENV[1]]})
    # the key signing the UI's CSRF tokens (MLflow requires one): the user's, else new at each start (a restart
    # signs the UI's forms anew; clients using basic auth do not notice)
    env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(32))
    return ["--app-name", "basic-auth"]


def _artifacts_destination(base: Path) -> tuple[str, dict[str, str]]:
    """Where the server keeps the artifacts clients upload through it (RAGLEDGER_MLFLOW_ARTIFACTS): a folder (made
    here), or an s3:// URL on any S3-compatible service, which every machine's MLflow server may share. A bucket is
    asked now, through the standard AWS variables (a missing bucket or refused credentials: MlflowServerError, one
    line naming the URL), and its endpoint reaches MLflow as MLFLOW_S3_ENDPOINT_URL; the credentials stay in the
    server's environment. With the server proxying artifacts, clients need no S3 credentials at all."""
    from tracking.store.objects import StorageError, endpoint, is_s3_url, s3_objects

    given = os.environ.get("RAGLEDGER_MLFLOW_ARTIFACTS") or str(base / "artifacts")
    if not is_s3_url(given):
        folder = Path(given).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder), {}
    try:
        s3_objects(given, "RAGLEDGER_MLFLOW_ARTIFACTS").check()
    except StorageError as exc:
        raise MlflowServerError(str(exc)) from None
    own = "MLFLOW_S3_ENDPOINT_URL" in os.environ or not endpoint()  # MLflow's own setting, or AWS itself
    return given.rstrip("/"), ({} if own else {"MLFLOW_S3_ENDPOINT_URL": str(endpoint())})


def start(port: int = 5001, timeout_s: float = 180.0, host: str = "127.0.0.1") -> tuple[str, bool]:
    """Start the server in the background (idempotent), bound to `host`. Returns (url, started_now)."""
    authenticated = all(os.environ.get(name) for name in AUTH_ENV)
    require_credentials("the MLflow server", host, authenticated, " and ".join(AUTH_ENV) + " (its admin user)")
    url = status()
    if url:
        return url, False
    if port_in_use(host, port):
        raise MlflowServerError(f"{host}:{port} is in use by another process; choose another port "
                                "(RAGLEDGER_MLFLOW_PORT)")
    base = state_dir()
    artifacts, artifacts_env = _artifacts_destination(base)  # a bucket refused before anything is made
    pg = PgSettings.from_env()
    ensure_database(pg)
    base.mkdir(parents=True, exist_ok=True)
    url = f"http://{local_address(host)}:{port}"
    env = without_job_runner({**os.environ, "MLFLOW_BACKEND_STORE_URI": pg.uri, **artifacts_env})
    if os.environ.get("RAGLEDGER_PG_PASSWORD"):
        env["PGPASSWORD"] = os.environ["RAGLEDGER_PG_PASSWORD"]
    env.pop("RAGLEDGER_PG_PASSWORD", None)
    auth_args = _basic_auth(base, env) if authenticated else []
    log = base / "server.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", "1",
             "--serve-artifacts", "--artifacts-destination", artifacts, *auth_args],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not _healthy(url):
        if proc.poll() is not None:
            raise MlflowServerError(f"mlflow server exited with code {proc.returncode}; see {log}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            raise MlflowServerError(f"mlflow server did not answer at {url} within {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)
    (base / "server.json").write_text(json.dumps({"pid": proc.pid, "url": url, "backend": pg.uri,
                                                  "artifacts": artifacts, "log": str(log),
                                                  "auth": "basic-auth" if authenticated else None}))
    return url, True


def stop() -> bool:
    path = state_dir() / "server.json"
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return False
    if pid_alive(pid):
        stop_process_group(pid, grace_s=15)
    path.unlink(missing_ok=True)
    return True


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    try:
        if command == "start":
            url, started = start(int(os.environ.get("RAGLEDGER_MLFLOW_PORT", "5001")),
                                 host=os.environ.get("RAGLEDGER_MLFLOW_HOST", "127.0.0.1"))
            print(f"MLflow server {'started' if started else 'already running'}: {url}  "
                  f"(backend {PgSettings.from_env().uri}; use it with MLFLOW_TRACKING_URI={url})")
        elif command == "stop":
            print("MLflow server stopped" if stop() else "no MLflow server was running")
        elif command == "status":
            url = status()
            print(f"MLflow server: {url}" if url else "MLflow server: not running")
            return 0 if url else 1
        else:
            print(f"usage: {Path(sys.argv[0]).name} start|stop|status", file=sys.stderr)
            return 2
    except ExposureError as exc:  # the user must set credentials or bind loopback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MlflowServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
