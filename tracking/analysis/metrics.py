"""Headline metrics of a cell, computed from its stored outcome (and retrieval) records."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from core.diskfull import write_text_atomically

# bump when cell_metrics changes: it names the cached projections (3: EM CI by tracking.analysis.metrics.bootstrap_ci's counts)
METRICS_VERSION = "3"

BOOTSTRAP_CHUNK = 2_000_000  # multinomial counts held at once (16 MB)


def _pct(x: float) -> float:
    return round(100.0 * x, 2)


def cell_metrics(outcomes: pd.DataFrame, retrievals: pd.DataFrame | None = None, questions: pd.DataFrame | None = None,
                 generations: pd.DataFrame | None = None) -> dict:
    """EM, F1, semantic accuracy, %Unk, %NM (seed 001), Recall@k and usage per question for one cell.

    %NM (seed 001 §3): the share of ALL questions whose answer pool holds a correct answer while the vote picks
    a wrong one; a single answer is a one-answer pool, so it never counts (001's Concat+PF %NM of 3.8 is about
    PF's %NM x Concat's %Unk). `nm_cond_pct`: the same over the questions whose pool holds a correct answer.
    Recall@k: share of questions whose gold answer occurs in the cell's retrieved text.
    parse_fail_pct: share of the cell's model calls whose output its parser could not read (parse_status not ok).
    """
    n = len(outcomes)
    if n == 0:
        return {"questions": 0}
    has_correct = outcomes["pool_has_correct"].astype("boolean").fillna(False).to_numpy(dtype=bool)
    missed = has_correct & (outcomes["em"].to_numpy(dtype=float) < 1)
    sem = outcomes["semantic_match"].dropna()
    m = {
        "questions": n,
        "em": _pct(outcomes["em"].mean()),
        "f1": _pct(outcomes["f1"].mean()),
        "semantic_acc": _pct(sem.mean()) if len(sem) else math.nan,
        "unk_pct": _pct(outcomes["is_unknown"].mean()),
        "nm_pct": _pct(missed.mean()),
        "nm_cond_pct": _pct(missed.sum() / has_correct.sum()) if has_correct.any() else math.nan,
        "recall_at_k": _pct(_in_retrieval(outcomes).mean()),
        # REFEED: Recall@k of the reader's own feedback retrieval (Q+A, or Q+A1..An with MODULE-1), beside
        # recall_at_k (the cell's question-only retrieval), over the questions that made a feedback retrieval
        "recall_feedback_at_k": _feedback_recall(outcomes),
        "tokens_in_per_q": round(outcomes["tokens_in"].mean(), 1),
        "tokens_out_per_q": round(outcomes["tokens_out"].mean(), 1),
        "calls_per_q": round(outcomes["llm_calls"].mean(), 2),
        "parse_fail_pct": math.nan,
    }
    if generations is not None and len(generations):
        m["parse_fail_pct"] = _pct((generations["parse_status"] != "ok").mean())
    lo, hi = bootstrap_ci(outcomes["em"].to_numpy(dtype=float))  # seeded: 1,000 resamples of the questions
    m["em_ci_lo"], m["em_ci_hi"] = _pct(lo), _pct(hi)
    m["gold_paragraph_hit"] = math.nan
    if retrievals is not None and questions is not None and not retrievals.empty:
        gold = {r.qid: set(r.gold_pids) for r in questions.itertuples() if len(r.gold_pids)}
        if gold:
            got = retrievals.groupby("qid")["pid"].apply(set)
            hits = [bool(gold[q] & got.get(q, set())) for q in outcomes["qid"] if q in gold]
            if hits:
                m["gold_paragraph_hit"] = _pct(float(np.mean(hits)))
    return m


def _in_retrieval(outcomes: pd.DataFrame) -> pd.Series:
    """gold_in_retrieval, or gold_in_context where a segment predates it (then both were the cell's retrieval)."""
    ctx = outcomes["gold_in_context"].astype(bool)
    if "gold_in_retrieval" not in outcomes:
        return ctx
    return outcomes["gold_in_retrieval"].astype("boolean").fillna(ctx).astype(bool)


def _feedback_recall(outcomes: pd.DataFrame) -> float:
    if "gold_in_feedback" not in outcomes:
        return math.nan
    known = outcomes["gold_in_feedback"].dropna()
    return _pct(known.astype(bool).mean()) if len(known) else math.nan


def bootstrap_ci(values: np.ndarray, n_resamples: int = 1000, seed: int = 0, alpha: float = 0.05) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (in the values' units), resampling the values (questions) with replacement.

    The one bootstrap of ragledger: the readers table's EM CI, the analysis' accuracy CI and the paired CI of ΔEM
    (over per-question differences) all call it, so a cell has one CI wherever it is shown. A resample's mean depends
    only on how often each distinct value is drawn, and those counts are Multinomial(n, shares of the values): drawn
    so, the CI is the index-resampling bootstrap's distribution, does not depend on the order of the values (the
    store's order, the analysis' qid order) and costs O(resamples x distinct values): 0/1 EM over 100,000 questions
    never builds a resamples x questions array. Resamples are drawn in chunks, which does not change them."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n == 0:
        return (math.nan, math.nan)
    levels, counts = np.unique(values, return_counts=True)
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    rows = max(1, BOOTSTRAP_CHUNK // len(levels))
    for start in range(0, n_resamples, rows):
        m = min(rows, n_resamples - start)
        means[start : start + m] = rng.multinomial(n, counts / n, size=m) @ levels / n
    return float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2))


@functools.lru_cache(maxsize=1 << 16)
def right_or_wrong_ci(n: int, right: int) -> tuple[float, float]:
    """bootstrap_ci of n 0/1 values of which `right` are 1: what it depends on are the two counts, so the many cells
    of a leaderboard that share them are drawn once (the same CI as the readers table's)."""
    return bootstrap_ci(np.repeat([0.0, 1.0], [n - right, right]))


def cached_cell_metrics(projection_dir: Path, key: str, compute) -> dict:
    """A cell's metrics as a projection of its immutable segments: computed once per segment set (`key` hashes
    the segment paths, which are content-addressed, and METRICS_VERSION) and kept as JSON under the store's
    projections; deleting them only makes the next run recompute the same figures."""
    path = projection_dir / f"cell-metrics-{key}.json"
    if path.exists():
        try:
            return _with_nan_singleton(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # a damaged projection is recomputed
    metrics = compute()
    write_text_atomically(path, json.dumps(metrics))  # a killed run leaves no half-written projection
    return metrics


def _with_nan_singleton(metrics: dict) -> dict:
    """NaN read back from JSON as math.nan itself, as cell_metrics returns it: dicts compare NaN by identity, so a
    rerun's metrics then equal the first run's."""
    return {k: math.nan if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}
