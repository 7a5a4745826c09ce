"""The readers table: one row per cell (retriever × reader × model), with EM and its 95% bootstrap CI, F1, %Unk,
%NM (and its rate conditional on a correct answer in the pool), tokens and model calls per question, and the share of
model outputs that could not be parsed.
A projection of the cells' metrics (`tracking.analysis.metrics`); tracking/report/readers_table.py shows it (the
terminal's rows, and the csv/md/html files the flow logs to the experiment's parent MLflow run)."""

from __future__ import annotations

import math

import pandas as pd

from core.cell import Cell

# (column, header, decimals); numbers are percentages except tokens/calls per question. "em_ci" is shown from
# em_ci_lo and em_ci_hi; every other column is a cell metric of the same name (tracking.analysis.metrics.cell_metrics)
COLUMNS = [("em", "EM", 1), ("em_ci", "EM 95% CI", 1), ("f1", "F1", 1), ("semantic_acc", "Sem", 1), ("unk_pct", "%Unk", 1),
           ("nm_pct", "%NM", 1), ("nm_cond_pct", "%NM|pool", 1), ("recall_at_k", "Recall@k", 1),
           ("recall_feedback_at_k", "Recall@k fb", 1), ("tokens_per_q", "tokens/q", 1), ("calls_per_q", "calls/q", 2),
           ("parse_fail_pct", "%parse-fail", 1)]
NUMBERS = ["em", "em_ci_lo", "em_ci_hi", *(c for c, _, _ in COLUMNS if c not in ("em", "em_ci"))]


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) else math.nan


def readers_table(cells: dict[str, dict]) -> pd.DataFrame:
    """One row per cell, in the run's cell order: retriever, reader, model, questions and the metric columns."""
    rows = []
    for name, m in cells.items():
        cell = Cell.parse(name)
        tokens = _num(m.get("tokens_in_per_q")) + _num(m.get("tokens_out_per_q"))
        metrics = {c: _num(m.get(c)) for c in NUMBERS} | {"tokens_per_q": round(tokens, 1)}
        rows.append({"retriever": cell.retriever, "reader": cell.reader, "model": cell.model,
                     "questions": int(m.get("questions", 0)), **metrics})
    return pd.DataFrame(rows, columns=["retriever", "reader", "model", "questions", *NUMBERS])
