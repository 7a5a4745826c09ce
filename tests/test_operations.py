"""Operating ragledger (issue 6): the Dask runner gives the default runner's results, a scheduled
deployment fires and its MLflow runs appear, `ragledger runs` lists flow runs with their MLflow run ids,
and a command's temporary Prefect server dies with it (even on SIGKILL)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.servers import free_port
from tests.test_reliability import RAGLEDGER, cli, make_data, outcome_table, reader, write_spec


def table_hash(rows: list[tuple]) -> str:
    return hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()


def test_dask_runner_gives_the_default_runners_outcomes(tmp_path):
    thread_ws, dask_ws = tmp_path / "thread", tmp_path / "dask"
    for ws in (thread_ws, dask_ws):
        ws.mkdir()
        make_data(ws, 16)
    summaries, most_in_flight = {}, {}
    for ws, extra in ((thread_ws, []), (dask_ws, ["--runner", "dask", "--workers", "2"])):
        with ScriptedServer(answer=reader, delay_s=0.05) as server:
            proc = cli(ws, "run", str(write_spec(ws, server.base_url)), "--json", str(ws / "summary.json"), *extra)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "INFO" not in proc.stdout + proc.stderr  # the CLI shows its own progress, not Dask's start-up
            summaries[ws.name] = json.loads((ws / "summary.json").read_text())
            most_in_flight[ws.name] = server.max_in_flight
    thread_rows, dask_rows = outcome_table(thread_ws), outcome_table(dask_ws)
    assert len(thread_rows) == 2 * 16
    assert table_hash(dask_rows) == table_hash(thread_rows)
    # the Dask run really ran its stage tasks in the two worker processes, the default run in its own process
    assert summaries["thread"]["task_processes"] == 1
    assert summaries["dask"]["task_processes"] == 2
    # model.concurrency (2) bounds the whole run's requests in flight, not each worker process's
    # (without the per-worker share the two workers held up to 4)
    assert most_in_flight["thread"] == 2 and 1 <= most_in_flight["dask"] <= 2, most_in_flight
    print(f"outcome table hash, thread runner == dask runner (2 workers): {table_hash(thread_rows)[:16]}")


def test_a_dask_worker_killed_mid_run_leaves_the_same_outcomes(tmp_path):
    """kill -9 of one of a run's two Dask worker processes while its generate tasks make calls: Dask runs the lost
    tasks again on a worker (its nanny starts a new one), the run ends with the thread runner's outcomes, every event
    stored once and the store verified."""
    import psutil

    from tests.test_reliability import raw_event_counts

    thread_ws, dask_ws = tmp_path / "thread", tmp_path / "dask"
    for ws in (thread_ws, dask_ws):
        ws.mkdir()
        make_data(ws, 16)
    with ScriptedServer(answer=reader) as server:
        reference = cli(thread_ws, "run", str(write_spec(thread_ws, server.base_url, compact=False)))
        assert reference.returncode == 0, reference.stderr[-3000:]
    with ScriptedServer(answer=reader, delay_s=0.4) as server, open(tmp_path / "dask.out", "w+") as out:
        from tests.test_reliability import prefect_env

        spec = write_spec(dask_ws, server.base_url, compact=False)
        env = prefect_env() | {"RAGLEDGER_INDEX_DIR": str(dask_ws / "indexes")}
        proc = subprocess.Popen([RAGLEDGER, "run", str(spec), "--runner", "dask", "--workers", "2"], cwd=dask_ws,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while server.calls < 6 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None and server.calls >= 6, "the run ended (or made no call) before the kill"
            # a worker process: a child of the run's process (a local cluster's nannies run in it)
            workers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
            assert len(workers) == 2, [p.cmdline() for p in psutil.Process(proc.pid).children(recursive=True)]
            os.kill(workers[0].pid, signal.SIGKILL)
            code = proc.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        out.seek(0)
        log = out.read()
        assert code == 0, log[-4000:]
    assert "killed by signal 9" in log, log[-4000:]  # the nanny saw its worker die (and started another)
    print(next(line for line in log.splitlines() if "killed by signal 9" in line))
    assert table_hash(outcome_table(dask_ws)) == table_hash(outcome_table(thread_ws))
    for kind, (rows, distinct) in raw_event_counts(dask_ws).items():
        assert rows == distinct, f"{kind}: {rows - distinct} duplicate events"
    verify = cli(dask_ws, "store", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr



def _env(ws: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["RAGLEDGER_INDEX_DIR"] = str(ws / "indexes")
    return env


def test_a_scheduled_deployment_fires_and_its_mlflow_runs_appear(tmp_path):
    make_data(tmp_path, 6)
    port = free_port()
    started = cli(tmp_path, "server", "start", "--port", str(port), timeout=400, own_prefect=True)
    assert started.returncode == 0, started.stdout + started.stderr
    schedule = None
    try:
        with ScriptedServer(answer=reader) as server:
            spec = write_spec(tmp_path, server.base_url, name="nightly")
            with open(tmp_path / "schedule.log", "w") as log:
                schedule = subprocess.Popen([RAGLEDGER, "schedule", str(spec), "--interval", "10"], cwd=tmp_path,
                                            env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
            import mlflow

            mlflow.set_tracking_uri(f"sqlite:///{tmp_path / '.ragledger' / 'mlflow.db'}")
            parents = []
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline and not parents:
                time.sleep(5)
                assert schedule.poll() is None, (tmp_path / "schedule.log").read_text()[-3000:]
                with contextlib.suppress(Exception):
                    runs = mlflow.search_runs(experiment_names=["nightly"], output_format="list")
                    parents = [r for r in runs if r.data.tags.get("ragledger.level") == "experiment"
                               and r.info.status == "FINISHED"]
            assert parents, "no scheduled run finished in time:\n" + (tmp_path / "schedule.log").read_text()[-3000:]
            flow_run_id = parents[0].data.tags["ragledger.flow_run_id"]
            assert flow_run_id
            listed = cli(tmp_path, "runs", "--experiment", "nightly", own_prefect=True)
            assert listed.returncode == 0, listed.stderr
            assert "Completed" in listed.stdout and parents[0].info.run_id in listed.stdout, listed.stdout
            print(f"scheduled run fired: MLflow parent run {parents[0].info.run_id}\n{listed.stdout}")
    finally:
        if schedule is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(schedule.pid, signal.SIGKILL)
        stopped = cli(tmp_path, "server", "stop", own_prefect=True)
        assert stopped.returncode == 0, stopped.stderr


def test_a_killed_commands_temporary_prefect_server_dies_with_it(tmp_path):
    code = (
        "import os, sys, time\n"
        "from ragledger.prefect_server import temporary_server\n"
        "with temporary_server() as url:\n"
        "    print(url, flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        from ragledger.prefect_server import healthy

        assert healthy(url)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while healthy(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not healthy(url), "the temporary Prefect server outlived its SIGKILLed command"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_runs_and_schedule_reject_bad_arguments(tmp_path):
    make_data(tmp_path, 2)
    spec = write_spec(tmp_path, "http://127.0.0.1:9/v1")
    both = cli(tmp_path, "schedule", str(spec), "--cron", "* * * * *", "--interval", "5")
    assert both.returncode == 2 and "exactly one of --cron or --interval" in both.stderr
    bad = cli(tmp_path, "schedule", str(spec), "--cron", "every day")
    assert bad.returncode == 2 and "--cron" in bad.stderr and "Invalid cron string" in bad.stderr, bad.stderr
    runner = cli(tmp_path, "run", str(spec), "--runner", "spark")
    assert runner.returncode == 2 and "--runner: unknown runner 'spark'" in runner.stderr
    threads = cli(tmp_path, "run", str(spec), "--runner", "thread", "--scheduler", "tcp://127.0.0.1:9")
    assert threads.returncode == 2 and "--scheduler is a Dask scheduler" in threads.stderr, threads.stderr
    missing = write_spec(tmp_path, "http://127.0.0.1:9/v1", name="missing")
    data = yaml.safe_load(missing.read_text())
    data["dataset"]["path"] = str(tmp_path / "nope.jsonl")
    missing.write_text(yaml.safe_dump(data))
    gone = cli(tmp_path, "schedule", str(missing), "--interval", "5")  # the spec's file named, as `run` names it
    assert gone.returncode == 2 and f"{missing}: dataset.path: " in gone.stderr, gone.stderr
    assert not (tmp_path / ".ragledger" / "store").exists()
    data = yaml.safe_load(spec.read_text())
    assert data["name"] == "rel"


def test_compose_stack_is_local_first_and_holds_no_secret():
    """infra/compose.yaml cannot run here (no Docker engine, no GPU); check what can be checked: it parses,
    has the four services, publishes every port on 127.0.0.1 only, and takes passwords from the environment."""
    repo = Path(__file__).resolve().parent.parent
    text = (repo / "infra" / "compose.yaml").read_text()
    compose = yaml.safe_load(text)
    assert set(compose["services"]) == {"postgres", "mlflow", "prefect", "vllm"}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        for key, value in (service.get("environment") or {}).items():
            if any(word in key.upper() for word in ("PASSWORD", "TOKEN", "SECRET")):
                assert str(value).startswith("${"), (name, key)
            value = str(value)
            if "://" in value and "@" in value:  # user:password@host would put the password in a URI
                assert ":" not in value.split("://", 1)[1].split("@", 1)[0], (name, key)
    assert "--max-num-seqs ${VLLM_MAX_SEQS:-64}" in text
    vllm_spec = yaml.safe_load((repo / "configs" / "vllm.yaml").read_text())
    assert vllm_spec["model"]["concurrency"] == 64  # matches the recipe's max concurrent sequences


CLUSTER_SCRIPT = """
import sys
from distributed import LocalCluster

cluster = LocalCluster(n_workers=2, threads_per_worker=4, processes=True, dashboard_address=None)
print(cluster.scheduler_address, flush=True)
sys.stdin.read()  # until the test closes it
cluster.close()
"""


def test_a_long_lived_dask_cluster_sends_each_runs_task_events_to_that_runs_prefect_server(tmp_path):
    """flows/dask_workers.py. Two runs on one long-lived cluster of 2 workers (`--scheduler`): the first with its
    temporary Prefect server, gone when it ends; the second with the directory's `ragledger server`. Task runs
    report their states as events: every task run of the second reaches that server Completed, and no worker tries
    the first run's server (without the fix, Prefect's one events worker per process kept the first server's URL)."""
    import urllib.request

    make_data(tmp_path, 8)
    prefect_home = tmp_path / ".ragledger" / "prefect"
    env = _env(tmp_path) | {"PREFECT_HOME": str(prefect_home),
                            "PREFECT_LOCAL_STORAGE_PATH": str(prefect_home / "storage")}
    with open(tmp_path / "cluster.log", "w") as log:
        cluster = subprocess.Popen([sys.executable, "-c", CLUSTER_SCRIPT], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log, text=True)
    port = free_port()
    try:
        address = cluster.stdout.readline().strip()
        assert address.startswith("tcp://"), (tmp_path / "cluster.log").read_text()[-3000:]
        with ScriptedServer(answer=reader) as server:
            spec = str(write_spec(tmp_path, server.base_url))
            first = cli(tmp_path, "run", spec, "--scheduler", address, "--store", "first", own_prefect=True)
            assert first.returncode == 0, first.stderr[-3000:]
            started = cli(tmp_path, "server", "start", "--port", str(port), timeout=400, own_prefect=True)
            assert started.returncode == 0, started.stdout + started.stderr
            second = cli(tmp_path, "run", spec, "--scheduler", address, "--store", "second", "--json",
                         str(tmp_path / "second.json"), own_prefect=True)
            assert second.returncode == 0, second.stderr[-3000:]
            # model.concurrency (2) bounds the run on the cluster's 2 workers, which were started without being told
            # how many share it: each took its share (flows/runners.py task_processes)
            assert server.max_in_flight <= 2, server.max_in_flight
        summary = json.loads((tmp_path / "second.json").read_text())
        assert summary["task_processes"] == 2 and summary["tasks_total"] > 0

        def task_run_states() -> list[str]:
            """The states of the run's stage tasks (run on the workers) as its Prefect server knows them."""
            body = json.dumps({"flow_runs": {"id": {"any_": [summary["flow_run_id"]]}}}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/task_runs/filter", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                return [run["state"]["type"] for run in json.loads(answer.read()) if run["name"] != "log-to-mlflow"
                        and not run["name"].startswith("log-to-mlflow-")]

        deadline, states = time.monotonic() + 60, []
        while time.monotonic() < deadline:  # the server takes the events in as they come
            states = task_run_states()
            if len(states) == summary["tasks_total"] and set(states) == {"COMPLETED"}:
                break
            time.sleep(2)
        assert len(states) == summary["tasks_total"] and set(states) == {"COMPLETED"}, states
    finally:
        cluster.stdin.close()
        cluster.wait(timeout=120)
        cli(tmp_path, "server", "stop", own_prefect=True)
    assert "Unable to connect" not in (tmp_path / "cluster.log").read_text()
