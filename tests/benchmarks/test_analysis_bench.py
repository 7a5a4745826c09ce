"""Benchmarks (skipped by default; run with `pytest tests/benchmarks --benchmark-only -s`):
RWR + error decomposition over 16 cells × 100,000 questions of synthetic OutcomeRecords written through
the real EventStore, and one per-example query over those 1.6 M rows through the DuckDB views.
Targets (reported, not asserted): analysis ≤ 2 s, query ≤ 200 ms, peak memory ≤ 2 GB."""

from __future__ import annotations

import os
import resource
import time
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from tracking.analysis import inconsistency as an
from tracking.store.events import EventStore, new_events, stable_hash

CELLS, QUESTIONS, EXP = 16, 100_000, "bench"
TYPES = np.array(["correct", "lucky_guess", "retrieval_failure", "extraction_error", "hallucination_error", "abstention"])


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    reuse = os.environ.get("RAGLEDGER_BENCH_STORE")  # a store an earlier run built (building takes ~1 min)
    if reuse and EventStore(reuse).segments("outcomes", EXP):
        return reuse
    root = tmp_path_factory.mktemp("bench-store")
    store = EventStore(root)
    rng = np.random.default_rng(0)
    qids = [f"q{k:06d}" for k in range(QUESTIONS)]
    started = time.perf_counter()
    for c in range(CELLS):
        et = TYPES[rng.choice(len(TYPES), size=QUESTIONS, p=[0.45, 0.05, 0.2, 0.1, 0.1, 0.1])]
        correct = np.isin(et, ["correct", "lucky_guess"])
        cell = f"r{c}@5 · concatenation · m"
        rows = {
            "event_id": [stable_hash("outcomes", EXP, cell, q) for q in qids], "cell": cell, "qid": qids,
            "retriever": f"r{c}@5", "reader": "concatenation", "model": "m",
            "prediction": np.where(et == "abstention", "unknown", "x"), "em": correct.astype(float),
            "f1": correct.astype(float), "semantic_match": None, "is_unknown": et == "abstention",
            "gold_in_context": ~np.isin(et, ["lucky_guess", "retrieval_failure"])
            & ~((et == "abstention") & (rng.random(QUESTIONS) < 0.5)),
            "pool_has_correct": None, "error_type": et, "tokens_in": 100, "tokens_out": 3, "llm_calls": 1,
        }  # fmt: skip
        store.write("outcomes", new_events("outcomes", EXP, pd.DataFrame(rows).to_dict("records")))
    print(f"\nbuilt {CELLS} × {QUESTIONS:,} outcome records through EventStore in {time.perf_counter() - started:.1f} s")
    return root


def _analysis(outcomes):
    correct, _, _ = an.correctness_matrix(outcomes)
    matrix, _, mrlr = an.rwr(correct)
    dec = an.decompose(outcomes)
    checks = an.identity_checks(dec)
    return matrix, mrlr, dec, checks


def test_bench_rwr_and_decomposition(benchmark, big_store):
    outcomes = EventStore(big_store).read("outcomes", EXP)
    assert len(outcomes) == CELLS * QUESTIONS
    tracemalloc.start()
    matrix, _, dec, checks = _analysis(outcomes)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert matrix.shape == (CELLS, CELLS) and all(c.holds for c in checks) and len(dec) == CELLS * QUESTIONS
    benchmark.pedantic(_analysis, args=(outcomes,), rounds=3, iterations=1)
    mean, best = benchmark.stats.stats.mean, benchmark.stats.stats.min
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nRWR + decomposition + identity over {CELLS}×{QUESTIONS:,}: mean {mean:.3f} s, min {best:.3f} s "
          f"(target ≤ 2 s: mean at {mean / 2:.2f}× of it); "
          f"traced peak during analysis {peak / 2**20:.0f} MiB; process max RSS {rss:.0f} MiB (target ≤ 2048)")


def test_bench_per_example_query(benchmark, big_store):
    """Connect + views + query. The first query after the segments change also computes the views' overlap
    projection (which segments share events; cached under <store>/projections): timed once, apart."""
    import shutil

    from tracking.store.events import PROJECTIONS_DIR
    from tracking.store.query import query

    sql = "SELECT cell, prediction, em, error_type FROM outcomes WHERE qid = 'q054321' ORDER BY cell"
    shutil.rmtree(os.path.join(big_store, PROJECTIONS_DIR), ignore_errors=True)
    started = time.perf_counter()
    first = query(big_store, sql)
    cold = time.perf_counter() - started
    df = benchmark.pedantic(query, args=(big_store, sql), rounds=5, iterations=1)
    assert len(df) == CELLS and df.equals(first)
    mean, best = benchmark.stats.stats.mean, benchmark.stats.stats.min
    print(f"\nper-example query over {CELLS * QUESTIONS:,} rows (connect + views + query): mean {mean * 1000:.0f} ms, "
          f"min {best * 1000:.0f} ms (target ≤ 200 ms: mean at {mean / 0.2:.2f}× of it); the first query after the "
          f"segments changed, computing the overlap projection: {cold * 1000:.0f} ms")


def test_bench_full_analysis_tables(benchmark, big_store):
    """Every table of `ragledger analyze` (no plots, no EoR): RWR, per-error RWR, decomposition, identity,
    error shares and accuracy CIs (1,000 bootstrap resamples), all 120 paired comparisons."""
    from tracking.analysis.tables import compute

    outcomes = EventStore(big_store).read("outcomes", EXP)
    tracemalloc.start()
    res = compute(outcomes, EXP)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(res.paired) == CELLS * (CELLS - 1) // 2 and res.identity["holds"].all()
    benchmark.pedantic(compute, args=(outcomes, EXP), rounds=2, iterations=1)
    mean = benchmark.stats.stats.mean
    print(f"\nfull analysis tables over {CELLS}×{QUESTIONS:,}: mean {mean:.2f} s; traced peak {peak / 2**20:.0f} MiB")
