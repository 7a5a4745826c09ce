"""The readers table (tracking/analysis/readers_table.py) for people: its rows as display strings (`ragledger run`
prints them), and readers_table.{csv,md,html}, which the flow logs to the experiment's parent MLflow run as
analysis/readers_table.*."""

from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from core.atomic import atomic_path
from core.diskfull import reported_as_store_full
from tracking.analysis.readers_table import COLUMNS

FILES = ("readers_table.csv", "readers_table.md", "readers_table.html")
NOTES = ("EM 95% CI: percentile bootstrap over questions (1,000 resamples, seed 0). %NM: questions whose answer pool holds "
         "a correct answer that the vote did not pick, over all questions (seed 001); %NM|pool: the same over the questions "
         "whose pool holds a correct answer. Recall@k fb: Recall@k of the documents a REFEED reader retrieved with its own "
         "answers (seed 003 Fig. 4). tokens/q: prompt + completion tokens per question. %parse-fail: the cell's model "
         "calls whose output its parser could not read (kept, and counted as wrong).")


def fmt(v: float, digits: int = 1) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def display_rows(table: pd.DataFrame) -> list[list[str]]:
    """The table as strings: retriever, reader, then COLUMNS (EM's CI as "[lo, hi]")."""
    out = []
    for r in table.to_dict("records"):
        ci = "-" if math.isnan(r["em_ci_lo"]) else f"[{fmt(r['em_ci_lo'])}, {fmt(r['em_ci_hi'])}]"
        out.append([r["retriever"], r["reader"], *(ci if c == "em_ci" else fmt(r[c], d) for c, _, d in COLUMNS)])
    return out


def headers() -> list[str]:
    return ["retriever", "reader", *(h for _, h, _ in COLUMNS)]


def to_markdown(table: pd.DataFrame, title: str = "") -> str:
    lines = [f"## {title}", ""] if title else []
    lines += ["| " + " | ".join(headers()) + " |", "|" + "|".join(["---", "---"] + ["---:"] * len(COLUMNS)) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in display_rows(table)]
    lines += ["", NOTES]
    return "\n".join(lines) + "\n"


def to_html(table: pd.DataFrame, title: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers())
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in display_rows(table))
    return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title or 'readers')}</title>"
            "<style>td,th{padding:2px 8px;font-family:sans-serif}td:nth-child(n+3){text-align:right}</style>"
            f"<h2>{html.escape(title)}</h2><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>{html.escape(NOTES)}</p>")


def write_readers_table(table: pd.DataFrame, out_dir: Path, title: str = "") -> list[str]:
    """readers_table.csv/.md/.html in out_dir, each written atomically (a killed run leaves no half file)."""
    contents = {FILES[1]: to_markdown(table, title), FILES[2]: to_html(table, title)}
    paths = []
    for name in FILES:
        # out of space: StoreFullError naming the file, and no temp file left for `store verify` to flag
        with reported_as_store_full(out_dir / name), atomic_path(out_dir / name, suffix=f"-{name}") as tmp:
            if name.endswith(".csv"):
                table.to_csv(tmp, index=False)
            else:
                tmp.write_text(contents[name], encoding="utf-8")
        paths.append(str(out_dir / name))
    return paths
