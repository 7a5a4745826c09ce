"""MLflow layout: one parent run per experiment execution, one nested run per cell.

Params are the cell's full config (secrets never: API keys are referenced by env-var name only and
URL credentials are redacted); metrics go in one batched call per run (no per-example log_metric);
record segments are artifacts under `records/<kind>/`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from core.crash import crashpoint
from core.secrets import redact_url

# the tag naming the execution an MLflow run (parent, cell) or trace belongs to
EXECUTION_TAG = "ragledger.execution"
# a key naming a credential; "token" only as the last word, so max_tokens (a sampling parameter) stays visible
SECRET_PATTERN = re.compile(r"(?i)(api[_-]?key|password|passwd|secret|(^|[_.-])token$)")


def default_tracking_uri(workdir: Path | None = None) -> str:
    base = (workdir or Path.cwd()) / ".ragledger"
    base.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(base / 'mlflow.db').resolve()}"


def given_tracking_uri(spec_uri: str | None) -> str | None:
    """The tracking URI the spec or the command gives, else MLflow's variable; None: the embedded default."""
    return spec_uri or os.environ.get("MLFLOW_TRACKING_URI")


def resolve_tracking_uri(spec_uri: str | None) -> str:
    return given_tracking_uri(spec_uri) or default_tracking_uri()


def is_tracking_server(tracking_uri: str | None) -> bool:
    """Whether the tracking URI is an MLflow server's (http(s)), not a store opened in this process (sqlite,
    postgresql, a folder)."""
    return bool(tracking_uri) and tracking_uri.startswith(("http://", "https://"))


def safe_spec(spec_dict: dict) -> dict:
    """The spec as it may be shown anywhere (MLflow, manifests): URL credentials redacted."""
    safe = json.loads(json.dumps(spec_dict))
    safe.get("model", {})["base_url"] = redact_url(safe.get("model", {}).get("base_url"))
    if safe.get("tracking", {}).get("mlflow_uri"):
        safe["tracking"]["mlflow_uri"] = redact_url(safe["tracking"]["mlflow_uri"])
    return safe


def flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        out[prefix] = ",".join(map(str, value))[:6000]
    else:
        if SECRET_PATTERN.search(prefix.split(".")[-1]) and not prefix.endswith("_env"):
            value = "***"
        out[prefix] = str(value)[:6000]


@contextlib.contextmanager
def _sqlite_init_lock(tracking_uri: str) -> Iterator[None]:
    """Hold an exclusive lock beside a SQLite store while this process first opens it.

    MLflow creates and migrates the schema on a store's first use; four runs starting at once on a new
    store ran the migrations concurrently and one failed (AttributeError: dimension_attributes). Server
    stores (postgresql, http) migrate once on their side and need no lock."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    # MLflow says at INFO on the terminal that it creates and updates a new store's tables: its own bookkeeping
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    db = Path(tracking_uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".init.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# MLflow's own HTTP retries (7, backoff factor 2: ~4 minutes per request) made a stopped tracking server hold a
# finished run for minutes before its logging was set aside as pending (tracking/mlflow/sync.py); these bound it to
# seconds unless the user set them
HTTP_RETRY_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


def check_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Raise ConnectionError when an http(s) tracking server does not answer at all (refused, timed out); any HTTP
    answer counts as reachable (a server without /health). Other stores (sqlite, postgresql) fail on first use."""
    import urllib.error
    import urllib.request

    if not is_tracking_server(tracking_uri):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConnectionError(f"no answer ({reason})") from None


class MlflowCredentialsError(PermissionError):
    """The tracking server refused this process's credentials (MLFLOW_TRACKING_USERNAME/PASSWORD)."""


def check_credentials(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Raise MlflowCredentialsError when an http(s) tracking server answers an authenticated route with 401/403 for
    this process's MLFLOW_TRACKING_USERNAME/PASSWORD (MLflow's basic-auth app; /health answers everyone). A server
    that does not answer is left to check_reachable and the pending path; one that accepted the connection but is
    slow to answer (its password hashing on a loaded machine) is asked once more, waiting 3x as long, since it
    would otherwise refuse the credentials only at the run's end. A request needs no MLflow import."""
    import urllib.error
    import urllib.request

    from core.exposure import basic_auth_header

    if not is_tracking_server(tracking_uri):
        return
    request = urllib.request.Request(f"{tracking_uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        request.add_header("Authorization", basic_auth_header(f"{user}:{password}"))
    for wait in (timeout_s, 3 * timeout_s):
        try:
            with urllib.request.urlopen(request, timeout=wait):
                return
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                said = "refused the credentials in" if user and password else "requires credentials: set"
                raise MlflowCredentialsError(f"the MLflow server at {redact_url(tracking_uri)} {said} "
                                             "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD") from None
            return
        except (urllib.error.URLError, OSError) as exc:
            if not isinstance(getattr(exc, "reason", exc), TimeoutError):  # refused, unknown host: not answering
                return


def preload(tracking_uri: str) -> None:
    """Import MLflow and open the tracking store of `tracking_uri` ahead of the logging: a run calls this in a
    background thread while its model calls are in flight (seconds of imports and, for SQLite, the schema check),
    so the logging at its end starts at once. MLflow keeps one store per URI, which the logging then reuses.
    Never raises: the logging meets and reports whatever fails here. A SQLite store that does not exist yet is
    only imported for, not created: its schema's creation takes several transactions, and a run that fails
    meanwhile ends its process without waiting for this thread, which left half a schema the next run could not
    open ("table latest_metrics already exists")."""
    try:
        from mlflow import MlflowClient

        for name, value in HTTP_RETRY_DEFAULTS.items():
            os.environ.setdefault(name, value)
        if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).exists():
            return
        with _sqlite_init_lock(tracking_uri):
            MlflowClient(tracking_uri=tracking_uri)._tracking_client.store  # noqa: B018 (opening it is the point)
    except Exception:  # unreachable, misconfigured: the logging reports it, with the run's context
        return


class MlflowLogger:
    def __init__(self, tracking_uri: str, experiment_name: str):
        from mlflow import MlflowClient

        for name, value in HTTP_RETRY_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.tracking_uri = tracking_uri
        # a client bound to this URI, never mlflow.set_tracking_uri: that also sets MLFLOW_TRACKING_URI in
        # os.environ, so every later run of a long-lived process (a schedule server) and every process it
        # starts would log to this run's store instead of its own
        with _sqlite_init_lock(tracking_uri):
            self.client = MlflowClient(tracking_uri=tracking_uri)
            self._open_experiment(experiment_name)

    def _open_experiment(self, experiment_name: str) -> None:
        tracking_uri = self.tracking_uri
        exp = self.client.get_experiment_by_name(experiment_name)
        if exp is None:
            artifact_location = None
            if tracking_uri.startswith("sqlite:///"):
                # embedded default: artifacts beside the SQLite file
                artifact_location = (Path(tracking_uri.removeprefix("sqlite:///")).parent / "mlartifacts").resolve().as_uri()
            try:
                self.experiment_id = self.client.create_experiment(
                    experiment_name,
                    artifact_location=artifact_location,
                    # open in the classic runs view, not the GenAI overview
                    tags={"mlflow.experimentKind": "custom_model_development"},
                )
            except Exception:  # created concurrently by another run
                exp = self.client.get_experiment_by_name(experiment_name)
                assert exp is not None
                self.experiment_id = exp.experiment_id
        else:
            self.experiment_id = exp.experiment_id

    def close_abandoned_runs(self) -> int:
        """Runs left RUNNING by a killed process on this host are marked KILLED (their pid is gone)."""
        import socket

        from core.processes import pid_alive

        closed = 0
        host = socket.gethostname()
        for run in self.client.search_runs([self.experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000):
            tags = run.data.tags
            pid = tags.get("ragledger.pid", "")
            if tags.get("ragledger.host") == host and pid.isdigit() and not pid_alive(int(pid)):
                self.client.set_terminated(run.info.run_id, "KILLED")
                closed += 1
        return closed

    def runs_with_tag(self, key: str, value: str) -> list[Any]:
        """The experiment's runs (any status, not deleted) whose tag `key` is `value`."""
        quoted = value.replace("'", "\\'")
        return list(self.client.search_runs([self.experiment_id], filter_string=f"tags.\"{key}\" = '{quoted}'",
                                            max_results=10000))

    @staticmethod
    def owner_tags() -> dict[str, str]:
        """Which process logs a run: close_abandoned_runs ends a RUNNING run whose process is gone."""
        import socket

        return {"ragledger.pid": str(os.getpid()), "ragledger.host": socket.gethostname()}

    def start_run(self, name: str, tags: dict[str, str], parent_run_id: str | None = None) -> str:
        tags = {**tags, **self.owner_tags()}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        return run.info.run_id

    def log(self, run_id: str, params: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
            tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, 0) for k, v in (metrics or {}).items() if v is not None and not math.isnan(float(v))]
        ps = [Param(k, v) for k, v in (params or {}).items()]
        ts = [RunTag(k, v) for k, v in (tags or {}).items()]
        for i in range(0, max(len(ms), len(ps), len(ts), 1), 100):  # MLflow caps a batch at 100 params
            self.client.log_batch(run_id, metrics=ms[i : i + 1000], params=ps[i : i + 100], tags=ts[i : i + 100])

    def log_artifacts(self, run_id: str, files: list[str | Path], artifact_path: str) -> None:
        for f in files:
            if f and Path(f).exists():
                crashpoint("mlflow.log")
                self.client.log_artifact(run_id, str(f), artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self.client.log_text(run_id, text, artifact_file)

    def log_spec(self, run_id: str, spec_dict: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "spec.yaml"
            p.write_text(yaml.safe_dump(spec_dict, sort_keys=False))
            self.client.log_artifact(run_id, str(p))

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)
