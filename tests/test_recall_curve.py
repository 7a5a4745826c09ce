"""Recall@k for every k from RetrievalRecords, and its plot."""

from __future__ import annotations

import pandas as pd

from tracking.analysis.recall_curve import first_hit_rank, plot_recall_curve, recall_at_k_curve


def test_recall_at_every_k_and_plot(tmp_path):
    questions = pd.DataFrame({"qid": ["a", "b", "c", "d"], "answers": [["Paris"], ["Everest"], ["Nile"], ["Broncos"]]})
    rows = [
        ("bm25@3", "a", 1, "The capital is Paris."), ("bm25@3", "a", 2, "x"),
        ("bm25@3", "b", 1, "nothing"), ("bm25@3", "b", 2, "nothing"), ("bm25@3", "b", 3, "Mount Everest is high"),
        ("bm25@3", "c", 1, "no"),  # never found
        ("dense@2", "a", 2, "paris, france"), ("dense@2", "a", 1, "no"),  # rank order, not row order, counts
        ("dense@2", "d", 1, "The Denver Broncos won."),
    ]  # fmt: skip
    retrievals = pd.DataFrame(rows, columns=["retriever", "qid", "rank", "text"])
    ranks = first_hit_rank(retrievals, questions).set_index(["retriever", "qid"])["first_rank"]
    assert ranks[("bm25@3", "a")] == 1 and ranks[("bm25@3", "b")] == 3 and pd.isna(ranks[("bm25@3", "c")])
    assert ranks[("dense@2", "a")] == 2
    curve = recall_at_k_curve(retrievals, questions, ["bm25@3", "dense@2", "none"])
    got = {(r.retriever, r.k): r.recall for r in curve.itertuples()}
    # percent of all 4 questions; questions a retriever returned nothing for count as misses
    assert [got[("bm25@3", k)] for k in (1, 2, 3)] == [25.0, 25.0, 50.0]
    assert [got[("dense@2", k)] for k in (1, 2, 3)] == [25.0, 50.0, 50.0]
    assert [got[("none", k)] for k in (1, 2, 3)] == [0.0, 0.0, 0.0]
    png = plot_recall_curve(curve, tmp_path / "recall.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
