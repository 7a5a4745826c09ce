"""Seed 002 analyses on hand-computed cases: RWR / MRWR / MRLR, per-error RWR, decomposition identity,
error shares, and the paired comparison (McNemar, bootstrap)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from tracking import analysis as an
from tracking.stats import compare_cells, mcnemar_exact, paired_bootstrap_ci


def test_rwr_hand_computed_with_a_cell_never_wrong():
    c = np.array([[1, 1, 1, 1],   # A never fails
                  [1, 0, 0, 1],   # B fails q2, q3
                  [0, 1, 0, 1]], dtype=bool)  # C fails q1, q3
    m, mrwr, mrlr = an.rwr(c)
    np.testing.assert_allclose(m, [[0, 0, 0], [1, 0, 0.5], [1, 0.5, 0]])
    np.testing.assert_allclose(mrlr, [0, 0.75, 0.75])  # A is never beaten: MRLR 0 (seed 002)
    np.testing.assert_allclose(mrwr, [1, 0.25, 0.25])


def test_rwr_empty_failure_sets_and_all_wrong_cells_are_zero_not_nan():
    m, _, mrlr = an.rwr(np.array([[0, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=bool))
    assert not np.isnan(m).any()
    np.testing.assert_allclose(m, [[0, 0, 1], [0, 0, 1], [0, 0, 0]])
    np.testing.assert_allclose(mrlr, [0.5, 0.5, 0])
    m1, mrwr1, mrlr1 = an.rwr(np.array([[1, 0]], dtype=bool))  # one cell: no j != i
    assert m1.tolist() == [[0.0]] and mrlr1.tolist() == [0.0] and mrwr1.tolist() == [0.0]


def test_ties_sort_by_name_and_accuracy_descending():
    c = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 1]], dtype=bool)
    table, matrix = an.inconsistency_table(c, ["zeta", "alpha", "best"])
    assert list(table["cell"]) == ["best", "alpha", "zeta"]
    assert list(matrix.index) == list(matrix.columns) == ["best", "alpha", "zeta"]
    assert matrix.loc["alpha", "zeta"] == 0.5 and matrix.loc["zeta", "alpha"] == 0.5


def test_per_error_rwr():
    e = np.array([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)  # error e of three cells
    m, _, mrlr = an.rwr_error(e)
    # share of i's errors that j avoids; a cell that never errs has 0
    np.testing.assert_allclose(m, [[0, 0.5, 1], [0, 0, 1], [0, 0, 0]])
    np.testing.assert_allclose(mrlr, [0.75, 0.5, 0])


def outcome(cell, qid, em, unknown=False, gic=True, error_type=None, f1=None, prediction="x"):
    if error_type is None:
        error_type = "correct" if em and gic else "lucky_guess" if em else "abstention" if unknown else \
            "retrieval_failure" if not gic else "extraction_error"
    return {"cell": cell, "qid": qid, "em": float(em), "f1": float(em if f1 is None else f1), "is_unknown": unknown,
            "gold_in_context": gic, "error_type": error_type, "prediction": prediction, "semantic_match": None}


HAND = pd.DataFrame([
    outcome("A", "q1", 1, gic=True),                                   # correct
    outcome("A", "q2", 1, gic=False),                                  # lucky guess
    outcome("A", "q3", 0, gic=False),                                  # retrieval failure
    outcome("A", "q4", 0, gic=True, error_type="extraction_error"),    # EE
    outcome("A", "q5", 0, gic=True, error_type="hallucination_error"),  # HE
    outcome("A", "q6", 0, unknown=True, gic=True),                     # abstention without RE
    outcome("A", "q7", 0, unknown=True, gic=False),                    # abstention with RE
    outcome("A", "q8", 0, gic=True, error_type="hallucination_error"),  # HE
])


def test_decomposition_classes_and_both_accountings():
    d = an.decompose(HAND).set_index("qid")
    assert d["error_type"].tolist() == ["correct", "lucky_guess", "retrieval_failure", "extraction_error",
                                        "hallucination_error", "abstention", "abstention", "hallucination_error"]
    assert d["RE"].tolist() == [False, True, True, False, False, False, True, False]
    assert d["LG"].sum() == 1 and d["EE"].sum() == 1 and d["HE"].sum() == 2 and d["abstain"].sum() == 2
    assert d["RF"].sum() == 1  # abstention with RE is not a retrieval failure in the own-class accounting
    assert d["HE_literal"].sum() == 3  # literal: the abstention without RE is a hallucination
    (chk,) = an.identity_checks(an.decompose(HAND))
    # P(fail)=6/8, P(RE)=3/8, P(LG)=1/8, P(EE)=1/8, P(HE_literal)=3/8: 3/8 - 1/8 + 1/8 + 3/8 = 6/8
    assert chk.p_fail == 6 / 8 and chk.p_re == 3 / 8 and chk.p_he_literal == 3 / 8
    assert chk.holds and chk.residual_literal == 0 and chk.residual_own_class == 0


def test_error_shares_sum_to_one_with_cis():
    s = an.error_shares(an.decompose(HAND), n_resamples=1000, seed=0)
    assert s["share"].sum() == pytest.approx(1.0)
    hal = s.set_index("error_type").loc["hallucination_error"]
    assert hal["share"] == 2 / 8 and hal["lo"] <= 2 / 8 <= hal["hi"] and hal["hi"] > hal["lo"]
    again = an.error_shares(an.decompose(HAND), n_resamples=1000, seed=0)
    pd.testing.assert_frame_equal(s, again)  # seeded


def test_correctness_matrix_uses_common_questions():
    df = pd.DataFrame([outcome("A", "q1", 1), outcome("A", "q2", 0), outcome("B", "q1", 0)])
    c, cells, qids = an.correctness_matrix(df)
    assert cells == ["A", "B"] and qids == ["q1"] and c.tolist() == [[True], [False]]


def test_mcnemar_known_table():
    # discordant pairs 10 vs 2: exact two-sided p = 2 * P(X <= 2 | n=12, 1/2) = 2 * 79/4096
    assert mcnemar_exact(10, 2) == pytest.approx(2 * 79 / 4096)
    assert mcnemar_exact(10, 2) == pytest.approx(binomtest(2, 12, 0.5).pvalue)
    assert mcnemar_exact(0, 0) == 1.0


def test_compare_cells_flip_table_and_paired_ci():
    rows = []
    pattern = [(1, 0)] * 10 + [(0, 1)] * 2 + [(1, 1)] * 5 + [(0, 0)] * 3
    for n, (a, b) in enumerate(pattern):
        rows += [outcome("A", f"q{n}", a), outcome("B", f"q{n}", b)]
    r = compare_cells(pd.DataFrame(rows), "A", "B")
    assert (r.won, r.lost, r.both_right, r.both_wrong, r.questions) == (10, 2, 5, 3, 20)
    assert r.diff == pytest.approx(0.4) and r.diff_lo <= 0.4 <= r.diff_hi and r.diff_lo > 0
    assert r.mcnemar_p == pytest.approx(2 * 79 / 4096)
    lo, hi = paired_bootstrap_ci(np.ones(5), np.ones(5))
    assert lo == hi == 0.0


def test_binary_bootstraps_match_index_resampling():
    """The multinomial/binomial shortcuts draw from the same distribution as resampling questions."""
    from tracking.metrics import bootstrap_ci

    rng = np.random.default_rng(5)
    v = (rng.random(400) < 0.3).astype(float)
    _, lo, hi = an.accuracy_ci(v, n_resamples=4000)
    lo2, hi2 = bootstrap_ci(v, n_resamples=4000)
    assert abs(lo - lo2) < 0.015 and abs(hi - hi2) < 0.015
    a, b = (rng.random(400) < 0.5).astype(float), (rng.random(400) < 0.4).astype(float)
    lo, hi = paired_bootstrap_ci(a, b, n_resamples=4000)
    d = a - b
    lo2, hi2 = bootstrap_ci(d + 0.5, n_resamples=4000)  # shifted off {-1,0,1}: the index-resampling path
    assert abs(lo - (lo2 - 0.5)) < 0.02 and abs(hi - (hi2 - 0.5)) < 0.02
