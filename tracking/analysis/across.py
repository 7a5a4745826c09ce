"""Each cell's accuracy across experiments: seed 002's corpus-level figure (every retriever's accuracy on NQ,
TriviaQA and WebQuestions, the retrievers sorted by their accuracy on the first) for any experiments that share
cell names, such as the experiments of one sweep (configs/papers/002_fig_mrlr.yaml). A projection of the stored
outcomes of each experiment's latest execution; no model call. EoR cells (`eor(...)`, written by `ragledger analyze`)
are left out: they are a voter over the retrievers, scored on the held-out questions only, not a retriever."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tracking.analysis.inconsistency import AnalysisError, correct_answers
from tracking.store.ledger import Ledger, ensemble_rows


def accuracy_across(store_root: str | Path, experiments: list[str], metric: str = "em") -> pd.DataFrame:
    """One row per cell, one column per experiment: accuracy in percent over that experiment's questions (empty
    where the experiment has no such cell), plus `questions` per experiment in `questions:<experiment>`. Rows are
    sorted by the first experiment's accuracy, best first, ties by name. EoR cells are not rows."""
    if len(set(experiments)) != len(experiments):
        raise AnalysisError(f"an experiment is named twice: {', '.join(experiments)}")
    accuracy, questions = {}, {}
    for name in experiments:
        outcomes = Ledger(store_root).experiment_outcomes(name)
        outcomes = outcomes[~ensemble_rows(outcomes)]
        right = pd.Series(correct_answers(outcomes, metric), index=outcomes.index, dtype=float)
        by_cell = right.groupby(outcomes["cell"].astype(str))
        accuracy[name], questions[f"questions:{name}"] = by_cell.mean() * 100, by_cell.size()
    table = pd.DataFrame(accuracy).join(pd.DataFrame(questions))
    table.index.name = "cell"
    first = experiments[0]
    order = sorted(table.index, key=lambda c: (pd.isna(table.at[c, first]), -(table.at[c, first] or 0), c))
    return table.loc[order].reset_index()
