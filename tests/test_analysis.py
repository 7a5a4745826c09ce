"""Seed 002 analyses on hand-computed cases: RWR / MRWR / MRLR, per-error RWR, decomposition identity,
error shares, and the paired comparison (McNemar, bootstrap)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from tracking.analysis import inconsistency as an
from tracking.analysis.stats import compare_cells, mcnemar_exact, paired_bootstrap_ci


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
    # identity.parquet names seed 002's per-retriever retrieval error: 3 of the 8 contexts lack the answer
    (row,) = an.identity_table(an.decompose(HAND)).to_dict("records")
    assert row["retriever_error_pct"] == 37.5 and row["p_re"] == 3 / 8 and row["holds"]


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


def test_one_bootstrap_for_every_ci():
    """The accuracy CI and the paired CI of ΔEM are tracking.analysis.metrics.bootstrap_ci (the readers table's EM CI), so a
    cell has one CI wherever it is shown. It does not depend on the order of the questions or on the chunking, and
    it matches resampling the questions' indices in distribution."""
    from tracking.analysis import metrics
    from tracking.analysis.metrics import bootstrap_ci

    rng = np.random.default_rng(5)
    v = (rng.random(400) < 0.3).astype(float)
    mean, lo, hi = an.accuracy_ci(v, n_resamples=4000)
    assert (lo, hi) == bootstrap_ci(v, n_resamples=4000) and mean == v.mean()
    a, b = (rng.random(400) < 0.5).astype(float), (rng.random(400) < 0.4).astype(float)
    assert paired_bootstrap_ci(a, b, n_resamples=4000) == bootstrap_ci(a - b, n_resamples=4000)
    whole = bootstrap_ci(v, n_resamples=999)
    saved = metrics.BOOTSTRAP_CHUNK
    try:
        metrics.BOOTSTRAP_CHUNK = 14  # two distinct values: chunks of 7 resamples, the last one shorter
        assert bootstrap_ci(v, n_resamples=999) == whole
    finally:
        metrics.BOOTSTRAP_CHUNK = saved
    assert bootstrap_ci(rng.permutation(v), n_resamples=999) == whole
    idx = np.random.default_rng(1).integers(0, len(v), size=(4000, len(v)))
    by_index = np.quantile(v[idx].mean(axis=1), [0.025, 0.975])
    assert abs(lo - by_index[0]) < 0.015 and abs(hi - by_index[1]) < 0.015


# 2 readers × 3 retrievers × 5 questions (EM per question q1..q5). Within reader r1, retriever a is right
# wherever b or c is; reader r2 gets q4 and q5 right, which r1 never does.
TWO_READERS = {
    ("a", "r1"): [1, 1, 1, 0, 0], ("b", "r1"): [1, 1, 0, 0, 0], ("c", "r1"): [1, 0, 1, 0, 0],
    ("a", "r2"): [0, 0, 0, 1, 1], ("b", "r2"): [1, 0, 0, 1, 0], ("c", "r2"): [0, 0, 1, 0, 1],
}


def two_reader_outcomes() -> pd.DataFrame:
    rows = []
    for (retriever, reader), ems in TWO_READERS.items():
        for n, em in enumerate(ems, start=1):
            rows.append(outcome(f"{retriever} · {reader} · m", f"q{n}", em) | {"retriever": retriever, "reader": reader,
                                                                            "model": "m"})
    return pd.DataFrame(rows)


def test_inconsistency_is_computed_per_reader_and_model_group():
    """Seed 002 holds the reader and the LM fixed and varies the retriever: one table per (reader, model).

    Reader r1 (failures: a {q4,q5}, b {q3,q4,q5}, c {q2,q4,q5}):
      RWR(a→b) = |{q4,q5} ∩ b right {q1,q2}| / 2 = 0,  RWR(a→c) = |{q4,q5} ∩ {q1,q3}| / 2 = 0
      RWR(b→a) = |{q3,q4,q5} ∩ a right {q1,q2,q3}| / 3 = 1/3,  RWR(b→c) = |{q3,q4,q5} ∩ {q1,q3}| / 3 = 1/3
      RWR(c→a) = |{q2,q4,q5} ∩ {q1,q2,q3}| / 3 = 1/3,  RWR(c→b) = |{q2,q4,q5} ∩ {q1,q2}| / 3 = 1/3
      MRLR: a 0 (a is never beaten: the paper's "consistently outperforms"), b (1/3+1/3)/2 = 1/3, c 1/3
      MRWR: a (1/3+1/3)/2 = 1/3, b (0+1/3)/2 = 1/6, c (0+1/3)/2 = 1/6
    Reader r2 (failures: a {q1,q2,q3}, b {q2,q3,q5}, c {q1,q2,q4}; right: a {q4,q5}, b {q1,q4}, c {q3,q5}):
      RWR(a→b) = |{q1}| / 3 = 1/3, RWR(a→c) = |{q3}| / 3 = 1/3
      RWR(b→a) = |{q5}| / 3 = 1/3, RWR(b→c) = |{q3,q5}| / 3 = 2/3
      RWR(c→a) = |{q4}| / 3 = 1/3, RWR(c→b) = |{q1,q4}| / 3 = 2/3
      MRLR: a (1/3+1/3)/2 = 1/3, b (1/3+2/3)/2 = 1/2, c (1/3+2/3)/2 = 1/2
      MRWR: a (1/3+1/3)/2 = 1/3, b (1/3+2/3)/2 = 1/2, c (1/3+2/3)/2 = 1/2
    Pooled over all six cells (the old computation), a·r1 would get MRLR (0 + 0 + RWR to a·r2 {q4,q5}: 1
      + b·r2 {q4}: 1/2 + c·r2 {q5}: 1/2) / 5 = 2/5, although no retriever of its own reader ever beats it.
    """
    from tracking.analysis.inconsistency import per_error_long, rwr_long
    from tracking.analysis.tables import compute

    df = two_reader_outcomes()
    res = compute(df, "two-readers", n_resamples=50)
    assert [(g.reader, g.model, g.retrievers) for g in res.groups] == [("r1", "m", ["a", "b", "c"]),
                                                                      ("r2", "m", ["a", "b", "c"])]
    assert [g.label for g in res.groups] == ["reader r1 · model m", "reader r2 · model m"]
    r1, r2 = res.groups
    np.testing.assert_allclose(r1.rwr.to_numpy(), [[0, 0, 0], [1 / 3, 0, 1 / 3], [1 / 3, 1 / 3, 0]])
    np.testing.assert_allclose(r2.rwr.to_numpy(), [[0, 1 / 3, 1 / 3], [1 / 3, 0, 2 / 3], [1 / 3, 2 / 3, 0]])
    t = res.inconsistency.set_index(["reader", "retriever"])
    np.testing.assert_allclose(t.loc[[("r1", "a"), ("r1", "b"), ("r1", "c")], "MRLR"], [0, 1 / 3, 1 / 3])
    np.testing.assert_allclose(t.loc[[("r1", "a"), ("r1", "b"), ("r1", "c")], "MRWR"], [1 / 3, 1 / 6, 1 / 6])
    np.testing.assert_allclose(t.loc[[("r2", "a"), ("r2", "b"), ("r2", "c")], "MRLR"], [1 / 3, 1 / 2, 1 / 2])
    np.testing.assert_allclose(t.loc[[("r2", "a"), ("r2", "b"), ("r2", "c")], "MRWR"], [1 / 3, 1 / 2, 1 / 2])
    assert (t["retrievers"] == 3).all() and list(res.inconsistency["reader"]) == ["r1"] * 3 + ["r2"] * 3
    # the pooled computation differs: what this test guards against
    correct, cells, _ = an.correctness_matrix(df)
    _, _, pooled_mrlr = an.rwr(correct)
    assert pooled_mrlr[cells.index("a · r1 · m")] == pytest.approx(2 / 5)
    # the long tables carry their group and hold no cross-group pair
    long = rwr_long(res.groups)
    assert list(long.columns) == ["reader", "model", "i", "j", "rwr"] and len(long) == 2 * 9
    assert (long["i"].str.split(" · ").str[1] == long["reader"]).all()
    assert (long["j"].str.split(" · ").str[1] == long["reader"]).all()
    pe = per_error_long(res.groups)
    assert list(pe.columns) == ["reader", "model", "error", "i", "j", "rwr"] and set(pe["reader"]) == {"r1", "r2"}
    # gold is always in context here, so every failure is an extraction error (EE = wrong, RWR_EE = RWR)
    # and no cell ever makes RE (RWR_RE = 0 by the empty-set convention)
    for g in res.groups:
        pd.testing.assert_frame_equal(g.per_error_rwr["EE"], g.rwr)
    assert (pe[pe["error"] == "RE"]["rwr"] == 0).all()


def test_a_retriever_alone_in_its_group_gets_no_inconsistency_table():
    from tracking.analysis.inconsistency import rwr_long
    from tracking.analysis.tables import compute

    df = two_reader_outcomes()
    df = df[(df["reader"] == "r1") | (df["retriever"] == "a")]  # r2 keeps only retriever a
    res = compute(df, "lone", n_resamples=50)
    r1, r2 = res.groups
    assert r1.comparable and not r2.comparable and r2.rwr is None and r2.per_error_rwr == {}
    row = res.inconsistency.set_index("cell").loc["a · r2 · m"]
    assert row["accuracy"] == 2 / 5 and np.isnan(row["MRLR"]) and np.isnan(row["MRWR"]) and np.isnan(row["MRLR_RE"])
    np.testing.assert_allclose(res.inconsistency.set_index("cell").loc[["a · r1 · m", "b · r1 · m", "c · r1 · m"], "MRLR"],
                               [0, 1 / 3, 1 / 3])  # r1 unchanged by r2's lone retriever
    assert set(rwr_long(res.groups)["reader"]) == {"r1"}


def test_cell_keys_from_columns_or_cell_names():
    df = two_reader_outcomes()
    k = an.cell_keys(df)
    assert k.loc["b · r2 · m"].tolist() == ["b", "r2", "m"]
    k2 = an.cell_keys(df.drop(columns=["retriever", "reader", "model"]))
    pd.testing.assert_frame_equal(k.sort_index(), k2.sort_index(), check_like=True)
    assert an.cell_keys(pd.DataFrame({"cell": ["A"]})).loc["A"].tolist() == ["A", "", ""]
