"""flows/plan.py: a run's cells, shards, stages, keys and dependencies from the spec and questions alone (no Prefect,
no model, no store writes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core.cell import Cell
from core.datasets import load_questions
from flows.plan import plan, question_rows, questions_segment_for
from schemas.spec import ExperimentSpec
from tasks.stages import FilterStage, GenerateStage, RetrieveStage
from tests import test_plan_pinning as pinning
from tests.test_flow_readers import PASSAGES, QUESTIONS


@pytest.fixture
def pinned(pinned_workspace):
    """The pinning test's spec and questions, at its fixed place (its keys name the paths)."""
    spec = ExperimentSpec.model_validate(pinning.make_spec(pinned_workspace, pinning.READERS))
    return spec, load_questions("jsonl", spec.dataset.path)


pinned_workspace = pinning.pinned_workspace  # the same fixture: the same files at the same place


def labelled_keys(p) -> dict[str, str]:
    """The plan's keys under the labels tests/test_plan_pinning.py gives the flow's submitted tasks."""
    out = {}
    for t in p.tasks():
        inputs = pinning.described({"stage": t.stage})
        label = "|".join(str(inputs.get(k, "")) for k in ("retriever_name", "reader", "round_no"))
        out[f"{t.stage.stage}|{label}|{','.join(inputs['qids'])}"] = t.stage.key
    return out


def test_the_plan_has_the_flows_keys(pinned):
    spec, questions = pinned
    p = plan(spec, questions)
    assert labelled_keys(p) == pinning.STAGE_KEYS
    assert sorted(c.name for c in p.cells) == sorted(pinning.CELLS)


def test_the_closed_book_filter_is_planned_in_two_steps(pinned_workspace):
    spec = ExperimentSpec.model_validate(pinning.make_spec(pinned_workspace, ["concatenation"], closed_book_filter=True))
    questions = load_questions("jsonl", spec.dataset.path)
    before = plan(spec, questions)
    assert [f.qids for f in before.filters] == [("q1", "q2"), ("q3",)] and before.closed_book_dropped is None
    after = plan(spec, questions, closed_book_dropped={"q2"})
    assert after.qids == ["q1", "q3"] and after.questions_sampled == 3 and after.closed_book_dropped == {"q2"}
    assert labelled_keys(after) == pinning.FILTER_STAGE_KEYS


def test_dependencies_come_first_and_keys_are_unique(pinned):
    spec, questions = pinned
    p = plan(spec, questions)
    seen: set[str] = set()
    for t in p.tasks():
        assert set(t.after) <= seen, t.stage
        assert t.stage.key not in seen
        seen.add(t.stage.key)
    assert len(seen) == sum(p.stage_totals().values())
    sure = Cell("bm25@2", "sure", "scripted")
    rounds = p.generates[(sure, p.shards[0].id)]
    assert [g.round_no for g in rounds] == [1, 2, 3]
    assert rounds[1].upstream == rounds[0].key and rounds[0].upstream == p.retrieves[("bm25@2", p.shards[0].id)].key
    assert p.votes[(sure, p.shards[0].id)].upstream == rounds[-1].key
    assert p.evaluates[(sure, p.shards[0].id)].upstream == p.votes[(sure, p.shards[0].id)].key


def test_the_questions_segment_is_where_the_store_writes_it(tmp_path, pinned):
    from tracking.store.events import EventStore, new_events

    spec, questions = pinned
    written = EventStore(tmp_path).write("questions", new_events("questions", spec.name, question_rows(spec, questions)))
    assert questions_segment_for(spec, questions, tmp_path) == str(written)


def workspace_spec(tmp_path, retrievers: list[str], shard_size: int = 1,
                   readers: tuple = ("concatenation",)) -> tuple[ExperimentSpec, list]:
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp_path / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    spec = pinning.make_spec(tmp_path, list(readers))
    spec["retrievers"], spec["execution"]["shard_size"] = retrievers, shard_size
    spec = ExperimentSpec.model_validate(spec)
    return spec, load_questions("jsonl", spec.dataset.path)


def test_the_retrieval_schedule(tmp_path):
    spec, questions = workspace_spec(tmp_path, ["bm25@2", "compress(bm25@2)"])
    p = plan(spec, questions, corpus_hash="c")
    s0, s1, s2 = (s.id for s in p.shards)
    first = p.first_retrievals()
    assert first == [p.retrieves[("bm25@2", s0)], p.retrieves[("compress(bm25@2)", s0)]]
    # a retriever without model calls: one shard after the other, beside the model's work
    assert p.retrievals_after(p.retrieves[("bm25@2", s0)]) == [p.retrieves[("bm25@2", s1)]]
    assert p.retrievals_after(p.retrieves[("bm25@2", s2)]) == []
    # one that calls the model: every later shard at once, to fill its concurrency
    compress = [p.retrieves[("compress(bm25@2)", s)] for s in (s0, s1, s2)]
    assert p.retrievals_after(compress[0]) == compress[1:] and p.retrievals_after(compress[1]) == []
    assert compress[0].calls_model and not p.retrieves[("bm25@2", s0)].calls_model
    # the same schedule, each retrieval done before the next starts (a run's head start): shard by shard, each
    # retriever in turn, until the model-calling one's later shards come all at once
    bm25 = [p.retrieves[("bm25@2", s)] for s in (s0, s1, s2)]
    assert p.retrieval_order() == [bm25[0], compress[0], bm25[1], *compress[1:], bm25[2]]


def test_a_stage_key_changes_with_each_input_and_only_downstream(tmp_path):
    spec, questions = workspace_spec(tmp_path, ["none"], shard_size=5, readers=("post_fusion",))
    p = plan(spec, questions, corpus_hash="")
    (cell, sid), (g,) = next(iter(p.generates.items()))
    assert GenerateStage(g.upstream, g.cell, g.round_no, "other", g.model_key, g.settings, g.qids).key != g.key
    r = p.retrieves[("none", sid)]
    assert RetrieveStage(r.dataset_key, "other", r.retriever, r.code_version, r.qids, r.store_root).key != r.key
    # a new vote rule under the same label: the same retrievals and generations, a new vote
    voted = {**spec.model_dump(), "readers": [{"name": "post_fusion", "vote": "first", "label": "post_fusion"}]}
    q = plan(ExperimentSpec.model_validate(voted), questions, corpus_hash="")
    assert q.retrieves == p.retrieves
    assert [g.key for g in q.generates[(cell, sid)]] == [g.key]
    assert q.votes[(cell, sid)].key != p.votes[(cell, sid)].key
    filtered = spec.model_dump()
    filtered["dataset"]["closed_book_filter"] = True
    assert isinstance(plan(ExperimentSpec.model_validate(filtered), questions, corpus_hash="").filters[0], FilterStage)


def test_planning_imports_no_prefect():
    code = "import sys, flows.plan, tasks.stages; print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
