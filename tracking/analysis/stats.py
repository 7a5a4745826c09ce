"""Paired comparison of two cells on the same questions: flip table, exact McNemar test, paired
bootstrap CI of the EM difference. Pure functions over stored outcomes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from tracking.analysis.inconsistency import AnalysisError
from tracking.analysis.metrics import bootstrap_ci


@dataclass(frozen=True)
class PairedComparison:
    cell_a: str
    cell_b: str
    questions: int
    won: int  # A right, B wrong
    lost: int  # A wrong, B right
    both_right: int
    both_wrong: int
    em_a: float
    em_b: float
    diff: float  # EM(A) - EM(B), as a fraction
    diff_lo: float
    diff_hi: float
    mcnemar_p: float

    def as_dict(self) -> dict:
        return asdict(self)


def mcnemar_exact(won: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of won vs. lost discordant pairs at p = 1/2.
    With no discordant pair the two cells cannot be told apart: p = 1."""
    n = won + lost
    if n == 0:
        return 1.0
    return float(binomtest(won, n, 0.5, alternative="two-sided").pvalue)


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, n_resamples: int = 1000, seed: int = 0,
                        alpha: float = 0.05) -> tuple[float, float]:
    """Percentile CI of mean(a) - mean(b), resampling questions (pairs kept together): the bootstrap of the
    per-question differences (tracking.analysis.metrics.bootstrap_ci)."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(d) == 0:
        return (0.0, 0.0)
    return bootstrap_ci(d, n_resamples, seed, alpha)


def compare_cells(outcomes: pd.DataFrame, cell_a: str, cell_b: str, n_resamples: int = 1000, seed: int = 0) -> PairedComparison:
    """Flip table, exact McNemar p and paired-bootstrap CI of EM(A) − EM(B) on the questions both answered."""
    a = outcomes[outcomes["cell"] == cell_a].drop_duplicates("qid").set_index("qid")["em"]
    b = outcomes[outcomes["cell"] == cell_b].drop_duplicates("qid").set_index("qid")["em"]
    for name, s in ((cell_a, a), (cell_b, b)):
        if s.empty:
            raise AnalysisError(f"no outcomes for cell {name!r}")
    common = a.index.intersection(b.index)
    if len(common) == 0:
        raise AnalysisError(f"cells {cell_a!r} and {cell_b!r} share no question")
    return compare_arrays(cell_a, cell_b, a.loc[common].to_numpy(dtype=float), b.loc[common].to_numpy(dtype=float),
                          n_resamples, seed)


def compare_arrays(cell_a: str, cell_b: str, ea: np.ndarray, eb: np.ndarray, n_resamples: int = 1000,
                   seed: int = 0) -> PairedComparison:
    """The paired comparison from two aligned EM arrays (same questions, same order)."""
    ea, eb = np.asarray(ea, dtype=float), np.asarray(eb, dtype=float)
    ra, rb = ea >= 1.0, eb >= 1.0
    won, lost = int((ra & ~rb).sum()), int((~ra & rb).sum())
    lo, hi = paired_bootstrap_ci(ea, eb, n_resamples, seed)
    return PairedComparison(cell_a, cell_b, len(ea), won, lost, int((ra & rb).sum()), int((~ra & ~rb).sum()),
                            float(ea.mean()), float(eb.mean()), float(ea.mean() - eb.mean()), lo, hi,
                            mcnemar_exact(won, lost))


def flipped_questions(outcomes: pd.DataFrame, cell_a: str, cell_b: str) -> pd.DataFrame:
    """Questions where exactly one of the two cells is right: qid, winner, both predictions."""
    a = outcomes[outcomes["cell"] == cell_a].drop_duplicates("qid").set_index("qid")
    b = outcomes[outcomes["cell"] == cell_b].drop_duplicates("qid").set_index("qid")
    j = a[["em", "prediction"]].join(b[["em", "prediction"]], lsuffix="_a", rsuffix="_b", how="inner")
    flip = (j["em_a"] >= 1.0) != (j["em_b"] >= 1.0)
    j = j[flip].copy()
    j["winner"] = np.where(j["em_a"] >= 1.0, "A", "B")
    return j.reset_index()[["qid", "winner", "prediction_a", "prediction_b"]].sort_values(["winner", "qid"])
