"""Retrieval-only metrics across depths: Recall@k for every k ≤ K, per retriever, from RetrievalRecords.

Recall@k = share of questions for which some gold answer occurs (`has_answer`, SQuAD normalization)
in the text of the retriever's top-k hits, exactly as the reader sees it. A question with fewer
than k hits counts with all its hits (closed book: none, so 0). The plot is logged to the parent
MLflow run as `analysis/recall_at_k.png`, the numbers as `analysis/recall_at_k.csv`.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from core.answers import has_answer, normalized_passages


def first_hit_rank(retrievals: pd.DataFrame, questions: pd.DataFrame) -> pd.DataFrame:
    """One row per (retriever, qid): the rank of the first hit containing a gold answer (NaN if none)."""
    golds = {r.qid: list(r.answers) for r in questions.itertuples()}
    first: dict[tuple[str, str], int | None] = {}
    ordered = retrievals.sort_values(["retriever", "qid", "rank"], kind="stable")
    # one pass over plain columns, not a pandas group per question (docs/performance.md, "Small costs behind the code")
    for retriever, qid, rank, text in zip(ordered["retriever"], ordered["qid"], ordered["rank"], ordered["text"], strict=True):
        key = (retriever, qid)
        # normalized through evaluate's per-passage cache: the flow draws this curve first, so evaluate then finds
        # its passages already normalized
        if first.setdefault(key, None) is None and has_answer(normalized_passages((text,)), golds.get(qid, [])):
            first[key] = int(rank)
    rows = [{"retriever": r, "qid": q, "first_rank": k} for (r, q), k in first.items()]
    return pd.DataFrame(rows, columns=["retriever", "qid", "first_rank"])


def recall_at_k_curve(retrievals: pd.DataFrame, questions: pd.DataFrame, retrievers: list[str],
                      max_k: int | None = None) -> pd.DataFrame:
    """Columns: retriever, k, recall (percent of all questions), for k = 1..K (K = deepest rank seen)."""
    n = len(questions)
    ranks = first_hit_rank(retrievals, questions)
    k_max = max_k if max_k else (int(retrievals["rank"].max()) if len(retrievals) else 1)
    out = []
    for r in retrievers:
        firsts = ranks.loc[ranks["retriever"] == r, "first_rank"].dropna()
        for k in range(1, k_max + 1):
            out.append({"retriever": r, "k": k, "recall": 100.0 * float((firsts <= k).sum()) / n if n else float("nan")})
    return pd.DataFrame(out, columns=["retriever", "k", "recall"])


def plot_recall_curve(curve: pd.DataFrame, path: Path, title: str = "Recall@k") -> Path:
    # a Figure of its own, without pyplot: pyplot's global figure state is not for the flow's worker threads, and
    # saving a PNG needs no display backend
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for retriever, group in curve.groupby("retriever", sort=False):
        ax.plot(group["k"], group["recall"], marker="o", markersize=3, label=retriever)
    ax.set_xlabel("k (top-k hits)")
    ax.set_ylabel("Recall@k (% questions with a gold answer in the text)")
    ax.set_title(title)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
