"""Every seed strategy through the whole flow (Prefect, store, MLflow) against the scripted server.

The scripted model answers deterministically per prompt, so each strategy's rounds, call counts and
decision rules can be checked on the stored records.
"""

from __future__ import annotations

import json
import math

import pytest

from tests.fakes.openai_server import ScriptedServer

PASSAGES = [
    {"id": "a1", "title": "Broncos", "text": "The Denver Broncos won Super Bowl 50 in Santa Clara."},
    {"id": "a2", "title": "Super Bowl 50", "text": "Super Bowl 50 was an American football game."},
    {"id": "b1", "title": "Paris", "text": "Paris is the capital of France."},
    {"id": "b2", "title": "France", "text": "France is a country whose capital city is large."},
    {"id": "c1", "title": "Everest", "text": "Mount Everest is the highest mountain on Earth."},
    {"id": "c2", "title": "Mountains", "text": "The highest mountain ranges on Earth are in Asia."},
]
QUESTIONS = [
    {"id": "q1", "question": "Who won Super Bowl 50?", "answers": ["Denver Broncos"]},
    {"id": "q2", "question": "What is the capital of France?", "answers": ["Paris"]},
    {"id": "q3", "question": "What is the highest mountain on Earth?", "answers": ["Mount Everest", "Everest"]},
]
ENTITIES = (("Broncos", "Denver Broncos"), ("Paris", "Paris"), ("Everest", "Everest"))
CLOSED_BOOK = {"Super Bowl": "Carolina Panthers", "capital": "Paris", "mountain": "K2"}  # REFEED's initial guesses
CANDIDATES = {"Super Bowl": "(a) Carolina Panthers, (b) Denver Broncos", "capital": "(a) Paris, (b) Lyon",
              "mountain": "(a) Everest, (b) K2"}


def _topic(text: str) -> str:
    return next(k for k in CLOSED_BOOK if k in text)


REFINE = "Refer to the passages below"  # REFEED's refine prompt (seed 003 Table 11)


def scripted_model(system: str, prompt: str, body: dict) -> str:
    if "provide two correct candidates" in prompt:  # SuRe round 1
        return CANDIDATES[_topic(prompt.split("Question:")[-1])]
    if "support the prediction about the question" in prompt:  # SuRe generic summary (Listing 6)
        return f"{next((a for k, a in ENTITIES if k in prompt), 'Nothing')} is mentioned. [DONE]"
    if "professional writer" in prompt:  # SuRe summary: echo the prediction
        return f"The passages support {prompt.split('Prediction:')[1].splitlines()[0].strip()}. [DONE]"
    if "Does the passage correctly support" in prompt:  # SuRe validity: everything but the Panthers
        return "False" if "Panthers" in prompt.split("Passage:")[1] else "True"
    if "Choices: (a)" in prompt and "Task description" in prompt:  # SuRe MCQ prompt: picks choice (b)
        return "(b)"
    if prompt.startswith("Below is the passage related"):  # Sum-and-pred: answer from the summary
        return prompt.split("Passage:\n")[1].split(" is mentioned.")[0]
    if "Passage 1:" in prompt:  # SuRe ranking: prefers the Broncos summary, else position bias (always Passage 1)
        p1 = prompt.split("Passage 1:")[1].split("Passage 2:")[0]
        p2 = prompt.split("Passage 2:")[1].split("Target Question:")[0]
        return "Passage 2" if "Broncos" in p2 and "Broncos" not in p1 else "Passage 1"
    if prompt.startswith("Question:") and REFINE not in prompt:  # REFEED closed book
        return CLOSED_BOOK[_topic(prompt)]
    if prompt.endswith("Let's think step by step."):  # Pruning / Summary prompts: a rationale, then "Answer:"
        found = [ans for key, ans in ENTITIES if key in prompt.split("Question:")[0]]
        return f"Source 1 mentions it.\nAnswer: {found[0] if found else 'unknown'}"
    if "Candidate answers:" in prompt:  # PF+Concat distiller: the first candidate
        return prompt.split("Candidate answers:\n- ")[1].splitlines()[0]
    # REFEED's refine prompt: the instruction, the documents (and any initial-answer line), then the question
    context = prompt.split("Question:")[0] if REFINE not in prompt else prompt.split(REFINE)[1].rsplit("Question:", 1)[0]
    if "capital" in prompt.split("Question:")[-1] and context.count("\n\n") >= 1:
        return "unknown"  # Concatenation is confused by two passages on the capital question
    found = [ans for key, ans in ENTITIES if key in context]
    return f"The answer is {found[0]}" if REFINE in prompt and found else (found[0] if found else "unknown")


def logprob_of(system: str, prompt: str, text: str) -> float:
    """REFEED's ensemble: confident closed-book guesses on the capital and the mountain, not on the Super Bowl."""
    if REFINE in prompt:
        return -0.4
    if prompt.startswith("Question:") and "The answer is" in prompt:
        return {"Carolina Panthers": -2.0, "Paris": -0.1, "K2": -0.2}.get(text, -1.0)
    return -0.5


READERS = ["concat_pf", "pf_concat", "sure", "sure_base", "sure_mcq", "sure_generic", "sure_ranking", "sure_summaries",
           "refeed", "refeed_refined", "pruning", "summary",
           {"name": "post_fusion", "samples": 2}]


@pytest.fixture
def workspace(tmp_path):
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp_path / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return tmp_path


def make_spec(ws, base_url):
    return {
        "name": "readers",
        "dataset": {"name": "jsonl", "path": str(ws / "questions.jsonl")},
        "corpus": {"name": "jsonl", "paths": [str(ws / "corpus.jsonl")]},
        "retrievers": ["bm25@2"],
        "readers": READERS,
        "model": {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 8},
        "execution": {"shard_size": 2},
        "tracking": {"store": str(ws / "store"), "mlflow_uri": f"sqlite:///{ws / 'mlflow.db'}"},
    }


def test_every_seed_strategy_through_the_flow(workspace, prefect_harness):
    from flows.execute import experiment_flow
    from tracking.store.query import query

    with ScriptedServer(answer=scripted_model, logprob_fn=logprob_of) as server:
        spec = make_spec(workspace, server.base_url)
        first = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        calls = server.calls
        again = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        assert again["llm_calls"] == 0 and server.calls == calls and again["cells"] == first["cells"]
    store = spec["tracking"]["store"]
    gens = query(store, "SELECT * FROM generations")
    votes = query(store, "SELECT * FROM votes").set_index(["reader", "qid"])
    outcomes = query(store, "SELECT * FROM outcomes").set_index(["reader", "qid"])
    retrieved = query(store, "SELECT qid, count(*) AS n FROM retrievals GROUP BY qid").set_index("qid")["n"].to_dict()
    assert retrieved == {"q1": 2, "q2": 2, "q3": 2}

    # Concat+PF: Post-Fusion (round 2) only for the question Concatenation answered "unknown"
    cp = gens[gens.reader == "concat_pf"]
    r1 = cp[cp["round"] == 1].set_index("qid")["parsed_answer"].to_dict()
    assert r1 == {"q1": "Denver Broncos", "q2": "unknown", "q3": "Everest"}
    assert sorted(cp[cp["round"] == 2]["qid"]) == ["q2", "q2"]
    assert votes.loc[("concat_pf", "q2"), "chosen"] == "Paris" and votes.loc[("concat_pf", "q2"), "method"] == "fallback-majority"

    # PF+Concat: passages whose PF answer is unknown are dropped before distilling
    pc2 = gens[(gens.reader == "pf_concat") & (gens["round"] == 2)].set_index("qid")
    assert list(pc2.loc["q1", "passage_ids"]) == ["a1"] and "Super Bowl 50 was an American" not in pc2.loc["q1", "prompt"]
    assert outcomes.loc[("pf_concat", "q1"), "em"] == 1.0

    # SuRe: exactly 1 + 2 + 2 + 2 calls per question, and the v + r rule with ties to the earlier candidate
    su = gens[gens.reader == "sure"]
    assert su.groupby("qid").size().to_dict() == {"q1": 7, "q2": 7, "q3": 7}
    assert su.groupby("role").size().to_dict() == {"candidates": 3, "summary": 6, "validity": 6, "rank": 6}
    assert votes.loc[("sure", "q1"), "chosen"] == "Denver Broncos" and list(votes.loc[("sure", "q1"), "scores"]) == [0.0, 2.0]
    assert votes.loc[("sure", "q2"), "chosen"] == "Paris" and list(votes.loc[("sure", "q2"), "scores"]) == [1.5, 1.5]  # a tie
    assert first["cells"]["bm25@2 · sure · scripted"]["calls_per_q"] == 7.0
    # Table 3 ablations: the MCQ prompt picks (b) among SuRe's candidates; Sum-and-pred answers from a generic summary
    mcq = {q: votes.loc[("sure_mcq", q), "chosen"] for q in ("q1", "q2", "q3")}
    assert mcq == {"q1": "Denver Broncos", "q2": "Lyon", "q3": "K2"}
    assert gens[gens.reader == "sure_mcq"].groupby("role").size().to_dict() == {"candidates": 3, "choice": 3}
    assert outcomes.loc[("sure_generic", "q1"), "prediction"] == "Denver Broncos"
    assert first["cells"]["bm25@2 · sure_generic · scripted"]["calls_per_q"] == 2.0
    # Table 3 rows (2) and (3): SuRe's summaries appended to Base; SuRe's summaries ranked without validity
    rk = gens[gens.reader == "sure_ranking"]
    assert rk.groupby("role").size().to_dict() == {"candidates": 3, "summary": 6, "rank": 6}
    assert set(rk.call_id) <= set(su.call_id)  # every call is one of SuRe's (the LLM-call cache serves it)
    assert {q: votes.loc[("sure_ranking", q), "chosen"] for q in ("q1", "q2")} == {"q1": "Denver Broncos", "q2": "Paris"}
    sm = gens[gens.reader == "sure_summaries"]
    assert sm.groupby("role").size().to_dict() == {"candidates": 3, "summary": 6, "answer": 3}
    appended = sm[sm.role == "answer"].set_index("qid").loc["q1", "prompt"]
    assert "Summary #1: The passages support (a) Carolina Panthers." in appended
    assert outcomes.loc[("sure_summaries", "q1"), "prediction"] == "Denver Broncos"

    # REFEED: retrieval with question + initial answer, then the log-probability ensemble
    rf = gens[gens.reader == "refeed"]
    refine = rf[rf.role == "refine"].set_index("qid")
    assert "Initial answer" not in refine.loc["q1", "prompt"]  # Table 11 shows no initial answer by default
    assert rf.logprob.notna().all()
    chosen = {q: votes.loc[("refeed", q), "chosen"] for q in ("q1", "q2", "q3")}
    assert chosen == {"q1": "Denver Broncos", "q2": "Paris", "q3": "K2"}  # q3: a confident wrong guess is kept
    assert set(votes.loc["refeed"]["method"]) == {"refeed-answer-prob"}
    assert votes.loc[("refeed_refined", "q3"), "chosen"] == "Everest"
    # %NM: REFEED's pool for q3 held the correct refined answer, but the ensemble picked the initial one
    assert bool(outcomes.loc[("refeed", "q3"), "pool_has_correct"]) and outcomes.loc[("refeed", "q3"), "em"] == 0.0
    assert first["cells"]["bm25@2 · refeed · scripted"]["nm_pct"] == pytest.approx(100 / 3, abs=0.01)

    # Pruning / Summary prompts: the CoT answer after "Answer:"; self-consistency settings from the spec
    pf2 = gens[gens.reader == "post_fusion(samples=2)"]
    assert len(pf2) == 2 * 6 and set(pf2.sample_index) == {0, 1}
    sampled = [r for r in server.requests if r.get("temperature") == 0.7]
    assert len(sampled) == 12
    for name in ("pruning", "summary"):
        assert set(gens[gens.reader == name]["parse_status"]) == {"ok"}
        assert outcomes.loc[(name, "q1"), "prediction"] == "Denver Broncos"
    assert {c.split(" · ")[1] for c in first["cells"]} == {r if isinstance(r, str) else "post_fusion(samples=2)" for r in READERS}


def test_refeed_without_logprobs_falls_back_to_refined(workspace, prefect_harness):
    from flows.execute import experiment_flow
    from tracking.store.query import query

    with ScriptedServer(answer=scripted_model, logprob=None) as server:
        spec = make_spec(workspace, server.base_url)
        spec["readers"] = ["refeed"]
        experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
    votes = query(spec["tracking"]["store"], "SELECT qid, method, chosen FROM votes").set_index("qid")
    assert set(votes["method"]) == {"refeed-no-logprobs"}
    assert votes.loc["q1", "chosen"] == "Denver Broncos" and votes.loc["q3", "chosen"] == "Everest"


SAMPLED_GUESSES = {"Super Bowl": ["Carolina Panthers", "Denver Broncos", "Carolina Panthers"],
                   "capital": ["Lyon", "Paris", "Lyon"], "mountain": ["K2", "K2", "Everest"]}


def diverse_model(system: str, prompt: str, body: dict) -> str:
    """REFEED MODULE-1: sampled closed-book guesses differ by the request's seed (seed = spec seed + sample index)."""
    if prompt.startswith("Question:") and REFINE not in prompt and body.get("temperature") == 0.7:
        return SAMPLED_GUESSES[_topic(prompt)][body["seed"] % 3]
    return scripted_model(system, prompt, body)


def test_refeed_module1_diverse_feedback_and_feedback_recall(workspace, prefect_harness):
    from flows.execute import experiment_flow
    from tracking.store.query import query

    with ScriptedServer(answer=diverse_model, logprob_fn=logprob_of) as server:
        spec = make_spec(workspace, server.base_url)
        spec["retrievers"] = ["bm25@1"]
        spec["readers"] = [{"name": "refeed", "feedback_k": 1}, {"name": "refeed", "feedback_k": 1, "feedback_samples": 3},
                           "concatenation"]
        first = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        sampled = [r for r in server.requests if r.get("temperature") == 0.7]
        assert len(sampled) == 9 and {r["top_p"] for r in sampled} == {0.9} and {r["seed"] for r in sampled} == {0, 1, 2}
        calls = server.calls
        again = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        assert again["llm_calls"] == 0 and server.calls == calls
    store = spec["tracking"]["store"]
    gens = query(store, "SELECT * FROM generations")
    m1 = gens[gens.reader == "refeed(feedback_k=1,feedback_samples=3)"]
    assert m1.groupby("role").size().to_dict() == {"initial": 9, "refine": 3}
    refine = m1[m1.role == "refine"].set_index("qid")
    assert "Initial answers (before reading the passages): Carolina Panthers; Denver Broncos\n" in refine.loc["q1", "prompt"]
    assert list(refine.loc["q3", "passage_ids"]) == ["c1"]  # the Everest sample's document outranks the K2 ones
    assert len(refine.loc["q1", "passage_ids"]) == 1  # merged and cut to feedback_k
    assert set(m1["prompt_version"]) == {"003-table10-11-v3+k10+003-module1-v2"}
    outcomes = query(store, "SELECT reader, qid, gold_in_feedback FROM outcomes").set_index(["reader", "qid"])
    assert outcomes.loc["concatenation", "gold_in_feedback"].isna().all()
    cells = first["cells"]
    one = cells["bm25@1 · refeed(feedback_k=1) · scripted"]
    diverse = cells["bm25@1 · refeed(feedback_k=1,feedback_samples=3) · scripted"]
    # Q only vs Q+A vs Q+A1..An: the confident wrong greedy guess (K2) misleads Q+A on q3; a diverse sample finds Everest
    assert one["recall_feedback_at_k"] < diverse["recall_feedback_at_k"] == 100.0
    assert math.isnan(cells["bm25@1 · concatenation · scripted"]["recall_feedback_at_k"])
    assert not outcomes.loc[("refeed(feedback_k=1)", "q3"), "gold_in_feedback"]
    assert outcomes.loc[("refeed(feedback_k=1,feedback_samples=3)", "q3"), "gold_in_feedback"]
    assert one["recall_at_k"] == diverse["recall_at_k"]  # Q only: the cell retrieval, the same for both


def test_refeed_module2_keeps_the_answer_with_the_higher_arithmetic_mean_token_probability(workspace, prefect_harness):
    """Seed 003 MODULE-2 through the whole flow, log-probabilities served per token by the scripted server: on q1
    the closed-book "Carolina Panthers ." has tokens p = [0.99, 0.30, 0.01], P(y | x) = 1.30 / 3 = 0.4333 over all
    its output tokens (§3.2.2); the refined "The answer is Denver Broncos" has [0.1, 0.1, 0.1, 0.6, 0.6], P = 0.3.
    The paper's rule keeps the initial answer; the geometric mean over the same tokens (0.144 against 0.205) would
    have kept the refined one. answer_prob, the parsed answer's own tokens, is stored beside it: 0.645 and 0.6."""
    from flows.execute import experiment_flow
    from tracking.store.query import query

    def per_token(system: str, prompt: str, text: str) -> float | list[float] | None:
        if "Super Bowl" not in prompt:
            return -0.5
        if REFINE in prompt:  # "The answer is Denver Broncos"
            return [math.log(0.1)] * 3 + [math.log(0.6)] * 2
        return [math.log(0.99), math.log(0.30), math.log(0.01)]  # "Carolina", " Panthers."

    def model(system: str, prompt: str, body: dict) -> str:
        if "Super Bowl" in prompt and prompt.startswith("Question:") and REFINE not in prompt:
            return "Carolina Panthers ."
        return scripted_model(system, prompt, body)

    with ScriptedServer(answer=model, logprob_fn=per_token) as server:
        spec = make_spec(workspace, server.base_url)
        spec["readers"] = ["refeed", "refeed_refined"]
        experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
    store = spec["tracking"]["store"]
    gens = query(store, "SELECT qid, role, answer_prob, output_prob FROM generations WHERE reader = 'refeed'")
    gens = gens.set_index(["qid", "role"])
    assert gens.loc[("q1", "initial"), "output_prob"] == pytest.approx(1.30 / 3)
    assert gens.loc[("q1", "refine"), "output_prob"] == pytest.approx(0.3)
    assert gens.loc[("q1", "initial"), "answer_prob"] == pytest.approx(0.645)
    assert gens.loc[("q1", "refine"), "answer_prob"] == pytest.approx(0.6)
    votes = query(store, "SELECT reader, qid, method, chosen, scores FROM votes").set_index(["reader", "qid"])
    assert votes.loc[("refeed", "q1"), "chosen"] == "Carolina Panthers"
    assert votes.loc[("refeed", "q1"), "method"] == "refeed-answer-prob"
    assert list(votes.loc[("refeed", "q1"), "scores"]) == pytest.approx([1.30 / 3, 0.3])
    assert votes.loc[("refeed_refined", "q1"), "chosen"] == "Denver Broncos"
