"""The whole experiment flow (Prefect, store, MLflow) against a scripted OpenAI-compatible server.

The server stands in for a remote vLLM/OpenAI endpoint; the same flow runs against the real embedded
model in tests/test_integration_embedded.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.openai_server import Faults, ScriptedServer

PASSAGES = [
    {"id": "p1", "title": "Broncos", "text": "The Denver Broncos won Super Bowl 50 in Santa Clara."},
    {"id": "p2", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "p3", "title": "Everest", "text": "Mount Everest is Earth's highest mountain above sea level."},
    {"id": "p4", "title": "Braces", "text": "A template like {question} or {retrieved_topk_context} must stay literal {0}."},
    {"id": "p5", "title": "Nile", "text": "The Nile is a major north-flowing river in northeastern Africa."},
]
QUESTIONS = [
    {"id": "q1", "question": "Who won Super Bowl 50?", "answers": ["Denver Broncos"]},
    {"id": "q2", "question": "What is the capital of France?", "answers": ["Paris"]},
    {"id": "q3", "question": "What is Earth's highest mountain?", "answers": ["Mount Everest", "Everest"]},
    {"id": "q4", "question": "Which river flows north in Africa?", "answers": ["Nile", "the Nile"]},
    {"id": "q5", "question": "What stays literal in a template?", "answers": ["{question}"]},
]


def answer_from_context(system: str, prompt: str, body: dict) -> str:
    """Deterministic reader: names the first known entity in the context it was given."""
    context = prompt.split("Question:")[0]
    for key, ans in (("Broncos", "Denver Broncos"), ("Paris", "Paris"), ("Everest", "Everest"), ("Nile", "Nile")):
        if key in context:
            return ans
    return "unknown"


@pytest.fixture
def workspace(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    qs = tmp_path / "questions.jsonl"
    qs.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return tmp_path


def make_spec(ws, base_url, readers=("concatenation", "post_fusion"), **model):
    return {
        "name": "scripted",
        "dataset": {"name": "jsonl", "path": str(ws / "questions.jsonl")},
        "corpus": {"name": "jsonl", "paths": [str(ws / "corpus.jsonl")]},
        "retrievers": ["bm25@2", "none"],
        "readers": list(readers),
        "model": {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 8, **model},
        "execution": {"shard_size": 2},
        "tracking": {"store": str(ws / "store"), "mlflow_uri": f"sqlite:///{ws / 'mlflow.db'}"},
    }


def run_flow(spec):
    from flows.execute import experiment_flow

    return experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])


def test_flow_end_to_end_then_rerun_makes_no_calls(workspace, prefect_harness):
    with ScriptedServer(answer=answer_from_context) as server:
        spec = make_spec(workspace, server.base_url)
        first = run_flow(spec)
        # concatenation: 1 call per question and retriever; PF: 1 per retrieved passage (none: zero passages)
        from tracking.store.query import query

        retrieved = int(query(spec["tracking"]["store"], "SELECT count(*) AS n FROM retrievals")["n"][0])
        assert 5 <= retrieved <= 10
        generations = int(query(spec["tracking"]["store"], "SELECT count(*) AS n FROM generations")["n"][0])
        assert generations == 5 + 5 + retrieved
        # identical requests (a question with one passage: its concatenation and post-fusion prompts are the
        # same) reach the model once, even when they are in flight at the same time
        distinct = int(query(spec["tracking"]["store"], "SELECT count(DISTINCT call_id) AS n FROM generations")["n"][0])
        assert first["llm_calls"] == server.calls == distinct
        cells = first["cells"]
        assert set(cells) == {f"{r} · {s} · scripted" for r in ("bm25@2", "none") for s in ("concatenation", "post_fusion")}
        bm25_concat = cells["bm25@2 · concatenation · scripted"]
        assert bm25_concat["questions"] == 5 and bm25_concat["em"] > 0
        closed = cells["none · post_fusion · scripted"]
        assert closed["unk_pct"] == 100.0 and closed["recall_at_k"] == 0.0

        calls_before = server.calls
        second = run_flow(spec)
        assert second["llm_calls"] == 0 and server.calls == calls_before
        assert second["tasks_from_cache"] == second["tasks_total"]
        assert second["cells"] == first["cells"]
        # cell metrics are a projection: deleting every projection and rerunning gives the same figures
        import shutil

        shutil.rmtree(Path(spec["tracking"]["store"]) / "projections")
        third = run_flow(spec)
        assert third["cells"] == first["cells"] and third["llm_calls"] == 0
        assert list((Path(spec["tracking"]["store"]) / "projections" / "metrics").glob("cell-metrics-*.json"))

    # the brace passage went into a prompt literally
    prompts = query(spec["tracking"]["store"], "SELECT prompt FROM generations WHERE list_contains(passage_ids, 'p4')")
    assert any("{question} or {retrieved_topk_context} must stay literal {0}" in p for p in prompts["prompt"])

    # MLflow, read from a separate process: parent + one nested run per cell, metrics and record artifacts
    script = f"""
import json, mlflow
from mlflow import MlflowClient
mlflow.set_tracking_uri({spec['tracking']['mlflow_uri']!r})
runs = mlflow.search_runs(experiment_names=['scripted'], output_format='list')
client = MlflowClient()
out = []
for r in runs:
    is_cell = r.data.tags.get('ragledger.level') == 'cell'
    arts = [a.path for a in client.list_artifacts(r.info.run_id, 'records')] if is_cell else []
    out.append(dict(name=r.info.run_name, level=r.data.tags.get('ragledger.level'), parent=r.data.tags.get('mlflow.parentRunId'),
                    metrics=r.data.metrics, artifacts=arts))
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    parents = [r for r in runs if r["level"] == "experiment"]
    cells = [r for r in runs if r["level"] == "cell"]
    assert len(parents) == 3 and len(cells) == 12  # three executions x four cells
    latest_parent = second["mlflow_parent_run_id"]
    mine = [c for c in cells if c["parent"] == latest_parent]
    assert len(mine) == 4
    for c in mine:
        assert {"em", "f1", "unk_pct", "recall_at_k", "calls_per_q", "tokens_in_per_q"} <= set(c["metrics"])
        assert {"records/outcomes", "records/votes", "records/generations", "records/retrievals"} <= set(c["artifacts"]) or \
            c["name"].startswith("none")
    assert next(p for p in parents if p["metrics"]["llm_calls"] == 0)


def test_changing_only_the_vote_reruns_no_generation(workspace, prefect_harness, monkeypatch):
    """A new vote version re-runs vote and evaluate only; every generate task comes from the cache."""
    with ScriptedServer(answer=answer_from_context) as server:
        spec = make_spec(workspace, server.base_url, readers=("post_fusion",))
        run_flow(spec)
        calls = server.calls
        from strategies.readers.post_fusion import PostFusion

        monkeypatch.setattr(PostFusion, "vote_version", "a-new-decision-rule")
        again = run_flow(spec)
        assert server.calls == calls and again["llm_calls"] == 0
        # generate tasks (2 cells x 3 shards) came from the cache; vote and evaluate ran again
        assert again["tasks_total"] - again["tasks_from_cache"] == 2 * 3 * 2


FAULT_SEED = 4  # a seed whose draws include every fault kind at these rates (the draws follow request order)


def test_faulty_backend_gives_same_results(workspace, prefect_harness):
    # Post-Fusion with 6 samples per passage: enough calls (40 distinct) that every fault kind below is injected
    readers = ("concatenation", {"name": "post_fusion", "samples": 6})
    with ScriptedServer(answer=answer_from_context) as clean:
        baseline = run_flow(make_spec(workspace, clean.base_url, readers=readers))
    # the injected fault rates: 20% HTTP 500, 5% 429 with Retry-After, 5% hangs past the client timeout, 2% malformed
    # bodies, 2% empty completions
    faults = Faults(http_500=0.2, http_429=0.05, hang=0.05, hang_s=4.0, malformed=0.02, empty=0.02, seed=FAULT_SEED)
    ws2 = workspace / "faulty"
    ws2.mkdir()
    for f in ("corpus.jsonl", "questions.jsonl"):
        (ws2 / f).write_text((workspace / f).read_text())
    with ScriptedServer(answer=answer_from_context, faults=faults) as flaky:
        spec = make_spec(ws2, flaky.base_url, readers=readers, max_retries=20, timeout_s=1.0)
        result = run_flow(spec)
    assert result["cells"] == baseline["cells"] and clean.repeats == 0
    # every retry the run records is one the server saw, and every injected fault was retried; a retry beyond the
    # injected ones is an answer that came after the 1 s timeout on a loaded machine
    assert result["retries"] == flaky.repeats >= sum(flaky.faults_injected.values()) > 0
    assert set(flaky.faults_injected) == {"http_500", "http_429", "hang", "malformed", "empty"}, flaky.faults_injected
    print(f"calls {result['llm_calls']}; faults injected: {flaky.faults_injected}; retries recorded: {result['retries']}")
