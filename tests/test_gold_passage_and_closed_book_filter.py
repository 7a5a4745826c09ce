"""Seed 001's experimental settings through the whole flow against the scripted server: the closed-book dataset
filter, gold-passage insertion (`gold(X,position[,trigger])`), and the readers table with bootstrap CIs on MLflow."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.fakes.openai_server import ScriptedServer

SQUAD = {"version": "1.1", "data": [
    {"title": "Super_Bowl_50", "paragraphs": [
        {"context": "The Denver Broncos defeated the Carolina Panthers 24-10 to earn their third title.",
         "qas": [{"id": "q1", "question": "Which NFL team won Super Bowl 50?",
                  "answers": [{"text": "Denver Broncos", "answer_start": 4}]}]},
        {"context": "Super Bowl 50 was an NFL game; which team won Super Bowl 50 was decided in Santa Clara.", "qas": []},
    ]},
    {"title": "France", "paragraphs": [
        {"context": "Paris is the capital of France.",
         "qas": [{"id": "q2", "question": "What is the capital of France?", "answers": [{"text": "Paris", "answer_start": 0}]}]},
    ]},
    {"title": "Everest", "paragraphs": [
        {"context": "Mount Everest is the highest mountain on Earth.",
         "qas": [{"id": "q3", "question": "What is the highest mountain on Earth?",
                  "answers": [{"text": "Mount Everest", "answer_start": 0}]}]},
    ]},
]}  # fmt: skip
CLOSED_BOOK = {"Super Bowl": "Carolina Panthers", "capital": "Paris", "mountain": "K2"}


def model(system: str, prompt: str, body: dict) -> str:
    context = prompt.split("Context:\n")[1].split("\nQuestion:")[0]
    question = prompt.split("Question:\n")[1]
    if not context.strip():  # closed book: right only on the capital
        return next(a for k, a in CLOSED_BOOK.items() if k in question)
    for answer in ("Denver Broncos", "Mount Everest", "Paris"):
        if answer in context:
            return answer
    return "unknown"


@pytest.fixture
def workspace(tmp_path):
    with gzip.open(tmp_path / "mini-squad.json.gz", "wt", encoding="utf-8") as fh:
        json.dump(SQUAD, fh)
    return tmp_path


def make_spec(ws, base_url, **dataset):
    return {
        "name": "seed001",
        "dataset": {"name": "squad", "path": str(ws / "mini-squad.json.gz"), **dataset},
        "corpus": {"name": "squad-paragraphs", "paths": [str(ws / "mini-squad.json.gz")]},
        "retrievers": ["bm25@1", "gold(bm25@1,random)", "gold(bm25@2,first)", "gold(bm25@2,last)"],
        "readers": ["concatenation"],
        "model": {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 4},
        "execution": {"shard_size": 2},
        "tracking": {"store": str(ws / "store"), "mlflow_uri": f"sqlite:///{ws / 'mlflow.db'}"},
    }


def test_gold_passage_filter_and_readers_table(workspace, prefect_harness):
    import mlflow

    from flows.execute import experiment_flow
    from tracking.store.query import query

    with ScriptedServer(answer=model) as server:
        spec = make_spec(workspace, server.base_url, closed_book_filter=True)
        first = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        prompts = [r["messages"][-1]["content"] for r in server.requests]
        assert sum("Context:\n\nQuestion" in p for p in prompts) == 3  # the closed-book round: every sampled question
        assert len(prompts) == len(set(prompts))  # cells with identical prompts share calls through the LLM cache
        calls = server.calls
        again = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        assert again["llm_calls"] == 0 and server.calls == calls

    # the filter: q2 (answered closed book) is dropped, and the run says so
    assert (first["questions_sampled"], first["closed_book_dropped"], first["questions"]) == (3, 1, 2)
    store = spec["tracking"]["store"]
    filt = query(store, "SELECT qid, parsed_answer, cell FROM generations WHERE reader = 'closed_book_filter'")
    assert sorted(filt["qid"]) == ["q1", "q2", "q3"] and set(filt["cell"]) == {"none · closed_book_filter · scripted"}
    assert set(query(store, "SELECT DISTINCT qid FROM retrievals")["qid"]) == {"q1", "q3"}

    # gold insertion: the reader sees the gold paragraph exactly as stored in RetrievalRecords
    ret = query(store, "SELECT retriever, qid, rank, pid, score FROM retrievals ORDER BY retriever, qid, rank")
    by = {(r, q): list(g["pid"]) for (r, q), g in ret.groupby(["retriever", "qid"])}
    assert by[("bm25@1", "q1")] == ["Super_Bowl_50_1"]  # BM25 misses the gold paragraph
    assert by[("gold(bm25@1,random)", "q1")] == ["Super_Bowl_50_0"]  # inserted in place of the lowest-ranked hit
    assert by[("gold(bm25@2,first)", "q1")][0] == "Super_Bowl_50_0" and by[("gold(bm25@2,last)", "q1")][-1] == "Super_Bowl_50_0"
    assert by[("gold(bm25@1,random)", "q3")] == by[("bm25@1", "q3")] == ["Everest_0"]  # already there: unchanged
    inserted = ret[(ret.retriever == "gold(bm25@1,random)") & (ret.qid == "q1")]
    assert inserted["score"].isna().all()
    gens = query(store, "SELECT cell, qid, prompt FROM generations WHERE reader = 'concatenation'").set_index(["cell", "qid"])
    assert "Denver Broncos defeated" in gens.loc[("gold(bm25@1,random) · concatenation · scripted", "q1"), "prompt"]
    cells = first["cells"]
    assert cells["bm25@1 · concatenation · scripted"]["em"] == 50.0
    assert cells["gold(bm25@1,random) · concatenation · scripted"]["em"] == 100.0
    assert cells["gold(bm25@1,random) · concatenation · scripted"]["gold_paragraph_hit"] == 100.0

    # the readers table: EM with its bootstrap CI, on the parent MLflow run and in the cell metrics
    m = cells["bm25@1 · concatenation · scripted"]
    assert m["em_ci_lo"] == 0.0 and m["em_ci_hi"] == 100.0
    client = mlflow.tracking.MlflowClient(spec["tracking"]["mlflow_uri"])
    parent = client.get_run(first["mlflow_parent_run_id"])
    assert parent.data.metrics["closed_book_dropped"] == 1 and parent.data.metrics["questions_sampled"] == 3
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "analysis")}
    assert {"analysis/readers_table.csv", "analysis/readers_table.md", "analysis/readers_table.html"} <= names
    with open(client.download_artifacts(parent.info.run_id, "analysis/readers_table.md", str(workspace))) as fh:
        md = fh.read()
    assert "| bm25@1 | concatenation | 50.0 | [0.0, 100.0] |" in md
    assert "| gold(bm25@1,random) | concatenation | 100.0 | [100.0, 100.0] |" in md


# q1: BM25's top 1 is a paragraph that holds the answer but is not q1's gold paragraph; q2: its top 1 holds neither
TRIGGER_SQUAD = {"version": "1.1", "data": [
    {"title": "Super_Bowl_50", "paragraphs": [
        {"context": "The Denver Broncos defeated the Carolina Panthers 24-10 to earn their third title.",
         "qas": [{"id": "q1", "question": "Which NFL team won Super Bowl 50?",
                  "answers": [{"text": "Denver Broncos", "answer_start": 4}]}]},
        {"context": "Which NFL team won Super Bowl 50? The Denver Broncos, who won Super Bowl 50 in Santa Clara.", "qas": []},
    ]},
    {"title": "France", "paragraphs": [
        {"context": "Paris is the capital of France.",
         "qas": [{"id": "q2", "question": "What is the capital of France?", "answers": [{"text": "Paris", "answer_start": 0}]}]},
        {"context": "What is the capital of France? The capital of France is its largest city.", "qas": []},
    ]},
]}  # fmt: skip


def test_gold_trigger_answer_string_by_default_gold_id_as_option(workspace, prefect_harness):
    """Seed 001 §4.2: the gold passage goes in when the top-k does not contain the answer (`gold(X,random)`);
    `gold(X,random,id)` inserts whenever the gold paragraph id is missing."""
    from flows.execute import experiment_flow
    from tracking.store.query import query

    with gzip.open(workspace / "mini-squad.json.gz", "wt", encoding="utf-8") as fh:
        json.dump(TRIGGER_SQUAD, fh)
    with ScriptedServer(answer=model) as server:
        spec = make_spec(workspace, server.base_url)
        spec["retrievers"] = ["bm25@1", "gold(bm25@1,random)", "gold(bm25@1,random,id)"]
        summary = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
    ret = query(spec["tracking"]["store"], "SELECT retriever, qid, rank, pid FROM retrievals ORDER BY retriever, qid, rank")
    by = {(r, q): list(g["pid"]) for (r, q), g in ret.groupby(["retriever", "qid"])}
    assert by[("bm25@1", "q1")] == ["Super_Bowl_50_1"] and by[("bm25@1", "q2")] == ["France_1"]
    # answer in the retrieved text, gold id missing: the paper's trigger leaves the list, the id trigger inserts
    assert by[("gold(bm25@1,random)", "q1")] == ["Super_Bowl_50_1"]
    assert by[("gold(bm25@1,random,id)", "q1")] == ["Super_Bowl_50_0"]
    # neither: both insert
    assert by[("gold(bm25@1,random)", "q2")] == by[("gold(bm25@1,random,id)", "q2")] == ["France_0"]
    cells = summary["cells"]
    paper = cells["gold(bm25@1,random) · concatenation · scripted"]
    by_id = cells["gold(bm25@1,random,id) · concatenation · scripted"]
    # every question has the answer in its context (Recall@1 100) under both; only the id trigger forces the gold id
    assert paper["recall_at_k"] == by_id["recall_at_k"] == 100.0
    assert (paper["gold_paragraph_hit"], by_id["gold_paragraph_hit"]) == (50.0, 100.0)


def test_without_the_filter_every_sampled_question_runs(workspace, prefect_harness):
    from flows.execute import experiment_flow

    with ScriptedServer(answer=model) as server:
        spec = make_spec(workspace, server.base_url)
        spec["retrievers"] = ["gold(bm25@1)"]
        summary = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"])
        assert server.calls == 3
    assert summary["questions"] == summary["questions_sampled"] == 3 and summary["closed_book_dropped"] is None


def test_run_prints_the_readers_table(capsys):
    from ragledger.run_report import print_summary

    cells = {"bm25@5 · post_fusion · m": {"questions": 20, "em": 45.0, "em_ci_lo": 25.0, "em_ci_hi": 65.0, "f1": 50.5,
                                          "semantic_acc": 55.0, "unk_pct": 5.0, "nm_pct": 10.0, "recall_at_k": 80.0,
                                          "tokens_in_per_q": 900.0, "tokens_out_per_q": 20.0, "calls_per_q": 5.0},
             "none · concatenation · m": {"questions": 20, "em": 10.0, "em_ci_lo": 0.0, "em_ci_hi": 25.0, "f1": 12.0,
                                          "semantic_acc": float("nan"), "unk_pct": 60.0, "nm_pct": float("nan"),
                                          "recall_at_k": 0.0, "tokens_in_per_q": 90.0, "tokens_out_per_q": 3.0,
                                          "calls_per_q": 1.0}}
    print_summary({"experiment": "x", "questions": 20, "questions_sampled": 25, "closed_book_dropped": 5, "cells": cells,
                    "llm_calls": 3, "cache_hits": 0, "retries": 0, "tasks_from_cache": 0, "tasks_total": 4,
                    "wall_time_s": 1.0, "tracking_uri": "sqlite://", "mlflow_experiment_id": "1",
                    "mlflow_parent_run_id": "abc"})
    out = capsys.readouterr().out
    assert "EM 95% CI" in out and "[25.0, 65.0]" in out and "920.0" in out and "%NM" in out and "calls/q" in out
    assert "dropped 5 of 25 sampled questions" in out


def test_the_run_report_names_a_tracking_servers_own_ui_and_a_cached_answers_recorder(capsys):
    from ragledger.run_report import print_summary

    base = {"experiment": "x", "questions": 0, "cells": {}, "llm_calls": 0, "cache_hits": 0, "retries": 0,
            "tasks_from_cache": 0, "tasks_total": 0, "wall_time_s": 0.1, "mlflow_experiment_id": "1",
            "mlflow_parent_run_id": "abc"}
    print_summary({**base, "tracking_uri": "http://mlflow.example.org:5000"})
    out = capsys.readouterr().out
    assert "open it at: http://mlflow.example.org:5000" in out and "ragledger ui" not in out
    print_summary({**base, "tracking_uri": "sqlite:///m.db", "answered_from": "runs/x/1.json", "recorder_pid": 7})
    out = capsys.readouterr().out
    assert "pending are logged by a recorder (process 7)" in out and "ragledger ui" in out
