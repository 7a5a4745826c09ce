"""The real stack end to end: the embedded llama.cpp model, the real Pyserini index over all 20,963
SQuAD paragraphs, Prefect, the event store and MLflow, driven through the CLI as a user would."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RAGLEDGER = str(Path(sys.executable).parent / "ragledger")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the model is ~2-3x slower on AVX2 CPUs


def run_cli(cwd: Path, *args: str, timeout: int = 1200, own_prefect: bool = True) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: its own Prefect home under .ragledger/ and, unless `own_prefect` is False (the pytest
    run's shared Prefect API, tests/conftest.py), its own temporary Prefect server."""
    from tests.test_reliability import prefect_env

    env = prefect_env(own_prefect)
    return subprocess.run([RAGLEDGER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The CLI with `backend: embedded` as a user meets it, on configs/smoke.yaml: a run killed with SIGKILL once its
    embedded server has answered a call (the server must die with it), the same command again (it resumes), and
    once more (every answer from the store: no model call)."""
    from engines.embedded import llama_server_available

    assert llama_server_available(), "llama-cpp-python[server] missing: run bash infra/setup.sh"
    cwd = tmp_path_factory.mktemp("smoke")
    killed_with_its_server(cwd, calls_answered=2)
    first = run_cli(cwd, "run", str(REPO / "configs" / "smoke.yaml"), "--json", "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_cli(cwd, "run", str(REPO / "configs" / "smoke.yaml"), "--json", "second.json")
    assert second.returncode == 0, second.stdout + second.stderr
    return cwd, first, second, json.loads((cwd / "first.json").read_text()), json.loads((cwd / "second.json").read_text())


def test_real_run_prints_results_and_rerun_makes_no_model_call(smoke_run):
    _, first, second, s1, s2 = smoke_run
    print(first.stdout)
    assert "EM" in first.stdout and "%NM" in first.stdout and "Recall@k" in first.stdout
    assert s1["llm_calls"] > 0 and s1["questions"] == 6
    assert "model calls this run: 0" in second.stdout
    assert s2["llm_calls"] == 0 and s2["cells"] == s1["cells"]
    for metrics in s1["cells"].values():
        assert metrics["questions"] == 6
        assert 0 <= metrics["em"] <= 100 and metrics["tokens_in_per_q"] > 0
        assert metrics["recall_at_k"] > 0  # real BM25 over real SQuAD paragraphs finds gold answers


def test_mlflow_runs_read_back_from_another_process(smoke_run):
    cwd, _, _, s1, _ = smoke_run
    script = f"""
import json, mlflow
from mlflow import MlflowClient
mlflow.set_tracking_uri({s1['tracking_uri']!r})
client = MlflowClient()
parent = client.get_run({s1['mlflow_parent_run_id']!r})
children = mlflow.search_runs(experiment_names=['smoke'],
                              filter_string="tags.mlflow.parentRunId = '{s1['mlflow_parent_run_id']}'",
                              output_format='list')
out = dict(parent_metrics=parent.data.metrics, spec=[a.path for a in client.list_artifacts(parent.info.run_id)],
           children={{c.info.run_name: dict(metrics=c.data.metrics, params=c.data.params,
                      records=[a.path for a in client.list_artifacts(c.info.run_id, 'records')]) for c in children}})
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["parent_metrics"]["llm_calls"] == s1["llm_calls"]
    assert "spec.yaml" in out["spec"]
    assert set(out["children"]) == set(s1["cells"])
    for name, child in out["children"].items():
        for metric in ("em", "f1", "unk_pct", "recall_at_k", "tokens_in_per_q", "calls_per_q"):
            assert metric in child["metrics"], (name, metric)
        assert child["metrics"]["em"] == pytest.approx(s1["cells"][name]["em"])
        assert {"records/retrievals", "records/generations", "records/votes", "records/outcomes"} <= set(child["records"])
        assert child["params"]["model.backend"] == "embedded"
    if "post_fusion" in " ".join(out["children"]):
        pf = next(c for n, c in out["children"].items() if "post_fusion" in n)
        assert pf["metrics"]["calls_per_q"] == pytest.approx(3.0)  # bm25@3: one call per passage


def test_outcomes_view_rereads_the_stored_records(smoke_run):
    cwd, _, _, s1, _ = smoke_run
    from tracking.store.query import query

    df = query(cwd / ".ragledger" / "store", "SELECT cell, avg(em) * 100 AS em, count(*) AS n FROM outcomes GROUP BY cell")
    for row in df.itertuples():
        assert row.n == 6
        assert row.em == pytest.approx(s1["cells"][row.cell]["em"], abs=0.01)
    # every outcome links to its generations
    linked = query(cwd / ".ragledger" / "store",
                   "SELECT count(*) AS n FROM outcomes o JOIN generations g USING (qid, cell)")
    assert int(linked["n"][0]) >= 12


def test_store_verify_passes_and_eval_predictions_matches_squad_semantics(smoke_run, tmp_path, data_dir):
    cwd, *_ = smoke_run
    verify = run_cli(cwd, "store", "verify")
    assert verify.returncode == 0 and "0 problem(s)" in verify.stdout
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"Super_Bowl_50_0_0": "Denver Broncos", "Super_Bowl_50_0_1": "the Carolina Panthers!"}))
    out = run_cli(tmp_path, "eval-predictions", str(data_dir / "squad" / "dev-v1.1.json.gz"), str(preds))
    scores = json.loads(out.stdout.strip().splitlines()[-1])
    # 2 of 10,570 questions exactly right -> 100 * 2 / 10570
    assert scores["exact_match"] == pytest.approx(100 * 2 / 10570)
    assert scores["f1"] == pytest.approx(100 * 2 / 10570)


def test_refeed_log_probabilities_come_from_the_real_embedded_model(tmp_path):
    """REFEED's ensemble needs token log-probabilities: the run starts a second embedded server with
    logits_all for those calls only, while Concatenation's calls go to the ordinary server (no logprobs)."""
    spec = tmp_path / "refeed.yaml"
    spec.write_text(
        "name: refeed-embedded\n"
        "dataset: {name: squad, path: squad/dev-v1.1.json.gz, limit: 1, seed: 0}\n"
        "retrievers: [bm25@3]\n"
        "readers: [concatenation, {name: refeed, feedback_k: 3}]\n"
        "model: {backend: embedded, embedded_model: qwen2.5-coder-0.5b-instruct-awq-q4km, max_tokens: 16, concurrency: 1}\n"
        "execution: {shard_size: 1}\n"
    )
    out = run_cli(tmp_path, "run", str(spec), "--json", "run.json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads((tmp_path / "run.json").read_text())["llm_calls"] == 1 + 2  # concatenation 1, refeed 2
    from tracking.store.query import query

    store = tmp_path / ".ragledger" / "store"
    gens = query(store, "SELECT reader, role, logprob FROM generations")
    refeed = gens[gens["reader"] == "refeed(feedback_k=3)"]
    assert set(refeed["role"]) == {"initial", "refine"} and refeed["logprob"].notna().all()
    assert (refeed["logprob"] <= 0).all()  # mean token log-probabilities of real outputs
    assert gens[gens["reader"] == "concatenation"]["logprob"].isna().all()
    votes = query(store, "SELECT method FROM votes WHERE reader = 'refeed(feedback_k=3)'")
    assert set(votes["method"]) == {"refeed-answer-prob"}
    assert len(list((tmp_path / ".ragledger" / "logs").glob("embedded-server-*.log"))) == 2


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def killed_with_its_server(cwd: Path, calls_answered: int) -> None:
    """SIGKILL skips every finally block: the embedded server must still die with the run (parent-death signal),
    or it keeps both cores busy for whatever runs next. The run is killed once its server has answered
    `calls_answered` calls of the run (after its start-up completion)."""
    import signal
    import time

    from core.processes import pid_alive

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    with (cwd / "killed.log").open("w") as out:
        run = subprocess.Popen([RAGLEDGER, "run", str(REPO / "configs" / "smoke.yaml")], cwd=cwd, env=env,
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, servers, answered = time.monotonic() + 300, [], 0
        while answered < calls_answered + 1 and time.monotonic() < deadline and run.poll() is None:
            servers = [p for p in _children(run.pid) if "engines.llama_server" in _cmdline(p)]
            logs = list((cwd / ".ragledger" / "logs").glob("embedded-server-*.log"))
            answered = logs[0].read_text(errors="replace").count("POST /v1/chat/completions") if logs else 0
            time.sleep(0.2)
        assert servers and answered > calls_answered, (cwd / "killed.log").read_text()[-2000:]
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        deadline = time.monotonic() + 30
        while any(pid_alive(p) and "engines.llama_server" in _cmdline(p) for p in servers) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(pid_alive(p) and "engines.llama_server" in _cmdline(p) for p in servers)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)


def test_a_server_that_dies_under_the_run_is_named_with_its_cause(tmp_path):
    """A llama.cpp build with an instruction this CPU lacks dies with SIGILL on its first matrix multiply; the run
    must say that (and where the server's log is), not 'connection refused' after its retries. The real server is
    killed with SIGILL after its start-up completion, as such a build dies."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    with (tmp_path / "out.log").open("w") as out:
        run = subprocess.Popen([RAGLEDGER, "run", str(REPO / "configs" / "smoke.yaml")], cwd=tmp_path, env=env,
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, server = time.monotonic() + 300, None
        while server is None and time.monotonic() < deadline and run.poll() is None:
            servers = [p for p in _children(run.pid) if "engines.llama_server" in _cmdline(p)]
            logs = list((tmp_path / ".ragledger" / "logs").glob("embedded-server-*.log"))
            # the start-up completion has been answered: the server is up and the run relies on it
            if servers and logs and "POST /v1/chat/completions" in logs[0].read_text(errors="replace"):
                server = servers[0]
            time.sleep(0.2)
        assert server is not None, (tmp_path / "out.log").read_text()[-2000:]
        os.kill(server, signal.SIGILL)
        assert run.wait(timeout=300) == 2
        output = (tmp_path / "out.log").read_text()
        error = [line for line in output.splitlines() if line.startswith("error:")]
        assert error and "the embedded model server was killed by SIGILL" in error[-1], output[-3000:]
        assert "embedded-server-" in error[-1] and "instructions this machine lacks" in output
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
