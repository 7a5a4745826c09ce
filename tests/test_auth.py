"""Services reachable from other machines require credentials (core/exposure.py; docs/operations.md, "Across
machines"): started beyond 127.0.0.1 without them, each of ragledger's starters refuses with one error line; started
with them, the Prefect API, the MLflow server and the Dask scheduler refuse an unauthenticated client, a run with a
wrong or missing credential ends in one error line naming the service in bounded time, having written nothing, and an
authenticated run succeeds end to end with none of the credentials anywhere it writes."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from core.exposure import ExposureError, basic_auth_header, is_loopback, require_credentials
from tests.fakes.openai_server import ScriptedServer
from tests.servers import REPO, MlflowServer, free_port
from tests.test_reliability import RAGLEDGER, make_data, reader, write_spec

BOUND_S = 60  # a refused credential is an error line within this, not a hang


def test_loopback_rule():
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("lab-host")
    require_credentials("svc", "127.0.0.1", False, "X")  # loopback: no credentials needed
    require_credentials("svc", "0.0.0.0", True, "X")  # exposed, with credentials
    with pytest.raises(ExposureError, match=r"svc on 0\.0\.0\.0 would accept anyone on the network: set X"):
        require_credentials("svc", "0.0.0.0", False, "X")
    assert basic_auth_header("lab:pw") == "Basic bGFiOnB3"  # base64("lab:pw"), as RFC 7617 gives it


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("PREFECT_", "MLFLOW_", "DASK_", "VLLM_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


@pytest.mark.parametrize("service", ["prefect", "mlflow", "dask", "vllm"])
def test_binding_beyond_loopback_without_credentials_is_refused(tmp_path, service):
    port = free_port()
    env = _clean_env(PREFECT_HOME=str(tmp_path / "prefect"), RAGLEDGER_MLFLOW_SERVER_DIR=str(tmp_path / "mlflow"),
                     RAGLEDGER_MLFLOW_HOST="0.0.0.0", RAGLEDGER_MLFLOW_PORT=str(port),
                     RAGLEDGER_DASK_DIR=str(tmp_path / "dask"), RAGLEDGER_DASK_HOST="0.0.0.0",
                     VLLM_HOST="0.0.0.0", VLLM_PORT=str(port))
    command, names = {
        "prefect": ([RAGLEDGER, "server", "start", "--host", "0.0.0.0", "--port", str(port)],
                    "PREFECT_SERVER_API_AUTH_STRING"),
        "mlflow": (["bash", str(REPO / "infra" / "mlflow_server.sh"), "start"], "MLFLOW_TRACKING_USERNAME"),
        "dask": (["bash", str(REPO / "infra" / "dask_cluster.sh"), "start", "--port", str(port)], "TLS certificates"),
        "vllm": (["bash", str(REPO / "infra" / "vllm_serve.sh")], "VLLM_API_KEY"),
    }[service]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("error: ") and "0.0.0.0 would accept anyone on the network" in lines[0], lines
    assert names in lines[0], lines
    with pytest.raises(OSError):  # nothing listens
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "a refused start wrote files"


def _status(url: str, header: str | None = None) -> int:
    request = urllib.request.Request(url)
    if header:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _scheduler_refuses_strangers(scheduler: str, foreign: Path) -> None:
    """A plain TCP client, and a TLS client whose certificate another CA signed, are refused at the handshake."""
    import dask

    from flows.runners import DaskSchedulerError, check_scheduler
    from ragledger.dask_cluster import client_config, make_certificates

    with pytest.raises(DaskSchedulerError, match="refused or did not answer"):
        check_scheduler(scheduler.replace("tls://", "tcp://"), timeout_s=10)
    make_certificates(foreign)
    config = {name.removeprefix("DASK_").lower().replace("__", ".").replace("_", "-"): value
              for name, value in client_config(foreign).items()}
    settings = {k: (v == "True" if k.endswith("require-encryption") else v) for k, v in config.items()}
    with dask.config.set(settings), pytest.raises(DaskSchedulerError, match="refused or did not answer"):
        check_scheduler(scheduler, timeout_s=10)


def _run(ws: Path, args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([RAGLEDGER, *args], cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    return done, time.monotonic() - started


def test_a_slow_mlflow_server_is_asked_again_before_its_refusal_is_missed(monkeypatch):
    """check_credentials: a server that takes the connection but answers after the first wait (MLflow's password
    hashing on a loaded machine) is asked once more, waiting longer, and its refusal is an error before the run
    starts; a server that is not there at all is left to the pending path (no error here)."""
    import http.server
    import threading

    from tracking.mlflow.log import MlflowCredentialsError, check_credentials

    asked = []

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(time.monotonic())
            if len(asked) == 1:
                time.sleep(1.5)  # past the first wait
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "lab")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    try:
        with pytest.raises(MlflowCredentialsError, match="refused the credentials"):
            check_credentials(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=0.5)
        assert len(asked) == 2
    finally:
        server.shutdown()
        server.server_close()
    check_credentials(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)  # nobody there: the pending path's


# the run itself through the TLS cluster (its worker starting its engines in a fresh HOME: minutes) in --all, as the
# other Dask tests; the default tier runs it on the thread runner, the cluster's refusals included
@pytest.mark.parametrize("through_dask", [False, pytest.param(True, marks=pytest.mark.extended)])
@pytest.mark.timeout(900)  # three servers, a TLS cluster, four runs
def test_authenticated_services_refuse_strangers_and_serve_a_run(tmp_path, through_dask):
    prefect_auth = f"lab:{secrets.token_hex(12)}"
    mlflow_user, mlflow_password = "ragledger-lab", f"mlpw-{secrets.token_hex(12)}"
    secret_values = [prefect_auth.split(":", 1)[1], mlflow_password]
    ws = tmp_path / "ws"
    ws.mkdir()
    make_data(ws, 6)
    base = _clean_env(PREFECT_HOME=str(tmp_path / "prefect-home"), RAGLEDGER_INDEX_DIR=str(ws / "indexes"),
                      RAGLEDGER_DASK_DIR=str(tmp_path / "dask"))
    started: list[list[str]] = []
    mlflow = MlflowServer(tmp_path / "mlflow-server", auth=(mlflow_user, mlflow_password))
    try:
        # the Prefect server as `ragledger server start` starts it, with its auth string
        prefect_port = free_port()
        server_env = {**base, "PREFECT_SERVER_API_AUTH_STRING": prefect_auth}
        started.append([RAGLEDGER, "server", "stop"])  # before the start: a start cut short is stopped too
        done = subprocess.run([RAGLEDGER, "server", "start", "--port", str(prefect_port)], cwd=tmp_path,
                              env=server_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        api = f"http://127.0.0.1:{prefect_port}/api"
        assert _status(f"{api}/admin/version") == 401
        assert _status(f"{api}/admin/version", basic_auth_header("lab:wrong")) == 401
        assert _status(f"{api}/admin/version", basic_auth_header(prefect_auth)) == 200

        mlflow.start()  # MLflow's basic-auth app, its admin the client's user
        search = f"{mlflow.url}/api/2.0/mlflow/experiments/search?max_results=1"
        assert _status(search) == 401
        assert _status(search, basic_auth_header(f"{mlflow_user}:{mlflow_password}")) == 200

        # the Dask cluster with mutual TLS (certificates made by the script), workers reporting to the Prefect API
        cluster_env = {**base, "PREFECT_API_URL": api, "PREFECT_API_AUTH_STRING": prefect_auth,
                       "RAGLEDGER_DASK_PORT": str(free_port()), "RAGLEDGER_DASK_WORKERS": "1"}
        script = ["bash", str(REPO / "infra" / "dask_cluster.sh")]
        done = subprocess.run([*script, "certs"], cwd=tmp_path, env=cluster_env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        tls_env = dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines()
                       if line.startswith("export "))
        started.append([*script, "stop"])
        done = subprocess.run([*script, "start"], cwd=tmp_path, env=cluster_env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        scheduler = done.stdout.split("--scheduler ")[1].split(")")[0]
        assert scheduler.startswith("tls://127.0.0.1:"), done.stdout
        _scheduler_refuses_strangers(scheduler, tmp_path / "foreign-tls")

        with ScriptedServer(answer=reader) as model:
            spec = write_spec(ws, model.base_url, name="authexp")
            right = {**base, "PREFECT_API_URL": api, "PREFECT_API_AUTH_STRING": prefect_auth,
                     "MLFLOW_TRACKING_URI": mlflow.url, "MLFLOW_TRACKING_USERNAME": mlflow_user,
                     "MLFLOW_TRACKING_PASSWORD": mlflow_password, **tls_env}
            store = ws / ".ragledger" / "store"
            wrong = {  # service -> (the environment with its credential wrong or missing, what the line names)
                "prefect": ({**right, "PREFECT_API_AUTH_STRING": "lab:wrong-password"}, f"the Prefect API at {api}"),
                "mlflow": ({**right, "MLFLOW_TRACKING_PASSWORD": "wrong-password"}, "the MLflow server at"),
                "dask": ({k: v for k, v in right.items() if not k.startswith("DASK_")},
                         f"the Dask scheduler at {scheduler}"),
            }
            for service, (env, named) in wrong.items():
                done, seconds = _run(ws, ["run", str(spec), "--scheduler", scheduler], env)
                lines = done.stderr.strip().splitlines()
                assert done.returncode == 2 and len(lines) == 1, (service, done.stdout + done.stderr)
                assert lines[0].startswith("error: ") and named in lines[0], (service, lines)
                assert seconds < BOUND_S, (service, seconds)
                assert not store.exists() or not any(p.is_file() for p in store.rglob("*")), service
                print(f"{service}: wrong credential -> {lines[0]} ({seconds:.1f} s)")

            # the spec's relative store: the run hands the workers, each in a folder of its own, its absolute path
            on_cluster = ["--scheduler", scheduler] if through_dask else []
            done, seconds = _run(ws, ["run", str(spec), *on_cluster, "--json", str(ws / "s.json")], right)
            assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads((ws / "s.json").read_text())
        assert any((store / "outcomes").rglob("*.parquet")) and not list((tmp_path / "dask").rglob("outcomes"))
        assert summary["tracking_uri"] == mlflow.url and summary.get("mlflow_parent_run_id"), summary
        print(f"authenticated run through Prefect, MLflow{' and a TLS Dask scheduler' if through_dask else ''}: "
              f"{seconds:.1f} s")

        # MLflow has it, read with the credentials
        reader_code = (f"import json, mlflow; mlflow.set_tracking_uri({mlflow.url!r}); "
                       "runs = mlflow.search_runs(experiment_names=['authexp'], output_format='list'); "
                       "print(json.dumps([{'params': r.data.params, 'tags': r.data.tags} for r in runs]))")
        got = subprocess.run([sys.executable, "-c", reader_code], capture_output=True, text=True, timeout=300,
                             env={**base, "MLFLOW_TRACKING_USERNAME": mlflow_user,
                                  "MLFLOW_TRACKING_PASSWORD": mlflow_password})
        assert got.returncode == 0, got.stderr[-2000:]
        runs = json.loads(got.stdout.strip().splitlines()[-1])
        assert len(runs) == 3  # the parent and two cells
        # no credential anywhere the run, the servers' clients or the workers wrote
        shown = json.dumps(runs) + "".join(d.stdout + d.stderr for d in [done])
        scanned = 0
        for root in (ws, tmp_path / "prefect-home", tmp_path / "dask", mlflow.server_dir):
            for f in root.rglob("*"):
                if f.is_file() and not f.name.endswith("-key.pem"):
                    data = f.read_bytes()
                    scanned += 1
                    for value in secret_values:
                        assert value.encode() not in data, f
        for value in secret_values:
            assert value not in shown
        print(f"no credential in {scanned} files, the command's output or MLflow's params and tags")
    finally:
        for command in reversed(started):
            subprocess.run(command, cwd=tmp_path, env=base, capture_output=True, timeout=120)
        mlflow.drop()
