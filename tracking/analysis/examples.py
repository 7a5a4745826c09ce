"""Per-example views of an experiment's latest execution: its errors with the question and gold answers beside each
(`ragledger errors`), the questions every cell gets wrong (`ragledger hardest`), and the experiment holding two named
cells (`ragledger flips`). The command line prints them and the Python API (ragledger/api.py) returns them; a bad
input is an AnalysisError whose message is the command's `error:` line."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from core.cell import resolve_cell
from schemas.records import ERROR_TYPES
from tracking.analysis.inconsistency import AnalysisError
from tracking.store.ledger import Ledger, ensemble_rows

ERROR_COLUMNS = ["qid", "cell", "error_type", "prediction", "em", "f1", "gold_in_context", "gold", "question"]


def _with_question(out: pd.DataFrame, q: pd.DataFrame, at: int | None = None) -> pd.DataFrame:
    """`out` (rows with a qid) with each question's gold answers and text, appended or inserted at `at`."""
    gold = [" | ".join(q.at[x, "answers"]) if x in q.index else "" for x in out["qid"]]
    text = [q.at[x, "question"] if x in q.index else "" for x in out["qid"]]
    if at is None:
        out["gold"], out["question"] = gold, text
    else:
        out.insert(at, "question", text)
        out.insert(at + 1, "gold", gold)
    return out


def error_examples(store_root: str | Path, experiment: str, cell: str | None = None, error_type: str | None = None,
                   include_correct: bool = False) -> pd.DataFrame:
    """The latest execution's outcomes of one error type (default: every one but `correct`, unless `include_correct`),
    of one cell (words naming one) or all: one row each (ERROR_COLUMNS), by question and cell."""
    if error_type is not None and error_type not in ERROR_TYPES:
        raise AnalysisError(f"--error-type must be one of {', '.join(ERROR_TYPES)}, got {error_type!r}")
    ledger = Ledger(store_root)
    try:
        df = ledger.experiment_outcomes(experiment)
        if cell:
            df = df[df["cell"] == resolve_cell(cell, sorted(df["cell"].unique()))]
    except ValueError as exc:  # LedgerError, or a cell naming none or several
        raise AnalysisError(str(exc)) from None
    if error_type:
        df = df[df["error_type"] == error_type]
    elif not include_correct:
        df = df[df["error_type"] != "correct"]
    out = df[["qid", "cell", "error_type", "prediction", "em", "f1", "gold_in_context"]].copy()
    out = _with_question(out, ledger.questions(experiment))
    return out.sort_values(["qid", "cell"]).reset_index(drop=True)


def hardest_questions(store_root: str | Path, experiment: str) -> tuple[pd.DataFrame, int, int]:
    """The questions every cell of the latest execution gets wrong (EM), with each cell's error type (qid, question,
    gold, error_types); and how many questions and cells there were. EoR cells answer held-out questions only and
    choose among their members' answers: they are left out."""
    ledger = Ledger(store_root)
    df = ledger.experiment_outcomes(experiment)  # a LedgerError names what is missing
    df = df[~ensemble_rows(df)]
    n_cells = df["cell"].nunique()
    per_q = df.groupby("qid").agg(cells=("cell", "nunique"), right=("em", lambda s: int((s >= 1).sum())))
    hard = per_q[(per_q["right"] == 0) & (per_q["cells"] == n_cells)].index
    sub = df[df["qid"].isin(hard)]
    types = sub.groupby("qid")["error_type"].agg(lambda s: ", ".join(f"{k}×{v}" for k, v in s.value_counts().items()))
    out = _with_question(types.rename("error_types").reset_index(), ledger.questions(experiment), at=1)
    return out, len(per_q), n_cells


def cell_pair(store_root: str | Path, cell_a: str, cell_b: str,
              experiment: str | None = None) -> tuple[str, pd.DataFrame, str, str]:
    """(experiment, its latest execution's outcomes, cell A, cell B) for two cells named by words: in `experiment`,
    or in the one experiment of the store that holds both."""
    ledger = Ledger(store_root)
    names = [experiment] if experiment else ledger.experiments()
    found, ambiguous = [], []
    for name in names:
        try:
            df = ledger.experiment_outcomes(name)
            cells = sorted(df["cell"].unique())
            found.append((name, df, resolve_cell(cell_a, cells), resolve_cell(cell_b, cells)))
        except ValueError as exc:  # LedgerError: no outcomes; a cell naming none or several
            if experiment:
                raise AnalysisError(str(exc)) from None
            if " matches " in str(exc):  # words naming several cells: more words name one
                ambiguous.append(f"in {name}: {exc}")
    if not found:
        hint = f" ({ambiguous[0]})" if ambiguous else ""
        raise AnalysisError(f"no experiment in {store_root} holds both {cell_a!r} and {cell_b!r}{hint}")
    if len(found) > 1:
        raise AnalysisError(f"both cells exist in experiments {', '.join(f[0] for f in found)}; pick one with --experiment")
    name, df, a, b = found[0]
    if a == b:
        raise AnalysisError(f"{cell_a!r} and {cell_b!r} name the same cell {a!r}")
    return name, df, a, b
