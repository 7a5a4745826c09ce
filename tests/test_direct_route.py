"""The direct route of `ragledger run` (flows/direct.py): one experiment on the thread runner runs without Prefect,
its table printed before Prefect or MLflow is imported, and a recorder process of its own (ragledger/recorder.py) then
records it in Prefect (the flow run and its task runs) and MLflow (its runs, with the flow run noted); runs one after
another are recorded by one recorder. What it stores equals what the flow stores; a rerun's stages run before are
answered by the results the store keeps under their keys (tasks/stage_runs.py); a killed recorder leaves the MLflow
logging to the next command (or `ragledger sync`)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_scripted import answer_from_context, make_spec, workspace  # noqa: F401  (fixture)
from tests.test_launch import RecordingHost
from tests.test_plan_cached import as_json

RAGLEDGER = str(Path(sys.executable).parent / "ragledger")


def waited_for(pid: int, timeout_s: float = 240) -> None:
    """Until the process `pid` has ended: this process's child (reaped here), or another's."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                return
        except ChildProcessError:  # not this process's child: gone once it no longer answers a signal
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.2)
    raise AssertionError(f"the recorder {pid} did not end within {timeout_s} s")


@pytest.fixture
def recorder_api(monkeypatch):
    """The recorders these tests start (processes of their own) record in the pytest run's shared Prefect API."""
    from tests.conftest import shared_prefect_api

    monkeypatch.setenv("PREFECT_API_URL", shared_prefect_api())


def manifest_of(summary: dict, cwd: Path = Path()) -> dict:
    return json.loads((cwd / summary["manifest"]).read_text())


def outcomes(store: str) -> list[tuple]:
    from tracking.store.query import query

    df = query(store, "SELECT cell, qid, prediction, em FROM outcomes ORDER BY cell, qid")
    return [tuple(r) for r in df.itertuples(index=False)]


def test_the_direct_route_stores_what_the_flow_stores_and_a_rerun_takes_the_kept_stages(workspace,  # noqa: F811
                                                                                          prefect_harness, recorder_api):
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    host = RecordingHost()
    with ScriptedServer(answer=answer_from_context) as server:
        spec = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation",)))
        direct = launch(spec, RunOptions(spec.tracking.store, record_after=True), host)
        assert host.flows == 1 and direct["llm_calls"] > 0 and direct["tasks_from_cache"] == 0
        waited_for(direct["recorder_pid"])
        record = manifest_of(direct)["summary"]
        assert record["mlflow_parent_run_id"] and record["flow_run_id"]  # logged, and the flow run noted
        assert not list(Path(spec.tracking.store, "mlflow-pending").rglob("*.json"))

        # the same spec through Prefect's flow, into another store: the same events
        flowed_spec = make_spec(workspace, server.base_url, readers=("concatenation",))
        flowed_spec["tracking"] = {"store": str(workspace / "flowed"), "mlflow_uri": f"sqlite:///{workspace / 'f.db'}"}
        flowed = launch(parse_spec(flowed_spec), RunOptions(str(workspace / "flowed")), host)
        assert as_json(flowed["cells"]) == as_json(direct["cells"])
        assert outcomes(str(workspace / "flowed")) == outcomes(spec.tracking.store)

        # one reader more: every stage of the first run is answered by the result the store keeps under its key
        wider = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation", "post_fusion")))
        rerun = launch(wider, RunOptions(wider.tracking.store, record_after=True), host)
        waited_for(rerun["recorder_pid"])
        assert rerun["tasks_from_cache"] == direct["tasks_total"] < rerun["tasks_total"]
        assert "bm25@2 · post_fusion · scripted" in rerun["cells"]
        cell = "bm25@2 · concatenation · scripted"
        assert as_json(rerun["cells"][cell]) == as_json(direct["cells"][cell])


def test_a_killed_recorder_leaves_the_mlflow_logging_to_the_next_command(workspace, prefect_harness,  # noqa: F811
                                                                          recorder_api):
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    with ScriptedServer(answer=answer_from_context) as server:
        spec = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation",)))
        options = RunOptions(spec.tracking.store, record_after=True)
        summary = launch(spec, options, RecordingHost())
    os.kill(summary["recorder_pid"], signal.SIGKILL)  # before its imports are done
    waited_for(summary["recorder_pid"])
    execution = Path(summary["manifest"]).stem
    assert [m.stem for m in Path(spec.tracking.store, "mlflow-pending").rglob("*.json")] == [execution]
    assert manifest_of(summary)["summary"]["mlflow_parent_run_id"] is None

    # the same command again: answered from the store (its manifest is there), and a recorder logs the pending run
    again = launch(spec, options, RecordingHost())
    assert again["answered_from"] == summary["manifest"] and again["llm_calls"] == 0
    waited_for(again["recorder_pid"])
    assert not list(Path(spec.tracking.store, "mlflow-pending").rglob("*.json"))
    assert manifest_of(summary)["summary"]["mlflow_parent_run_id"]


def test_runs_one_after_another_are_recorded_by_one_recorder(workspace, prefect_harness, recorder_api):  # noqa: F811
    import fcntl

    from core.paths import cache_home
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    cache_home().mkdir(parents=True, exist_ok=True)
    with ScriptedServer(answer=answer_from_context) as server, open(cache_home() / "recorder.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a recorder still recording an earlier run: both runs queue behind it
        summaries = []
        for name in ("first", "second"):  # into one store: the first's logging leaves the second to its recording
            raw = make_spec(workspace, server.base_url, readers=("concatenation",))
            raw["name"] = name
            spec = parse_spec(raw)
            summaries.append(launch(spec, RunOptions(spec.tracking.store, record_after=True), RecordingHost()))
        assert all(manifest_of(s)["summary"]["flow_run_id"] is None for s in summaries)
    pids = [s["recorder_pid"] for s in summaries]
    while all(_alive(pid) for pid in pids):  # the first recorder to take the lock records both runs
        time.sleep(0.2)
    for summary in summaries:
        record = manifest_of(summary)["summary"]
        assert record["flow_run_id"] and record["mlflow_parent_run_id"]
    for pid in pids:
        waited_for(pid, timeout_s=30)  # the other finds its recording done
    assert not list((cache_home() / "recordings").glob("*.json"))


def test_a_recording_gives_way_to_runs_before_each_task_and_each_later_step(workspace, prefect_harness):  # noqa: F811
    from flows.execute import record_in_prefect
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    with ScriptedServer(answer=answer_from_context) as server:
        spec = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation",)))
        summary = launch(spec, RunOptions(spec.tracking.store, record_after=True), NoRecorder())
    assert summary["recorder_pid"] == -1
    asked = []
    record_in_prefect(spec, spec.tracking.store, summary["manifest"], give_way=lambda: asked.append(1))
    assert len(asked) == summary["tasks_total"] + 2  # each stage task, then the logging and the compaction
    record = manifest_of(summary)["summary"]
    assert record["flow_run_id"] and record["mlflow_parent_run_id"]


def _alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_a_run_on_the_embedded_model_answers_before_prefect_and_mlflow_then_is_recorded_in_both(tmp_path):
    """As a user runs it, from the shell, on the real embedded model: the command imports neither Prefect nor
    MLflow (`python -X importtime`), and its recorder leaves the flow run with one task run per stage task and the
    MLflow parent run naming that flow run."""
    from mlflow.tracking import MlflowClient

    from tests.conftest import EMBEDDED_MODEL

    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "direct-tiny", "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 3, "seed": 0},
        "retrievers": ["bm25@3"], "readers": ["concatenation"],
        "model": {"backend": "embedded", "embedded_model": EMBEDDED_MODEL, "max_tokens": 16, "concurrency": 2},
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_")) and k != "RAGLEDGER_FOREGROUND"}
    done = subprocess.run([sys.executable, "-X", "importtime", RAGLEDGER, "run", str(spec), "--json", "s.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "pandas" in imported  # the import report is read
    assert not {m for m in imported if m.split(".")[0] in ("prefect", "mlflow")}
    assert "logged by the run's recorder" in done.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["llm_calls"] == 3 and summary["cells"]["bm25@3 · concatenation · " + EMBEDDED_MODEL]["questions"] == 3

    waited_for(summary["recorder_pid"])
    record = manifest_of(summary, tmp_path)["summary"]
    flow_run = record["flow_run_id"]
    assert flow_run and record["mlflow_parent_run_id"]
    with sqlite3.connect(tmp_path / ".ragledger" / "prefect" / "prefect.db") as db:
        (state,) = db.execute("SELECT state_type FROM flow_run WHERE id = ?", (flow_run,)).fetchone()
        names = [n for (n,) in db.execute("SELECT name FROM task_run WHERE flow_run_id = ?", (flow_run,))]
    assert state == "COMPLETED"
    stage_runs = [n for n in names if not n.startswith("log-to-mlflow")]
    assert len(stage_runs) == summary["tasks_total"], names
    assert len(names) == len(stage_runs) + 1  # and the MLflow logging's
    client = MlflowClient(record["tracking_uri"])
    parent = client.get_run(record["mlflow_parent_run_id"])
    assert parent.data.tags["ragledger.flow_run_id"] == flow_run
    # the recall curve, drawn by the recorder, is on the parent run as the flow's would be
    assert {"recall_at_k.csv", "recall_at_k.png"} <= {Path(f).name for f in manifest_of(summary, tmp_path)["analysis_files"]}
    logged = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "analysis")}
    assert {"recall_at_k.csv", "recall_at_k.png"} <= logged, logged


class NoRecorder(RecordingHost):
    def start_recorder(self, *args) -> int:
        return -1  # no recording queued: as after a recorder that was killed before it queued nothing more


def test_an_analysis_right_after_a_run_waits_for_its_recording_then_logs_on_its_parent_run(workspace,  # noqa: F811
                                                                                            prefect_harness, recorder_api):
    """`ragledger analyze` typed as the table is printed: the run's recorder logs the execution (its flow run noted)
    and the analysis goes on its parent run; without a recording queued, the analysis logs the execution itself."""
    from flows.analyze import run_analysis
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    with ScriptedServer(answer=answer_from_context) as server:
        spec = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation",)))
        summary = launch(spec, RunOptions(spec.tracking.store, record_after=True), RecordingHost())
        res = run_analysis(spec.tracking.store, spec.name, eor=False, n_resamples=50)
        record = manifest_of(summary)["summary"]
        assert res.parent_run_id == record["mlflow_parent_run_id"] and record["flow_run_id"]  # the recorder's logging
        waited_for(summary["recorder_pid"])

        raw = make_spec(workspace, server.base_url, readers=("concatenation",))
        raw["name"] = "unrecorded"
        unrecorded = parse_spec(raw)
        alone = launch(unrecorded, RunOptions(unrecorded.tracking.store, record_after=True), NoRecorder())
    res = run_analysis(unrecorded.tracking.store, unrecorded.name, eor=False, n_resamples=50)
    assert res.parent_run_id == manifest_of(alone)["summary"]["mlflow_parent_run_id"]
    assert not list(Path(spec.tracking.store, "mlflow-pending").rglob("*.json"))
