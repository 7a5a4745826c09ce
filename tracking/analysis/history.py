"""Across experiments: a leaderboard of cells across experiments and datasets, and what changed between two
executions of one experiment. Projections of the stored outcomes (read through tracking/store/ledger.py; the views
open only the files of the experiments asked about); no model call.

Each (experiment, cell, question) counts once in a leaderboard: its latest outcome (tracking/store/ledger.py
`Ledger.cell_totals`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tracking.analysis.inconsistency import AnalysisError
from tracking.analysis.metrics import right_or_wrong_ci
from tracking.store.ledger import Ledger


def leaderboard(store_root: str | Path, experiments: list[str] | None = None, dataset: str | None = None,
                top: int | None = 10, metric: str = "em") -> pd.DataFrame:
    """Cells ranked within each dataset by accuracy: dataset, rank, experiment, cell, questions, em, f1, and the
    percentile-bootstrap 95% CI of EM (tracking.analysis.metrics.bootstrap_ci, as the readers table) for the rows
    shown: the `top` of each dataset (all for None)."""
    if metric not in ("em", "f1"):
        raise AnalysisError(f"--metric must be em or f1, got {metric!r}")
    ledger = Ledger(store_root)
    names = experiments if experiments is not None else ledger.experiments()
    if not names:
        raise AnalysisError(f"no experiment with outcomes in {store_root}")
    df = ledger.cell_totals(names)
    df.insert(0, "dataset", df["experiment"].map(ledger.datasets()).fillna(""))
    if dataset is not None:
        df = df[df["dataset"] == dataset]
    df = df.sort_values(["dataset", metric, "experiment", "cell"], ascending=[True, False, True, True])
    df.insert(1, "rank", df.groupby("dataset").cumcount() + 1)
    if top is not None:
        df = df[df["rank"] <= top]
    ci = [right_or_wrong_ci(int(n), int(k)) for n, k in zip(df["questions"], df["right"], strict=True)]
    df["em"], df["f1"] = df["em"] * 100, df["f1"] * 100
    df["em_lo"], df["em_hi"] = [100 * lo for lo, _ in ci], [100 * hi for _, hi in ci]
    return df.drop(columns="right").reset_index(drop=True)


def experiment_readers_table(store_root: str | Path, experiment: str) -> pd.DataFrame:
    """One experiment's readers table (tracking/analysis/readers_table.py) from its stored outcomes: the latest
    execution's cells, their metrics computed from the outcomes alone."""
    from tracking.analysis.metrics import cell_metrics
    from tracking.analysis.readers_table import readers_table

    df = Ledger(store_root).experiment_outcomes(experiment)
    return readers_table({cell: cell_metrics(rows) for cell, rows in df.groupby("cell", sort=True)})


def execution_diff(store_root: str | Path, experiment: str, before: str | None = None,
                   after: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, tuple[str, str]]:
    """What changed between two executions of one experiment (default: the last two), on the (cell, question)
    pairs both answered: a summary per cell (EM before and after, fixed, broken, exact McNemar p) and the questions
    that flipped (fixed: wrong before, right after; broken: the other way). Returns (summary, flips, (before, after))."""
    from tracking.analysis.stats import mcnemar_exact  # scipy: imported only by the command that needs it

    ledger = Ledger(store_root)
    a, b = ledger.execution(experiment, before, -2), ledger.execution(experiment, after, -1)
    old, new = (ledger.outcomes(experiment, x)[["cell", "qid", "prediction", "em"]] for x in (a, b))
    j = old.merge(new, on=["cell", "qid"], suffixes=("_before", "_after"))
    if j.empty:
        raise AnalysisError(f"executions {a['name']} and {b['name']} of {experiment!r} share no (cell, question)")
    was, now = j["em_before"] >= 1, j["em_after"] >= 1
    j["change"] = np.select([~was & now, was & ~now], ["fixed", "broken"], "")
    rows = []
    for cell, g in j.groupby("cell", sort=True):
        fixed, broken = int((g["change"] == "fixed").sum()), int((g["change"] == "broken").sum())
        rows.append({"cell": cell, "questions": len(g), "em_before": 100 * g["em_before"].mean(),
                     "em_after": 100 * g["em_after"].mean(), "fixed": fixed, "broken": broken,
                     "mcnemar_p": mcnemar_exact(fixed, broken)})
    flips = j[j["change"] != ""].sort_values(["cell", "change", "qid"])
    flips = flips[["cell", "qid", "change", "prediction_before", "prediction_after"]].reset_index(drop=True)
    return pd.DataFrame(rows), flips, (a["name"], b["name"])
