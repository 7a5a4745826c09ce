"""A synthetic lab's store, written through ragledger's own writer (EventStore.write: validation, checksum, atomic
rename), as a flow lays it out: per experiment one questions segment and, per cell and shard of 250 questions, one
outcomes segment. Seeded, so the same size gives the same store.

The lab: EXPERIMENTS experiments, each over one of four datasets (experiment i: dataset i % 4) and a sample of
QUESTIONS of its 8,000 questions; 16 cells (4 retrievers x 4 readers, one model of two); outcomes whose accuracy
depends on the dataset, the retriever and the reader. Generations, retrievals and votes are not written (the stated
subset: a question's history, a leaderboard and a readers table read outcomes and questions).

    python -m tests.benchmarks.lab ROOT EXPERIMENTS   # writes ROOT/store and ROOT/complete
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

DATASETS = ["nq", "triviaqa", "webq", "squad"]
RETRIEVERS = ["bm25@5", "dense@5", "hybrid@5", "bm25@10"]
READERS = ["concatenation", "post_fusion", "refeed", "sure"]
MODELS = ["qwen2.5-0.5b", "llama-3.1-8b"]
POOL = 8_000
QUESTIONS = 2_000
SHARD = 250
ERRORS = ["retrieval_failure", "extraction_error", "hallucination_error", "abstention"]


def experiment_name(i: int) -> str:
    return f"lab-{i:04d}"


def qid(dataset: str, q: int) -> str:
    return f"{dataset}-{q:05d}"


def cells(i: int) -> list[tuple[str, str, str]]:
    return [(r, s, MODELS[i % 2]) for r in RETRIEVERS for s in READERS]


def sample(i: int) -> tuple[np.random.Generator, list[str]]:
    """Experiment i's random source and its questions (drawn first from it)."""
    rng = np.random.default_rng(i)
    return rng, [qid(DATASETS[i % 4], int(q)) for q in np.sort(rng.choice(POOL, QUESTIONS, replace=False))]


def write_experiment(root: str, i: int) -> int:
    """One experiment's segments; returns how many it wrote."""
    from tracking.store.events import EventStore, event_id, new_events

    store, name, dataset = EventStore(root), experiment_name(i), DATASETS[i % 4]
    rng, qids = sample(i)
    questions = [{"event_id": event_id("questions", name, q), "cell": "", "qid": q, "dataset": dataset,
                  "question": f"question {q}?", "answers": [f"answer {q}"], "gold_pids": []} for q in qids]
    store.write("questions", new_events("questions", name, questions))
    written = 1
    difficulty = {q: (int(q[-5:]) * 37 % 100) / 250 for q in qids}  # a question is as hard in every experiment
    for c, (retriever, reader, model) in enumerate(cells(i)):
        cell = f"{retriever} · {reader} · {model}"
        base = 0.25 + 0.05 * (c % 4) + 0.04 * (c // 4) + 0.03 * (i % 4) + (0.05 if model == MODELS[1] else 0)
        for start in range(0, QUESTIONS, SHARD):
            rows = []
            for q in qids[start:start + SHARD]:
                right = bool(rng.random() < base - difficulty[q] + 0.2)
                rows.append({"event_id": event_id("outcomes", name, cell, start, q), "cell": cell, "qid": q,
                             "retriever": retriever, "reader": reader, "model": model,
                             "prediction": f"answer {q}" if right else f"wrong {rng.integers(100)}",
                             "em": float(right), "f1": 1.0 if right else float(rng.random() * 0.5),
                             "semantic_match": None, "is_unknown": False, "gold_in_context": right or rng.random() < .4,
                             "pool_has_correct": right, "gold_in_retrieval": right or rng.random() < .4,
                             "gold_in_feedback": None,
                             "error_type": "correct" if right else ERRORS[int(rng.integers(len(ERRORS)))],
                             "tokens_in": 600, "tokens_out": 8, "llm_calls": 1})
            store.write("outcomes", new_events("outcomes", name, rows))
            written += 1
    return written


def build(root: Path, experiments: int, workers: int = 2) -> Path:
    """ROOT/store holding the lab (built once: ROOT/complete marks it whole)."""
    store = root / "store"
    if (root / "complete").exists():
        return store
    store.mkdir(parents=True, exist_ok=True)
    started, done = time.time(), 0
    with ProcessPoolExecutor(workers) as pool:
        for n, _ in enumerate(pool.map(write_experiment, [str(store)] * experiments, range(experiments)), 1):
            done = n
            if n % 50 == 0 or n == experiments:
                print(f"lab: {n}/{experiments} experiments written ({time.time() - started:.0f} s)", flush=True)
    (root / "complete").write_text(f"{done} experiments\n")
    return store


if __name__ == "__main__":
    build(Path(sys.argv[1]), int(sys.argv[2]))
