"""EoR (seed 002) over stored outcomes: the fitted voter finds the better retriever on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest

from tracking.analysis import eor
from tracking.analysis.eor_cells import eor_cells
from tracking.store.events import EventStore, event_id, new_events


def outcome_row(experiment, retriever, qid, prediction, gold, reader="concatenation", model="m"):
    cell = f"{retriever} · {reader} · {model}"
    right = prediction == gold
    return {"event_id": event_id("outcomes", experiment, cell, qid), "cell": cell, "qid": qid, "retriever": retriever,
            "reader": reader, "model": model, "prediction": prediction, "em": float(right), "f1": float(right),
            "semantic_match": None, "is_unknown": prediction == "unknown", "gold_in_context": True,
            "pool_has_correct": None, "error_type": "correct" if right else "extraction_error",
            "tokens_in": 10, "tokens_out": 2, "llm_calls": 1}


def synthetic_store(root, n=240, seed=1):
    """`good` is right 90% of the time; `bad1` and `bad2` agree on the same wrong answer 70% of the time,
    so an unweighted vote follows them and a fitted one must learn to trust `good`."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        q, gold = f"q{k}", f"answer {k}"
        rows.append(outcome_row("syn", "good", q, gold if rng.random() < 0.9 else f"wrong {k}", gold))
        shared = rng.random() < 0.7
        for b in ("bad1", "bad2"):
            pred = f"shared wrong {k}" if shared else (gold if rng.random() < 0.5 else f"{b} wrong {k}")
            rows.append(outcome_row("syn", b, q, pred, gold))
    store = EventStore(root)
    store.write("outcomes", new_events("outcomes", "syn", rows))
    return store.read("outcomes", "syn")


def test_split_is_deterministic_and_roughly_half():
    flags = [eor.is_train(f"q{k}") for k in range(2000)]
    assert flags == [eor.is_train(f"q{k}") for k in range(2000)]
    assert 0.45 < np.mean(flags) < 0.55


def test_unweighted_vote_follows_the_agreeing_bad_retrievers():
    s = eor.similarity_tensor([["a", "b", "b"]], np.zeros((1, 3), dtype=bool), ("em", "f1"))
    pick = eor.choose(s, np.zeros((1, 3), dtype=bool), np.array([0.3, 0.3]), np.array([0.3, 0.3, 0.3]), "mean")
    assert pick[0] in (1, 2)
    # β below 0.1 drops a retriever: neither candidate nor voter
    pick = eor.choose(s, np.zeros((1, 3), dtype=bool), np.array([0.3, 0.3]), np.array([0.3, 0.05, 0.05]), "mean")
    assert pick[0] == 0


@pytest.mark.parametrize("pooling", eor.POOLINGS)
def test_every_pooling_prefers_the_agreeing_answer(pooling):
    s = eor.similarity_tensor([["paris", "Paris", "london"]], np.zeros((1, 3), dtype=bool), ("em", "f1"))
    pick = eor.choose(s, np.zeros((1, 3), dtype=bool), np.array([0.5, 0.5]), np.full(3, 0.5), pooling)
    assert pick[0] in (0, 1)


def test_unknown_answers_do_not_vote_for_each_other():
    unk = np.array([[True, True, False]])
    s = eor.similarity_tensor([["unknown", "unknown", "Paris"]], unk, ("em",))
    assert s[0, 0, 0, 1] == 0.0
    assert eor.choose(s, unk, np.array([0.5]), np.full(3, 0.5), "mean")[0] == 2


def test_fit_recovers_the_better_retriever(tmp_path):
    outcomes = synthetic_store(tmp_path)
    out, info = eor_cells(tmp_path, "syn", outcomes, metrics=("em", "f1"))
    (cell,) = info["cells"]
    assert cell == "eor(bad1,bad2,good,pooling=mean) · concatenation · m"
    fit = info["fits"][cell]
    beta = fit["beta"]
    assert beta["good"] > beta["bad1"] and beta["good"] > beta["bad2"]
    assert all(0 <= v <= eor.UPPER for v in [*beta.values(), *fit["w"].values()])
    test = set(info["test_qids"])
    assert set(out["qid"]) == test and not test & set(info["train_qids"])
    good = outcomes[(outcomes["retriever"] == "good") & outcomes["qid"].isin(test)]["em"].mean()
    bad = outcomes[(outcomes["retriever"] == "bad1") & outcomes["qid"].isin(test)]["em"].mean()
    # held-out accuracy of EoR matches the good retriever's, far above the bad ones'
    assert out["em"].mean() >= good - 0.02 and out["em"].mean() > bad + 0.3
    # its answers were written to the store as a cell like any other
    stored = EventStore(tmp_path).read("outcomes", "syn")
    assert (stored["cell"] == cell).sum() == len(test)


def test_cosine_metric_uses_the_bundled_embedding_model():
    s = eor.similarity_tensor([["the Eiffel Tower", "Eiffel Tower in Paris", "a banana"]], np.zeros((1, 3), dtype=bool),
                              ("cosine",))
    assert s[0, 0, 0, 1] > s[0, 0, 0, 2]
    assert s[0, 0, 0, 0] == pytest.approx(1.0, abs=1e-5)


def test_nli_similarity_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no PyPI package ships a usable NLI model offline"):
        eor.similarity_tensor([["Paris", "the capital of France"]], np.zeros((1, 2), dtype=bool), ("em", "nli"))


def test_fit_on_a_separate_training_experiment(tmp_path):
    outcomes = synthetic_store(tmp_path, n=120, seed=1)  # experiment "syn"
    train = synthetic_store(tmp_path / "train", n=120, seed=2)
    out, info = eor_cells(tmp_path, "syn", outcomes, metrics=("em", "f1"), train_outcomes=train, train_experiment="syn-train")
    (cell,) = info["cells"]
    assert info["split"] == "trained on experiment syn-train"
    assert info["fits"][cell]["train"] == 120 and len(out) == 120  # evaluated on every question of "syn"
    good = outcomes[outcomes["retriever"] == "good"]["em"].mean()
    assert out["em"].mean() >= good - 0.02


def test_analysis_flow_reports_eor_as_a_cell_on_held_out_questions(tmp_path):
    from flows.analyze import run_analysis

    synthetic_store(tmp_path, n=120)
    res = run_analysis(tmp_path, "syn", log_mlflow=False)
    (cell,) = res.eor["cells"]
    summary = res.eor["summaries"][cell]
    assert summary["best_single"] == "good · concatenation · m"
    assert summary["eor_em"] >= summary["best_single_em"] - 0.02
    assert summary["held_out_questions"] == len(res.eor["test_qids"]) < 120
    eres = res.eor_results[cell]
    assert cell in eres.cells and eres.identity["holds"].all()  # every analysis applies to the EoR cell
    names = {str(f.relative_to(tmp_path / "analysis" / "syn")) for f in res.files}
    assert {"eor1/rwr_heatmap.png", "eor1/inconsistency.parquet", "eor_weights.parquet", "eor_weights.png", "eor.json",
            "report.html"} <= names
    report = (tmp_path / "analysis" / "syn" / "report.html").read_text()
    assert "Ensemble of Retrievers" in report and "eor_weights.png" in report  # the weights figure is among the plots
    png = (tmp_path / "analysis" / "syn" / "eor_weights.png").read_bytes()
    assert png.startswith(b"\x89PNG") and res.pngs["eor_weights.png"] == png


# Five retrievers r1..r5 (EoR's member order: r1 is right on 3 of the 4 patterns, r2-r4 on 1, r5 on none). In A the
# correct answer is held by r2, r3, r4; in B1-B3 r1 alone is right while the other four split into two agreeing
# pairs, a different pairing each time.
POOLING_PATTERNS = {  # pattern -> (answers of r1..r5, gold)
    "A": (("z", "x", "x", "x", "w"), "x"),
    "B1": (("x", "y", "y", "v", "v"), "x"),
    "B2": (("x", "y", "v", "y", "v"), "x"),
    "B3": (("x", "v", "y", "y", "v"), "x"),
}


def pooling_store(root, experiment: str, copies: int = 1):
    rows = []
    for n in range(copies):
        for name, (answers, gold) in POOLING_PATTERNS.items():
            q = f"{name}-{n}"
            for r, a in zip(("r1", "r2", "r3", "r4", "r5"), answers, strict=True):
                rows.append(outcome_row(experiment, r, q, f"{a} {q}", f"{gold} {q}"))  # answers never match across questions
    store = EventStore(root)
    store.write("outcomes", new_events("outcomes", experiment, rows))
    return store.read("outcomes", experiment)


def test_mean_and_majority_pooling_pick_different_answers_by_hand():
    """B1 with equal weights (EM only, β 0.3 each; 4 voters per answer, majority needs ⌈4/2⌉ = 2 agreeing):
    mean pools r1 0 and r2..r5 1/4, so it takes r2's "y" (the first maximum); majority pools every answer 0 (each
    agrees with one other only), so all scores tie at 0 and it takes r1's "x", the correct one."""
    answers, _ = POOLING_PATTERNS["B1"]
    unk = np.zeros((1, 5), dtype=bool)
    s = eor.similarity_tensor([list(answers)], unk, ("em",))
    w, beta = np.array([0.3]), np.full(5, 0.3)
    assert eor.choose(s, unk, w, beta, "mean")[0] == 1
    assert eor.choose(s, unk, w, beta, "majority")[0] == 0
    assert eor.choose(s, unk, w, beta, "max")[0] == eor.choose(s, unk, w, beta, "plurality")[0] == 1


def test_eor_pooling_is_mean_by_default_and_searched_only_when_asked(tmp_path):
    """Mean cannot get A and all of B1-B3 right under any (w, β): B right needs r1 active and no two active
    retrievers of r2..r5 agreeing (else a pair outscores r1's lone answer), A right needs two of r2, r3, r4 active
    and agreeing, and B1-B3 forbid each of those pairs (w = 0 leaves r1's answer everywhere: A wrong). Majority gets
    all four right with the equal weights of the fit's first start (see the hand-computed case above; in A, r2-r4
    are a majority). So `search` keeps majority, and the default keeps mean."""
    held_out = pooling_store(tmp_path, "pool")
    train = pooling_store(tmp_path / "train", "pool-fit")

    out, info = eor_cells(tmp_path, "pool", held_out, metrics=("em",), train_outcomes=train, train_experiment="pool-fit")
    (cell,) = info["cells"]
    assert cell == "eor(r1,r2,r3,r4,r5,pooling=mean) · concatenation · m" and info["pooling"] == "mean"
    fit = info["fits"][cell]
    assert fit["pooling"] == fit["pooling_option"] == "mean" and fit["train_accuracy"] <= 0.75
    assert out["em"].mean() <= 0.75  # some held-out pattern is answered wrongly

    s_out, s_info = eor_cells(tmp_path, "pool", held_out, metrics=("em",), train_outcomes=train,
                                  train_experiment="pool-fit", pooling="search")
    (s_cell,) = s_info["cells"]
    assert s_cell == "eor(r1,r2,r3,r4,r5,pooling=search:majority) · concatenation · m"
    s_fit = s_info["fits"][s_cell]
    assert (s_fit["pooling"], s_fit["pooling_option"], s_fit["train_accuracy"]) == ("majority", "search", 1.0)
    assert s_out["em"].mean() == 1.0
    # the two poolings answered differently, and both answers are kept as separate cells
    both = out.set_index("qid")["prediction"].compare(s_out.set_index("qid")["prediction"])
    assert len(both) >= 1
    stored = EventStore(tmp_path).read("outcomes", "pool")
    assert {cell, s_cell} <= set(stored["cell"])

    # a pooling fixed by name is used as named, without the search
    m_out, m_info = eor_cells(tmp_path, "pool", held_out, metrics=("em",), train_outcomes=train,
                                  train_experiment="pool-fit", pooling="majority")
    assert m_info["cells"] == ["eor(r1,r2,r3,r4,r5,pooling=majority) · concatenation · m"]
    assert m_out["em"].mean() == 1.0
    with pytest.raises(ValueError, match="EoR pooling must be one of mean, max, majority, plurality, search"):
        eor_cells(tmp_path, "pool", held_out, metrics=("em",), pooling="median")


def test_analyze_command_eor_pooling_option(tmp_path, prefect_harness):
    from typer.testing import CliRunner

    from ragledger.cli import app

    pooling_store(tmp_path, "pool", copies=4)
    run = CliRunner().invoke(app, ["analyze", "pool", "--store", str(tmp_path), "--no-mlflow"], env={"COLUMNS": "400"})
    assert run.exit_code == 0, run.output
    assert "eor(r1,r2,r3,r4,r5,pooling=mean)" in run.output and "pooling mean," in run.output
    run = CliRunner().invoke(app, ["analyze", "pool", "--store", str(tmp_path), "--no-mlflow", "--eor-pooling", "search"],
                             env={"COLUMNS": "400"})
    assert run.exit_code == 0, run.output
    # which pooling the search keeps here depends on the F1 and cosine similarities too (the CLI fits all three)
    assert "eor(r1,r2,r3,r4,r5,pooling=search:" in run.output and "(searched on training accuracy)" in run.output
    run = CliRunner().invoke(app, ["analyze", "pool", "--store", str(tmp_path), "--eor-pooling", "median"])
    assert run.exit_code == 2 and "--eor-pooling must be one of mean, max, majority, plurality, search" in run.output


def test_across_lists_retrievers_not_the_eor_cell_that_analyze_stored(tmp_path, prefect_harness):
    """`ragledger analyze` stores the EoR cell's outcomes in the experiment (held-out questions only); seed 002's
    corpus-level figure (`ragledger across`) then still has one row per retriever: good, bad1, bad2."""
    import json

    from typer.testing import CliRunner

    from ragledger.cli import app

    outcomes = synthetic_store(tmp_path, n=120)
    run = CliRunner().invoke(app, ["analyze", "syn", "--store", str(tmp_path), "--no-mlflow"], env={"COLUMNS": "400"})
    assert run.exit_code == 0, run.output
    stored = EventStore(tmp_path).read("outcomes", "syn")
    assert stored["cell"].str.startswith("eor(").any()  # analyze ran EoR and stored its cell
    r = CliRunner().invoke(app, ["across", "syn", "--store", str(tmp_path), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(x["cell"] for x in rows) == ["bad1 · concatenation · m", "bad2 · concatenation · m",
                                              "good · concatenation · m"]
    good = outcomes[outcomes["retriever"] == "good"]["em"].mean() * 100
    assert next(x["syn"] for x in rows if x["cell"].startswith("good")) == pytest.approx(good)
    assert all(x["questions:syn"] == 120 for x in rows)  # every question, not EoR's held-out half
