"""`ragledger pull` of a large experiment from the MLflow server on PostgreSQL (proxied artifacts): 100,000 outcome
records over 16 cells (6,250 questions each), written through the EventStore and logged as ragledger logs an
execution (tracking.mlflow.runs.log_execution), then pulled into an empty store (every segment downloaded and
checked: checksum, schema, experiment, name) beside a direct `mlflow.artifacts.download_artifacts` of the same
artifact files, in the same run against the same server. Target: pull ≤ 10 s. Times are reported, not asserted.

Skipped by default (`--benchmark-skip`). Run:
    .venv/bin/python -m pytest tests/benchmarks/test_pull_bench.py --benchmark-only -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from tracking.store.events import EventStore, new_events, stable_hash

CELLS, ROWS, EXP = 16, 100_000, "pullbench"
QUESTIONS = ROWS // CELLS
ROUNDS = 3
TYPES = np.array(["correct", "retrieval_failure", "extraction_error", "hallucination_error", "abstention"])


def build_store(root: Path) -> dict:
    """The store and the run manifest a flow would have written for this experiment."""
    (root / "questions.jsonl").write_text("".join(json.dumps({"id": f"q{k:06d}", "question": f"Which {k}?",
                                                              "answers": ["Paris"]}) + "\n" for k in range(QUESTIONS)))
    (root / "corpus.jsonl").write_text(json.dumps({"id": "p0", "title": "Paris", "text": "Paris."}) + "\n")
    spec = {"name": EXP, "dataset": {"name": "jsonl", "path": str(root / "questions.jsonl")},
            "corpus": {"name": "jsonl", "paths": [str(root / "corpus.jsonl")]},
            "retrievers": [f"bm25@{c + 1}" for c in range(CELLS)], "readers": ["concatenation"],
            "model": {"backend": "openai", "name": "m", "base_url": "http://127.0.0.1:9/v1"},
            "execution": {"shard_size": QUESTIONS}}
    store = EventStore(root / "store")
    qids = [f"q{k:06d}" for k in range(QUESTIONS)]
    questions = store.write("questions", new_events("questions", EXP, [
        {"event_id": stable_hash("questions", EXP, q), "cell": "", "qid": q, "dataset": "jsonl",
         "question": f"Which {q}?", "answers": ["Paris"], "gold_pids": []} for q in qids]))
    rng = np.random.default_rng(0)
    segments, cells = {}, {}
    for c in range(CELLS):
        et = TYPES[rng.choice(len(TYPES), size=QUESTIONS, p=[0.5, 0.2, 0.1, 0.1, 0.1])]
        correct = et == "correct"
        cell = f"bm25@{c + 1} · concatenation · m"
        rows = pd.DataFrame({
            "event_id": [stable_hash("outcomes", EXP, cell, q) for q in qids], "cell": cell, "qid": qids,
            "retriever": f"bm25@{c + 1}", "reader": "concatenation", "model": "m",
            "prediction": np.where(correct, "Paris", "x"), "em": correct.astype(float), "f1": correct.astype(float),
            "semantic_match": None, "is_unknown": et == "abstention", "gold_in_context": et != "retrieval_failure",
            "pool_has_correct": None, "error_type": et, "tokens_in": 100, "tokens_out": 3, "llm_calls": 1,
        })  # fmt: skip
        seg = store.write("outcomes", new_events("outcomes", EXP, rows.to_dict("records")))
        segments[cell] = {"questions": [str(questions)], "outcomes": [str(seg)]}
        cells[cell] = {"questions": QUESTIONS, "em": round(100 * correct.mean(), 2)}
    from schemas.spec import ExperimentSpec

    summary = {"experiment": EXP, "spec_hash": ExperimentSpec.model_validate(spec).spec_hash(),
               "questions": QUESTIONS, "cells": cells, "llm_calls": 0}
    return {"summary": summary, "segments": segments, "closed_book_filter_segments": [], "spec": spec,
            "analysis_files": []}


def direct_download(url: str, logged: dict, into: Path) -> int:
    """The same artifact files pull downloads (spec, manifest, the questions segment every cell run holds once, each
    cell's outcome segment), by MLflow alone."""
    import mlflow

    wanted = [(logged["parent"], "spec.yaml"), (logged["parent"], "ragledger/manifest.json"),
              (next(iter(logged["cells"].values())), "records/questions")]
    wanted += [(run_id, "records/outcomes") for run_id in logged["cells"].values()]
    files = []
    for i, (run_id, artifact) in enumerate(wanted):
        got = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact,
                                                       dst_path=str(into / str(i)), tracking_uri=url))
        files += [got] if got.is_file() else [p for p in got.rglob("*") if p.is_file()]
    return len(files)


def test_pull_of_100k_outcome_rows_from_mlflow_on_postgresql(benchmark, tmp_path, mlflow_postgres, monkeypatch,
                                                              record_result):
    from tracking.mlflow.pull import pull
    from tracking.mlflow.runs import log_execution

    url, _ = mlflow_postgres
    monkeypatch.setenv("RAGLEDGER_MLFLOW_TRACES", "0")  # traces need generation records, which this store has not
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    started = time.perf_counter()
    record = build_store(tmp_path)
    built = time.perf_counter() - started
    started = time.perf_counter()
    logged = log_execution(url, "20260101T000000-pullbench", record, tmp_path / "store")
    log_s = time.perf_counter() - started
    print(f"\nbuilt {ROWS:,} outcome rows over {CELLS} cells in {built:.1f} s; logged to MLflow in {log_s:.1f} s")

    direct = []
    for i in range(ROUNDS):  # interleaved with nothing else: each round into an empty directory
        started = time.perf_counter()
        n_files = direct_download(url, logged, tmp_path / f"direct-{i}")
        direct.append(time.perf_counter() - started)

    stores = iter(tmp_path / f"pulled-{i}" for i in range(ROUNDS))
    results = []

    def setup():
        return (EXP, next(stores), url), {}

    def timed_pull(*args):
        results.append(pull(*args))

    benchmark.pedantic(timed_pull, setup=setup, rounds=ROUNDS, iterations=1)
    r = results[-1]
    assert r.pulled and r.downloaded == n_files - 2  # pull counts segments (and a call pack), not spec/manifest
    assert len(EventStore(r.store).read("outcomes", EXP)) == ROWS
    pull_s, direct_s = benchmark.stats.stats.min, min(direct)
    figures = {"rows": ROWS, "cells": CELLS, "artifact_files": n_files,
               "artifact_mb": round(sum(p.stat().st_size for p in (tmp_path / "direct-0").rglob("*") if p.is_file())
                                    / 2**20, 1),
               "pull_s": round(pull_s, 2), "pull_mean_s": round(benchmark.stats.stats.mean, 2),
               "direct_download_s": round(direct_s, 2), "direct_download_mean_s": round(sum(direct) / ROUNDS, 2),
               "ratio_pull_to_direct": round(pull_s / direct_s, 2), "target_pull_s": 10.0, "rounds": ROUNDS,
               "backend": "MLflow server, PostgreSQL, proxied artifacts", "measured": time.strftime("%Y-%m-%d")}
    print(f"pull {pull_s:.2f} s (min of {ROUNDS}) vs direct download_artifacts {direct_s:.2f} s: "
          f"{pull_s / direct_s:.2f}x; target pull <= 10 s")
    record_result("pull_100k_postgres", figures)
    for i in range(ROUNDS):
        shutil.rmtree(tmp_path / f"pulled-{i}", ignore_errors=True)
