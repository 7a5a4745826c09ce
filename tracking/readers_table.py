"""The readers table: one row per cell (retriever × reader strategy), with EM and its 95% bootstrap CI, F1, %Unk,
%NM, tokens and model calls per question. `ragledger run` prints it; the flow logs it to the experiment's parent
MLflow run as analysis/readers_table.{csv,md,html}. A projection of the cells' metrics (`tracking.metrics`)."""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from tracking.events import temp_path

# (column, header); numbers are percentages except tokens/calls per question
COLUMNS = [("em", "EM"), ("em_ci", "EM 95% CI"), ("f1", "F1"), ("semantic_acc", "Sem"), ("unk_pct", "%Unk"),
           ("nm_pct", "%NM"), ("recall_at_k", "Recall@k"), ("tokens_per_q", "tokens/q"), ("calls_per_q", "calls/q")]
FILES = ("readers_table.csv", "readers_table.md", "readers_table.html")


def _num(v: object) -> float:
    return float(v) if isinstance(v, int | float) else math.nan


def readers_table(cells: dict[str, dict]) -> pd.DataFrame:
    """One row per cell, in the run's cell order: retriever, reader, model, questions and the metric columns."""
    rows = []
    for cell, m in cells.items():
        retriever, reader, model = (p.strip() for p in cell.split("·"))
        tokens = _num(m.get("tokens_in_per_q")) + _num(m.get("tokens_out_per_q"))
        rows.append({"retriever": retriever, "reader": reader, "model": model, "questions": int(m.get("questions", 0)),
                     "em": _num(m.get("em")), "em_ci_lo": _num(m.get("em_ci_lo")), "em_ci_hi": _num(m.get("em_ci_hi")),
                     "f1": _num(m.get("f1")), "semantic_acc": _num(m.get("semantic_acc")), "unk_pct": _num(m.get("unk_pct")),
                     "nm_pct": _num(m.get("nm_pct")), "recall_at_k": _num(m.get("recall_at_k")),
                     "tokens_per_q": round(tokens, 1), "calls_per_q": _num(m.get("calls_per_q"))})
    return pd.DataFrame(rows, columns=["retriever", "reader", "model", "questions", "em", "em_ci_lo", "em_ci_hi", "f1",
                                       "semantic_acc", "unk_pct", "nm_pct", "recall_at_k", "tokens_per_q", "calls_per_q"])


def fmt(v: float, digits: int = 1) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def display_rows(table: pd.DataFrame) -> list[list[str]]:
    """The table as strings: retriever, reader, then COLUMNS (EM's CI as "[lo, hi]")."""
    out = []
    for r in table.itertuples():
        ci = "-" if math.isnan(r.em_ci_lo) else f"[{fmt(r.em_ci_lo)}, {fmt(r.em_ci_hi)}]"
        out.append([r.retriever, r.reader, fmt(r.em), ci, fmt(r.f1), fmt(r.semantic_acc), fmt(r.unk_pct), fmt(r.nm_pct),
                    fmt(r.recall_at_k), fmt(r.tokens_per_q), fmt(r.calls_per_q, 2)])
    return out


def headers() -> list[str]:
    return ["retriever", "reader", *(h for _, h in COLUMNS)]


def to_markdown(table: pd.DataFrame, title: str = "") -> str:
    lines = [f"## {title}", ""] if title else []
    lines += ["| " + " | ".join(headers()) + " |", "|" + "|".join(["---", "---"] + ["---:"] * len(COLUMNS)) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in display_rows(table)]
    lines += ["", "EM 95% CI: percentile bootstrap over questions (1,000 resamples, seed 0). %NM: '-' for readers without "
              "an answer pool. tokens/q: prompt + completion tokens per question."]
    return "\n".join(lines) + "\n"


def to_html(table: pd.DataFrame, title: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers())
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in display_rows(table))
    return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title or 'readers')}</title>"
            "<style>td,th{padding:2px 8px;font-family:sans-serif}td:nth-child(n+3){text-align:right}</style>"
            f"<h2>{html.escape(title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            "<p>EM 95% CI: percentile bootstrap over questions (1,000 resamples, seed 0).</p>")


def write_readers_table(table: pd.DataFrame, out_dir: Path, title: str = "") -> list[str]:
    """readers_table.csv/.md/.html in out_dir, each written aside and renamed (a killed run leaves no half file)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    contents = {FILES[1]: to_markdown(table, title), FILES[2]: to_html(table, title)}
    paths = []
    for name in FILES:
        tmp = temp_path(out_dir, f"-{name}")
        if name.endswith(".csv"):
            table.to_csv(tmp, index=False)
        else:
            tmp.write_text(contents[name], encoding="utf-8")
        tmp.replace(out_dir / name)
        paths.append(str(out_dir / name))
    return paths
