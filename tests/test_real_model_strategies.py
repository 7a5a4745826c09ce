"""Every reader entry and every retriever kind against the real embedded model, at one question each.

The scripted test server answers in well-formed text; a real model does not (odd candidate formats, "True." for
validity, "Passage 1" in rankings, rationales that never reach "Answer:"). These runs take each strategy through
the whole flow on a real SQuAD question with the embedded llama.cpp model, so a parser or a vote that breaks on
real output fails here. They use the pytest run's shared pair of embedded servers (tests/conftest.py
`embedded_servers`); tests/test_tiers.py fails when a reader entry or a retriever kind is missing here.
"""

from __future__ import annotations

import gzip
import json
import math

import pytest
import yaml

from tests.test_integration_embedded import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the model is ~2-3x slower on AVX2 CPUs

MODEL = {"backend": "embedded", "embedded_model": "qwen2.5-coder-0.5b-instruct-awq-q4km", "max_tokens": 24, "concurrency": 1}

# reader entry -> the roles of the model calls it must have made (each question: a reader may skip a later round,
# e.g. SuRe when the model gives fewer than two candidates, so only the first round is required)
READERS: list[tuple[object, set[str]]] = [
    ("concatenation", {"answer"}),
    ("post_fusion", {"answer"}),
    ("pruning", {"answer"}),
    ("summary", {"answer"}),
    ("concat_pf", {"answer"}),
    ("pf_concat", {"answer"}),
    ({"name": "concatenation", "samples": 2}, {"answer"}),
    ({"name": "refeed", "feedback_k": 2}, {"initial", "refine"}),
    ({"name": "refeed_refined", "feedback_k": 2}, {"initial", "refine"}),
    ({"name": "refeed", "feedback_k": 2, "feedback_samples": 2}, {"initial", "refine"}),
    ("retrieve_read", {"answer"}),
    ("sure", {"candidates"}),
    ({"name": "sure", "candidates": 3}, {"candidates"}),  # Table 6's K = 3: its own round-1 prompt
    ("sure_base", {"answer"}),
    ("sure_summaries", {"candidates"}),
    ("sure_ranking", {"candidates"}),
    ("sure_mcq", {"candidates"}),
    ("sure_generic", {"summary"}),
]


def _label(entry: object) -> str:
    from schemas.spec import ReaderEntry

    return entry if isinstance(entry, str) else ReaderEntry.parse(entry).key


def _run(tmp_path, spec: dict) -> dict:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_cli(tmp_path, "run", str(path), "--json", "run.json", timeout=3000, own_prefect=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "run.json").read_text())


def test_every_reader_strategy_runs_on_the_real_model(tmp_path, shared_embedded):
    from tracking.store.query import query

    spec = {"name": "real-readers", "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 1, "seed": 3},
            "retrievers": ["bm25@2"], "readers": [r for r, _ in READERS], "model": MODEL, "execution": {"shard_size": 1}}
    summary = _run(tmp_path, spec)
    store = tmp_path / ".ragledger" / "store"
    gens = query(store, "SELECT reader, role, qid, output, parse_status, parsed_answer, output_prob FROM generations")
    outcomes = query(store, "SELECT reader, qid, em FROM outcomes")
    for entry, roles in READERS:
        label = _label(entry)
        mine = gens[gens["reader"] == label]
        assert roles <= set(mine["role"]), (label, sorted(set(mine["role"])))
        assert mine["qid"].nunique() == 1, label  # the question reached the model
        # the real model's output was read into an answer (a CoT reader's prose without "Answer:" counts: its
        # sentence is the answer, flagged unmarked)
        # (or the model said nothing: on an AVX2 build the 0.5B model answers SuRe's generic summary with the end
        # marker alone, "[DONE]", which is an empty summary, correctly read as such)
        said_nothing = (mine["output"].str.replace("[DONE]", "", regex=False).str.strip() == "").all()
        assert (mine["parsed_answer"].str.len() > 0).any() or said_nothing, (label, mine["parse_status"].tolist())
        assert len(outcomes[outcomes["reader"] == label]) == 1, label
        cell = next(m for name, m in summary["cells"].items() if f"· {label} ·" in name)
        assert 0 <= cell["parse_fail_pct"] <= 100 and not math.isnan(cell["parse_fail_pct"]), label
    # the server evaluated part of what was sent: consecutive calls share their prompts' prefixes (call_gate.py)
    assert 0 < summary["prompt_tokens_evaluated"] < summary["prompt_tokens_sent"], summary
    refeed = gens[gens["reader"] == "refeed(feedback_k=2)"]
    assert set(refeed["role"]) == {"initial", "refine"}
    # MODULE-2's P(y | x) of each real output (seed 003 §3.2.2): a mean of token probabilities
    assert ((refeed["output_prob"] > 0) & (refeed["output_prob"] <= 1)).all(), refeed["output_prob"].tolist()


# every retriever kind (strategies/retrievers: SOURCES, PLAIN, WRAPPERS, and @rr@ reranking), read by Concatenation
# (gold takes the SQuAD paragraphs: GOLD, its own run)
RETRIEVERS = ["dense@2", "bm25@rr@2", "hybrid(bm25@1,dense@1)", "compress(bm25@2)", "trunc(bm25@2,40)", "parametric",
              "none"]


# the default tier runs the retrievers that call the model (and the closed book); --all every kind, a dense index too
MODEL_RETRIEVERS = ["compress(bm25@2)", "parametric", "none"]


@pytest.mark.parametrize("kinds", [MODEL_RETRIEVERS, pytest.param(RETRIEVERS, marks=pytest.mark.extended)],
                         ids=["calling-the-model", "every-kind"])
def test_every_retriever_kind_runs_on_the_real_model(tmp_path, data_dir, shared_embedded, kinds):
    """On a small corpus (the paragraphs of the first SQuAD dev articles, so the dense index is built in seconds)
    and one of their questions."""
    from tracking.store.query import query

    with gzip.open(data_dir / "squad" / "dev-v1.1.json.gz", "rt") as f:
        articles = json.load(f)["data"][:6]
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for a in articles:
            for i, p in enumerate(a["paragraphs"]):
                f.write(json.dumps({"id": f"{a['title']}_{i}", "title": a["title"], "text": p["context"]}) + "\n")
    first = articles[0]["paragraphs"][0]
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps({"data": [{"title": articles[0]["title"],
                                               "paragraphs": [{"context": first["context"], "qas": first["qas"][:1]}]}]}))
    spec = {"name": "real-retrievers", "dataset": {"name": "squad", "path": str(questions)},
            "corpus": {"name": "jsonl", "paths": [str(corpus)]}, "retrievers": kinds, "readers": ["concatenation"],
            "model": MODEL, "execution": {"shard_size": 1}}
    summary = _run(tmp_path, spec)
    assert len(summary["cells"]) == len(kinds)
    store = tmp_path / ".ragledger" / "store"
    retrieved = query(store, "SELECT retriever, qid, rank, pid, text FROM retrievals ORDER BY retriever, rank")
    for r in kinds[:-1]:
        mine = retrieved[retrieved["retriever"] == r]
        assert mine["qid"].nunique() == 1 and (mine["text"].str.len() > 0).all(), r
    # compress and parametric wrote their text with the model: a summary / a background document, not a passage
    corpus_texts = {json.loads(line)["text"] for line in corpus.read_text().splitlines()}
    for r in {"compress(bm25@2)", "parametric"} & set(kinds):
        assert not set(retrieved[retrieved["retriever"] == r]["text"]) & corpus_texts, r
    if "trunc(bm25@2,40)" in kinds:
        assert sum(len(t.split()) for t in retrieved[retrieved["retriever"] == "trunc(bm25@2,40)"]["text"]) <= 40
    outcomes = query(store, "SELECT retriever, count(*) AS n FROM outcomes GROUP BY retriever")
    assert dict(zip(outcomes["retriever"], outcomes["n"], strict=True)) == dict.fromkeys(kinds, 1)


GOLD = "gold(bm25@2,last)"


def test_the_gold_passage_setting_runs_on_the_real_model(tmp_path, shared_embedded):
    """seed 001's gold-position setting over the SQuAD paragraphs: BM25's top 2 with the gold paragraph last."""
    from tracking.store.query import query

    spec = {"name": "real-gold", "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 1, "seed": 3},
            "retrievers": [GOLD], "readers": ["concatenation"], "model": MODEL, "execution": {"shard_size": 1}}
    summary = _run(tmp_path, spec)
    assert summary["llm_calls"] == 1
    store = tmp_path / ".ragledger" / "store"
    gold = query(store, "SELECT gold_pids FROM questions")["gold_pids"][0][0]
    shown = query(store, "SELECT pid FROM retrievals ORDER BY rank")
    assert len(shown) == 2 and shown["pid"].iloc[-1] == gold
    answered = query(store, "SELECT parsed_answer FROM generations")
    assert len(answered) == 1 and len(answered["parsed_answer"][0]) > 0
