"""Soak: 20 experiments on one store and one MLflow database, 4 at a time and back to back, against a model server
that injects faults at fixed rates (20% HTTP 500, 5% 429 with Retry-After, 5% hangs past the client timeout,
2% malformed bodies).

Four `ragledger run` processes start at once; each runs a sweep of five datasets, i.e. five experiments back to back
in one process (one CLI start-up per lane keeps the test to a few minutes on 2 cores). Every experiment asks its own
questions, so all of them make their own model calls (none is served by another's LLM-call cache).

The fault-free reference is one fault-free experiment over the union of the 20 experiments' questions (same qids,
same texts, same spec otherwise): a question's outcome depends only on the question and the spec (retrieval, calls,
vote and evaluation are per question), so each soak experiment's outcome table must equal its questions' rows of it.

At the end: `store verify` is clean, no event is stored twice, every experiment's outcome table equals its fault-free
one, every experiment has exactly one MLflow parent run and every cell exactly one MLflow run (all FINISHED), and
the LLM-call cache holds only real answers (no error response was cached)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import Faults, ScriptedServer
from tests.test_reliability import RAGLEDGER, TOPICS, cli, make_data, prefect_env, raw_event_counts, reader

LANES, PER_LANE, QUESTIONS = 4, 5, 4
READERS = ["concatenation", "post_fusion"]
FAULTS = Faults(http_500=0.20, http_429=0.05, hang=0.05, hang_s=3.0, malformed=0.02, seed=20)


def questions_of(experiment: int) -> list[dict]:
    return [{"id": f"e{experiment:02d}q{j}", "answers": [TOPICS[(experiment + j) % len(TOPICS)]],
             "question": f"Which entry mentions fact {j} about {TOPICS[(experiment + j) % len(TOPICS)]} "
                         f"(soak experiment {experiment})?"} for j in range(QUESTIONS)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec_for(ws: Path, name: str, base_url: str, dataset: dict | list[dict]) -> Path:
    spec = {"name": name, "dataset": dataset, "corpus": {"name": "jsonl", "paths": [str(ws / "corpus.jsonl")]},
            "retrievers": ["bm25@2"], "readers": READERS,
            # timeout below the injected hangs; retries enough that no call gives up at a 32% fault rate
            "model": {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 2, "timeout_s": 2.0,
                      "max_retries": 20},
            "execution": {"shard_size": QUESTIONS},
            "tracking": {"compact": False}}  # raw_event_counts counts the segments the runs wrote
    path = ws / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def table(store: Path, where: str = "") -> list[tuple]:
    from tracking.store.query import query

    df = query(store, f"SELECT cell, qid, prediction, em, f1, error_type FROM outcomes {where} ORDER BY cell, qid")
    return [tuple(r) for r in df.itertuples(index=False)]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_soak_twenty_experiments_four_at_a_time_under_faults(tmp_path):
    started = time.perf_counter()
    ref_ws, ws = tmp_path / "reference", tmp_path / "soak"
    for w in (ref_ws, ws):
        w.mkdir()
        make_data(w, 1)  # the corpus (its question file is not used)
    n = LANES * PER_LANE

    # the fault-free reference: one experiment over all 80 questions
    every = [q for i in range(n) for q in questions_of(i)]
    with ScriptedServer(answer=reader) as clean:
        ref_spec = spec_for(ref_ws, "reference", clean.base_url,
                            {"name": "jsonl", "path": str(write_jsonl(ref_ws / "all.jsonl", every))})
        proc = cli(ref_ws, "run", str(ref_spec))
        assert proc.returncode == 0, proc.stderr[-3000:]
    reference = table(ref_ws / ".ragledger" / "store")
    assert len(reference) == n * QUESTIONS * len(READERS)
    reference_s = time.perf_counter() - started

    base = {k: v for k, v in prefect_env().items() if not k.startswith("MLFLOW_")}  # the pytest run's Prefect API
    base["RAGLEDGER_INDEX_DIR"] = str(ws / "indexes")
    with ScriptedServer(answer=reader, faults=FAULTS) as flaky:
        procs = []
        for lane in range(LANES):
            datasets = [{"name": "jsonl", "label": f"e{i:02d}",
                         "path": str(write_jsonl(ws / f"e{i:02d}.jsonl", questions_of(i)))}
                        for i in range(lane * PER_LANE, (lane + 1) * PER_LANE)]
            spec = spec_for(ws, f"lane{lane}", flaky.base_url, datasets)
            out = open(ws / f"lane{lane}.out", "w+")  # noqa: SIM115  (files, not pipes: no lane blocks on a full pipe)
            procs.append((subprocess.Popen([RAGLEDGER, "run", str(spec), "--json", str(ws / f"lane{lane}.json")], cwd=ws,
                                           env=base, stdout=out, stderr=subprocess.STDOUT), out))
        for p, out in procs:
            code = p.wait(timeout=1500)
            out.seek(0)
            assert code == 0, out.read()[-4000:]
            out.close()
        injected, calls = dict(flaky.faults_injected), flaky.calls
    soak_s = time.perf_counter() - started - reference_s
    assert set(injected) == {"http_500", "http_429", "hang", "malformed"}, injected
    summaries = [e for lane in range(LANES) for e in json.loads((ws / f"lane{lane}.json").read_text())["experiments"]]
    assert len(summaries) == n
    # every injected fault cost a retry, recorded in the generation records (a normal answer slower than the 2 s client
    # timeout on a loaded machine would add one: hence at least)
    assert sum(s["retries"] for s in summaries) >= sum(injected.values())

    store = ws / ".ragledger" / "store"
    verify = cli(ws, "store", "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    for kind, (rows, distinct) in raw_event_counts(ws).items():
        assert rows == distinct, f"{kind}: {rows - distinct} duplicate events"
    for i in range(n):
        lane = i // PER_LANE
        got = table(store, f"WHERE experiment = 'lane{lane}.e{i:02d}'")
        want = [r for r in reference if r[1].startswith(f"e{i:02d}q")]
        assert got == want, f"experiment lane{lane}.e{i:02d}: outcomes differ from the fault-free run"

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / '.ragledger' / 'mlflow.db'}")
    runs = [r for lane in range(LANES)
            for r in client.search_runs([client.get_experiment_by_name(f"lane{lane}").experiment_id], max_results=1000)]
    assert all(r.info.status == "FINISHED" for r in runs)
    seen: dict[tuple[str, str, str], int] = {}
    for r in runs:
        key = (r.data.tags["ragledger.experiment"], r.data.tags["ragledger.level"], r.data.tags.get("ragledger.cell", ""))
        seen[key] = seen.get(key, 0) + 1
    cells = {c for s in summaries for c in s["cells"]}
    expected = {(s["experiment"], "experiment", "") for s in summaries} | {
        (s["experiment"], "cell", c) for s in summaries for c in cells}
    assert set(seen) == expected and set(seen.values()) == {1}, {k: v for k, v in seen.items() if v != 1}
    assert not list((store / "mlflow-pending").rglob("*.json"))

    with sqlite3.connect(store / "llm_cache.sqlite") as con:
        cached = [json.loads(r[0]) for r in con.execute("SELECT response FROM llm_calls")]
    assert cached and all(c["text"] in (*TOPICS, "unknown") for c in cached), "an error response was cached"
    assert len(cached) == sum(s["llm_calls"] for s in summaries)  # one entry per call made, none for a failed attempt
    print(f"soak: {n} experiments, {calls} answered requests, faults injected {injected}; reference {reference_s:.0f} s, "
          f"soak {soak_s:.0f} s, total {time.perf_counter() - started:.0f} s")
