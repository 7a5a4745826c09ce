"""Every table of an experiment's analysis from its outcome records, with no I/O: RWR / MRWR / MRLR and per-error RWR
per (reader, model) group, error shares, the decomposition's identity check, paired comparisons (`compute`). The
analysis flow (flows/analyze.py) writes and logs them; the Python API (ragledger/api.py) returns them as they are."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from tracking.analysis import inconsistency as an
from tracking.analysis.inconsistency import AnalysisResult
from tracking.analysis.registry import AnalysisInput, run_analyses
from tracking.analysis.stats import compare_arrays


def compute(outcomes: pd.DataFrame, experiment: str, metric: str = "em", n_resamples: int = 1000, seed: int = 0,
            pairs: bool = True) -> AnalysisResult:
    """Every table of the analysis from outcome records (no I/O)."""
    correct, cells, qids = an.correctness_matrix(outcomes, metric)
    if not qids:
        raise an.AnalysisError(f"experiment {experiment!r}: no question was answered by every cell")
    all_q = outcomes["qid"].nunique()
    used = outcomes if all_q == len(qids) else outcomes[outcomes["qid"].isin(set(qids))]
    # every group on the same questions (those every cell answered), so accuracies compare across groups
    keys = an.cell_keys(used)
    groups = an.inconsistency_by_group(correct, cells, keys)
    order = [c for g in groups for c in g.cells]
    table = pd.concat([g.table for g in groups], ignore_index=True)
    table.insert(0, "reader", [keys.at[c, "reader"] for c in order])
    table.insert(1, "model", [keys.at[c, "model"] for c in order])
    table.insert(2, "retriever", [keys.at[c, "retriever"] for c in order])
    table["retrievers"] = [len(g.cells) for g in groups for _ in g.cells]  # the group's size
    idx = {c: i for i, c in enumerate(cells)}
    cis = [an.accuracy_ci(correct[idx[c]], n_resamples, seed) for c in order]
    table.insert(5, "acc_lo", [c[1] for c in cis])
    table.insert(6, "acc_hi", [c[2] for c in cis])
    f1 = used.groupby("cell")["f1"].mean()
    table.insert(7, "f1", [float(f1.get(c, 0.0)) for c in order])

    dec = an.decompose(used)
    indicators = an.indicator_matrices(dec, order, [*an.PER_ERRORS, "correct"])
    start = 0
    mrlr_e = {e: np.full(len(order), np.nan) for e in an.PER_ERRORS}
    for g in groups:
        rows = slice(start, start + len(g.cells))
        start += len(g.cells)
        if not g.comparable:
            continue
        for e in an.PER_ERRORS:
            m, _, mrlr = an.rwr_error(indicators[e][rows])
            g.per_error_rwr[e] = pd.DataFrame(m, index=g.cells, columns=g.cells)
            mrlr_e[e][rows] = mrlr
    for e in an.PER_ERRORS:
        table[f"MRLR_{e}"] = mrlr_e[e]
    shares = an.error_shares(dec, n_resamples, seed)
    identity = an.identity_table(dec)
    paired_rows = []
    if pairs:
        em_wide = indicators["correct"]  # EM is 0/1
        for (i, a), (j, b) in itertools.combinations(enumerate(order), 2):
            paired_rows.append(compare_arrays(a, b, em_wide[i].astype(float), em_wide[j].astype(float), n_resamples,
                                              seed).as_dict())
    paired = pd.DataFrame(paired_rows)
    return AnalysisResult(experiment, len(qids), order, table, groups, dec, shares, identity, paired,
                          dropped_questions=all_q - len(qids), metric=metric,
                          tables=run_analyses(AnalysisInput(experiment, used, order, metric)))
