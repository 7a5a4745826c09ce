"""Questions across experiments: one question's history in every experiment, a leaderboard of cells across
experiments and datasets, and what changed between two executions of one experiment. Projections of the stored
outcomes (the views of tracking/analysis/query.py, which open only the files of the experiments asked about);
no model call.

Each (experiment, cell, question) counts once in a leaderboard: its latest outcome (an experiment run again with
another prompt holds the outcomes of both executions). A compacted experiment whose catalog says it holds one
outcome per cell and question (tracking/store/catalog.py) is summed as it is; the others are reduced to their latest
outcomes first, which is the costly part of a query over many uncompacted experiments.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
from pathlib import Path

import numpy as np
import pandas as pd

from tracking.analysis.executions import load_outcomes, manifests
from tracking.analysis.inconsistency import AnalysisError
from tracking.analysis.metrics import right_or_wrong_ci
from tracking.analysis.query import connect
from tracking.analysis.question_index import datasets, experiments_asking
from tracking.store.catalog import load_catalog, reading
from tracking.store.events import EventStore

HISTORY_COLUMNS = ["experiment", "dataset", "cell", "prediction", "em", "f1", "error_type", "created_at"]


def experiments_matching(store_root: str | Path, patterns: list[str] | None = None) -> list[str]:
    """The store's experiments with outcomes, or those matching any of the shell patterns (`nq-*`)."""
    names = EventStore(store_root).experiments("outcomes")
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def question_history(store_root: str | Path, qid: str, experiments: list[str] | None = None) -> pd.DataFrame:
    """Every stored outcome of question `qid`, oldest first: experiment, dataset, cell, prediction, em, f1, error
    type, when. Only the experiments that asked it are opened (the question index, tracking/analysis/question_index.py),
    and in each pack only the row group holding it (packs are sorted by question)."""
    asked = experiments_asking(store_root, qid)
    names = [n for n in (experiments if experiments is not None else experiments_matching(store_root)) if n in asked]
    if not names:
        return pd.DataFrame(columns=HISTORY_COLUMNS)
    with reading(store_root), contextlib.closing(connect(store_root, experiments=names, kinds=("outcomes",))) as con:
        df = con.execute(f"SELECT {', '.join(c for c in HISTORY_COLUMNS if c != 'dataset')} FROM outcomes "
                         "WHERE qid = ? ORDER BY created_at, experiment, cell", [qid]).fetch_df()
    df.insert(1, "dataset", df["experiment"].map(asked))
    return df


def question_text(store_root: str | Path, qid: str, experiments: list[str]) -> tuple[str, list[str]] | None:
    """The question and its gold answers, from the first of `experiments` that stored it."""
    with reading(store_root), contextlib.closing(connect(store_root, experiments=experiments[:1],
                                                         kinds=("questions",))) as con:
        row = con.execute("SELECT question, answers FROM questions WHERE qid = ? LIMIT 1", [qid]).fetchone()
    return (row[0], list(row[1])) if row else None


def _unique_per_cell_question(store_root: str | Path, names: list[str]) -> set[str]:
    """The experiments whose outcomes are all in a pack that holds each (cell, question) once (its catalog says)."""
    store, out = EventStore(store_root), set()
    for name in names:
        entry = load_catalog(store_root, name).entry("outcomes")
        if entry is not None and entry.one_per_cell_question and len(store.segments("outcomes", name)) == 1:
            out.add(name)
    return out


def leaderboard(store_root: str | Path, experiments: list[str] | None = None, dataset: str | None = None,
                top: int | None = 10, metric: str = "em") -> pd.DataFrame:
    """Cells ranked within each dataset by accuracy: dataset, rank, experiment, cell, questions, em, f1, and the
    percentile-bootstrap 95% CI of EM (tracking.analysis.metrics.bootstrap_ci, as the readers table) for the rows
    shown: the `top` of each dataset (all for None)."""
    if metric not in ("em", "f1"):
        raise AnalysisError(f"--metric must be em or f1, got {metric!r}")
    names = experiments if experiments is not None else experiments_matching(store_root)
    if not names:
        raise AnalysisError(f"no experiment with outcomes in {store_root}")
    unique = _unique_per_cell_question(store_root, names)
    with reading(store_root), contextlib.closing(connect(store_root, experiments=names, kinds=("outcomes",))) as con:
        con.execute("CREATE TEMP TABLE reduced (experiment VARCHAR)")
        reduced = [(n,) for n in names if n not in unique]
        if reduced:
            con.executemany("INSERT INTO reduced VALUES (?)", reduced)
        df = con.execute(
            "WITH o AS (SELECT experiment, cell, em, f1 FROM outcomes WHERE experiment NOT IN (SELECT * FROM reduced) "
            "UNION ALL SELECT experiment, cell, em, f1 FROM outcomes WHERE experiment IN (SELECT * FROM reduced) "
            "QUALIFY row_number() OVER (PARTITION BY experiment, cell, qid ORDER BY created_at DESC, event_id) = 1), "
            "SELECT o.experiment, o.cell, count(*) AS questions, "
            "sum(CASE WHEN o.em >= 1 THEN 1 ELSE 0 END) AS right, avg(o.em) AS em, avg(o.f1) AS f1 "
            "FROM o GROUP BY ALL").fetch_df()
    df.insert(0, "dataset", df["experiment"].map(datasets(store_root)).fillna(""))
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
    from tracking.analysis.executions import experiment_outcomes
    from tracking.analysis.metrics import cell_metrics
    from tracking.analysis.readers_table import readers_table

    df = experiment_outcomes(store_root, experiment)
    return readers_table({cell: cell_metrics(rows) for cell, rows in df.groupby("cell", sort=True)})


def executions(store_root: str | Path, experiment: str) -> list[str]:
    """An experiment's executions, oldest first, by their manifest's name (<UTC time>-<run token>)."""
    return [p.stem for p in manifests(store_root, experiment)]


def _execution(store_root: str | Path, experiment: str, name: str | None, default: int) -> dict:
    files = manifests(store_root, experiment)
    if name is None:
        if len(files) < 2:
            raise AnalysisError(f"experiment {experiment!r} has {len(files)} execution(s) in {store_root}; "
                                "a diff needs two")
        path = files[default]
    else:
        hits = [p for p in files if p.stem == name or p.stem.startswith(name)]
        if len(hits) != 1:
            known = ", ".join(p.stem for p in files) or "none"
            raise AnalysisError(f"{'no' if not hits else len(hits)} execution(s) of {experiment!r} match {name!r}; "
                                f"executions: {known}")
        path = hits[0]
    try:
        return {**json.loads(path.read_text()), "manifest_path": str(path), "name": path.stem}
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path}: unreadable run manifest: {exc}") from None


def execution_diff(store_root: str | Path, experiment: str, before: str | None = None,
                   after: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, tuple[str, str]]:
    """What changed between two executions of one experiment (default: the last two), on the (cell, question)
    pairs both answered: a summary per cell (EM before and after, fixed, broken, exact McNemar p) and the questions
    that flipped (fixed: wrong before, right after; broken: the other way). Returns (summary, flips, (before, after))."""
    from tracking.analysis.stats import mcnemar_exact  # scipy: imported only by the command that needs it

    a, b = _execution(store_root, experiment, before, -2), _execution(store_root, experiment, after, -1)
    old, new = (load_outcomes(store_root, experiment, x)[["cell", "qid", "prediction", "em"]] for x in (a, b))
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
