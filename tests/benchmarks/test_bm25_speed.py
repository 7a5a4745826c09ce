"""BM25 over all 10,570 SQuAD dev questions at k=10: our retriever (`BM25.retrieve`, which also turns every
hit into the passage text the reader sees) against raw Pyserini `LuceneSearcher.batch_search` on the same
index with the same threads, in the same run. Target: ours / Pyserini ≤ 1.10 (median of rounds).

Skipped by default (`--benchmark-skip` in pyproject). Run:
    PYTHONPATH=$PWD .venv/bin/python -m pytest tests/benchmarks --benchmark-only -p no:cacheprovider -s
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragledger.datasets import load_corpus, load_questions
from tasks.retrievers.base import Corpus, Query
from tasks.retrievers.bm25 import BM25, BM25_B, BM25_K1

REPO = Path(__file__).resolve().parents[2]
K = 10
THREADS = os.cpu_count() or 2
ROUNDS = 3
TARGET = 1.10
_medians: dict[str, float] = {}


@pytest.fixture(scope="module")
def setup():
    corpus = Corpus.from_frame(load_corpus("squad-paragraphs", ["squad/dev-v1.1.json.gz", "squad/train-v1.0.json.gz"]))
    questions = load_questions("squad", "squad/dev-v1.1.json.gz")
    assert len(questions) == 10_570 and len(corpus.passages) == 20_963
    retriever = BM25(f"bm25@{K}", K)
    retriever.prepare(corpus, REPO / ".ragledger" / "indexes")
    return retriever, [Query(q.qid, q.question) for q in questions]


def test_pyserini_batch_search(benchmark, setup, monkeypatch):
    retriever, queries = setup
    from ragledger.java import ensure_jvm

    ensure_jvm()
    # pyserini.encode._openai builds an OpenAI client at import time and refuses to import without a key;
    # nothing here calls OpenAI, so a placeholder suffices when none is set
    monkeypatch.setenv("OPENAI_API_KEY", os.environ.get("OPENAI_API_KEY") or "unused-placeholder")
    from pyserini.search.lucene import LuceneSearcher

    searcher = LuceneSearcher(str(retriever.index_dir))
    searcher.set_bm25(BM25_K1, BM25_B)
    texts, qids = [q.text for q in queries], [q.qid for q in queries]
    result = benchmark.pedantic(lambda: searcher.batch_search(texts, qids, k=K, threads=THREADS), rounds=ROUNDS, warmup_rounds=1)
    assert len(result) == len(queries)
    _medians["pyserini"] = benchmark.stats.stats.median


def test_ours_bm25_retrieve(benchmark, setup):
    retriever, queries = setup
    result = benchmark.pedantic(lambda: retriever.retrieve(queries), rounds=ROUNDS, warmup_rounds=1)
    assert len(result) == len(queries) and sum(len(h) for h in result.values()) >= 0.99 * K * len(queries)
    ours = benchmark.stats.stats.median
    if "pyserini" not in _medians:
        pytest.skip("run with the Pyserini benchmark in the same session to get the ratio")
    ratio = ours / _medians["pyserini"]
    benchmark.extra_info.update({"pyserini_median_s": _medians["pyserini"], "ratio_vs_pyserini": ratio, "threads": THREADS})
    print(f"\nBM25 k={K}, {len(queries):,} questions, {THREADS} threads: ours {ours:.2f} s, "
          f"Pyserini {_medians['pyserini']:.2f} s, ratio {ratio:.3f} (target <= {TARGET})")
    assert ratio <= TARGET
