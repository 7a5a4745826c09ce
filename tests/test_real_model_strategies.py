"""Every reader strategy and every model-calling retriever against the real embedded model, at a tiny size.

The scripted test server answers in well-formed text; a real model does not (odd candidate formats, "True." for
validity, "Passage 1" in rankings, rationales that never reach "Answer:"). These runs take each strategy through
the whole flow on two real SQuAD questions with the embedded llama.cpp model, so a parser or a vote that breaks
on real output fails here. Both runs share one store and LLM-call cache per pytest run.
"""

from __future__ import annotations

import gzip
import json
import math

import pytest
import yaml

from tests.test_integration_embedded import run_cli

pytestmark = pytest.mark.integration

MODEL = {"backend": "embedded", "embedded_model": "qwen2.5-0.5b-instruct-q4km", "max_tokens": 24, "concurrency": 1}

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
    ("sure", {"candidates"}),
    ("sure_base", {"answer"}),
    ("sure_summaries", {"candidates"}),
    ("sure_ranking", {"candidates"}),
    ("sure_mcq", {"candidates"}),
    ("sure_generic", {"summary"}),
]


def _label(entry: object) -> str:
    from schemas.spec import ReaderEntry

    return entry if isinstance(entry, str) else ReaderEntry(**entry).key


def _run(tmp_path, spec: dict) -> dict:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_cli(tmp_path, "run", str(path), "--json", "run.json", timeout=3000)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "run.json").read_text())


def test_every_reader_strategy_runs_on_the_real_model(tmp_path):
    from tracking.query import query

    spec = {"name": "real-readers", "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 2, "seed": 3},
            "retrievers": ["bm25@2"], "readers": [r for r, _ in READERS], "model": MODEL, "execution": {"shard_size": 2}}
    summary = _run(tmp_path, spec)
    store = tmp_path / ".ragledger" / "store"
    gens = query(store, "SELECT reader, role, qid, parse_status, parsed_answer FROM generations")
    outcomes = query(store, "SELECT reader, qid, em FROM outcomes")
    for entry, roles in READERS:
        label = _label(entry)
        mine = gens[gens["reader"] == label]
        assert roles <= set(mine["role"]), (label, sorted(set(mine["role"])))
        assert mine["qid"].nunique() == 2, label  # both questions reached the model
        # the real model's output was read into an answer (a CoT reader's prose without "Answer:" counts: its
        # sentence is the answer, flagged unmarked)
        assert (mine["parsed_answer"].str.len() > 0).any(), (label, mine["parse_status"].tolist())
        assert len(outcomes[outcomes["reader"] == label]) == 2, label
        cell = next(m for name, m in summary["cells"].items() if f"· {label} ·" in name)
        assert 0 <= cell["parse_fail_pct"] <= 100 and not math.isnan(cell["parse_fail_pct"]), label
    # the server evaluated part of what was sent: consecutive calls share their prompts' prefixes (call_gate.py)
    assert 0 < summary["prompt_tokens_evaluated"] < summary["prompt_tokens_sent"], summary
    refeed = gens[gens["reader"] == "refeed(feedback_k=2)"]
    assert set(refeed["role"]) == {"initial", "refine"}


def test_every_model_calling_and_dense_retriever_runs_on_the_real_model(tmp_path, data_dir):
    """dense, rerank, hybrid, compress and parametric on a small corpus (the paragraphs of the first SQuAD dev
    articles, so the dense index is built in seconds), read by Concatenation."""
    from tracking.query import query

    with gzip.open(data_dir / "squad" / "dev-v1.1.json.gz", "rt") as f:
        articles = json.load(f)["data"][:6]
    corpus = tmp_path / "corpus.jsonl"
    with corpus.open("w") as f:
        for a in articles:
            for i, p in enumerate(a["paragraphs"]):
                f.write(json.dumps({"id": f"{a['title']}_{i}", "title": a["title"], "text": p["context"]}) + "\n")
    questions = tmp_path / "questions.jsonl"
    qas = [qa for a in articles for p in a["paragraphs"] for qa in p["qas"]][:2]
    questions.write_text("".join(json.dumps({"id": qa["id"], "question": qa["question"],
                                             "answers": [x["text"] for x in qa["answers"]]}) + "\n" for qa in qas))
    retrievers = ["dense@2", "bm25@rr@2", "hybrid(bm25@1,dense@1)", "compress(bm25@2)", "parametric", "none"]
    spec = {"name": "real-retrievers", "dataset": {"name": "jsonl", "path": str(questions)},
            "corpus": {"name": "jsonl", "paths": [str(corpus)]}, "retrievers": retrievers, "readers": ["concatenation"],
            "model": MODEL, "execution": {"shard_size": 2}}
    summary = _run(tmp_path, spec)
    assert len(summary["cells"]) == len(retrievers)
    store = tmp_path / ".ragledger" / "store"
    retrieved = query(store, "SELECT retriever, qid, text FROM retrievals")
    for r in retrievers[:-1]:
        mine = retrieved[retrieved["retriever"] == r]
        assert mine["qid"].nunique() == 2 and (mine["text"].str.len() > 0).all(), r
    # compress and parametric wrote their text with the model: a summary / a background document, not a passage
    corpus_texts = {json.loads(line)["text"] for line in corpus.read_text().splitlines()}
    for r in ("compress(bm25@2)", "parametric"):
        assert not set(retrieved[retrieved["retriever"] == r]["text"]) & corpus_texts, r
    outcomes = query(store, "SELECT retriever, count(*) AS n FROM outcomes GROUP BY retriever")
    assert dict(zip(outcomes["retriever"], outcomes["n"], strict=True)) == dict.fromkeys(retrievers, 2)
