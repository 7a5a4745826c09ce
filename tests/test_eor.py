"""EoR (seed 002) over stored outcomes: the fitted voter finds the better retriever on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest

from tracking import eor
from tracking.events import EventStore, event_id, new_events


def outcome_row(experiment, retriever, qid, prediction, gold, strategy="concatenation", model="m"):
    cell = f"{retriever} · {strategy} · {model}"
    right = prediction == gold
    return {"event_id": event_id("outcomes", experiment, cell, qid), "cell": cell, "qid": qid, "retriever": retriever,
            "strategy": strategy, "model": model, "prediction": prediction, "em": float(right), "f1": float(right),
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
    out, info = eor.eor_cells(tmp_path, "syn", outcomes, metrics=("em", "f1"))
    (cell,) = info["cells"]
    assert cell == "eor(bad1,bad2,good) · concatenation · m"
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
    out, info = eor.eor_cells(tmp_path, "syn", outcomes, metrics=("em", "f1"), train_outcomes=train, train_experiment="syn-train")
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
    assert {"eor1/rwr_heatmap.png", "eor1/inconsistency.parquet", "eor_weights.parquet", "eor.json", "report.html"} <= names
    assert "Ensemble of Retrievers" in (tmp_path / "analysis" / "syn" / "report.html").read_text()
