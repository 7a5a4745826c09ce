"""flows/launch.py, the one entry of `ragledger run` below the command line: it checks the inputs, answers a rerun
from the store or runs it, and plans the run once whichever route it takes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_scripted import answer_from_context, make_spec, workspace  # noqa: F401  (fixture)
from tests.test_plan_cached import as_json


class RecordingHost:
    """The command's side of a launch (ragledger/cli.py gives the real one): what it was told and asked."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.flows = 0

    def say(self, line: str) -> None:
        self.said.append(line)

    @contextlib.contextmanager
    def running(self, spec) -> Iterator[None]:
        self.flows += 1
        yield

    @contextlib.contextmanager
    def prefect_api(self, meanwhile: Callable[[], None]) -> Iterator[str]:
        meanwhile()
        yield "the pytest run's Prefect API (prefect_harness)"

    def start_recorder(self, *args) -> int:
        from ragledger.recorder import start_recorder

        return start_recorder(*args)


def counting_plans(monkeypatch) -> list[str]:
    """Every call of flows/plan.py `plan`, wherever a module took the name."""
    import flows.cached
    import flows.executor
    import flows.plan
    import flows.prepare

    calls: list[str] = []
    real = flows.plan.plan

    def plan(spec, *args, **kwargs):
        calls.append(spec.name)
        return real(spec, *args, **kwargs)

    for module in (flows.plan, flows.prepare, flows.cached, flows.executor):
        monkeypatch.setattr(module, "plan", plan)
    return calls


def test_an_uncached_rerun_is_planned_once_and_an_identical_one_is_answered(workspace, prefect_harness,  # noqa: F811
                                                                            monkeypatch):
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    plans = counting_plans(monkeypatch)
    host = RecordingHost()
    with ScriptedServer(answer=answer_from_context) as server:
        first_spec = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation",)))
        options = RunOptions(first_spec.tracking.store)
        first = launch(first_spec, options, host)
        assert plans == ["scripted"] and host.flows == 1  # a first run: planned once, by its head start
        assert first["llm_calls"] > 0

        # one reader more: the store holds a manifest of this experiment but not every planned outcome, so the run
        # is planned to ask the store, and that plan is the one its head start and flow run
        plans.clear()
        spec = parse_spec(make_spec(workspace, server.base_url, readers=("concatenation", "post_fusion")))
        rerun = launch(spec, options, host)
        assert plans == ["scripted"] and host.flows == 2
        assert "answered_from" not in rerun and rerun["tasks_from_cache"] < rerun["tasks_total"]  # post_fusion ran
        assert "bm25@2 · post_fusion · scripted" in rerun["cells"]
        concatenation = "bm25@2 · concatenation · scripted"
        assert as_json(rerun["cells"][concatenation]) == as_json(first["cells"][concatenation])

        # the same again: answered from the store, planned once, no flow, no call
        plans.clear()
        calls = server.calls
        again = launch(spec, options, host)
        assert plans == ["scripted"] and host.flows == 2 and server.calls == calls
        assert again["answered_from"] == rerun["manifest"] and again["llm_calls"] == 0
        assert as_json(again["cells"]) == as_json(rerun["cells"])  # as the manifest keeps them (NaN: no gold)


def test_bad_inputs_fail_before_the_run_starts(workspace):  # noqa: F811
    from core.datasets import DatasetError
    from flows.launch import RunOptions, launch
    from schemas.spec import parse_spec

    raw = make_spec(workspace, "http://127.0.0.1:9/v1")
    raw["dataset"]["path"] = str(workspace / "missing.jsonl")
    spec = parse_spec(raw)
    host = RecordingHost()
    with pytest.raises(DatasetError, match=r"dataset\.path"):
        launch(spec, RunOptions(spec.tracking.store), host)
    assert host.flows == 0 and not (workspace / "store").exists()


def test_a_bad_dataset_is_told_before_the_corpus_is_read(workspace):  # noqa: F811
    """The datasets are checked before the corpus: a first read of a large corpus (DPR's Wikipedia) takes minutes."""
    from core.datasets import DatasetError
    from flows.launch import preflight
    from schemas.spec import parse_spec

    corpus = workspace / "passages.jsonl"
    corpus.write_text('{"id": "p1", "contents": "A passage."}\n')
    raw = make_spec(workspace, "http://127.0.0.1:9/v1")
    raw["dataset"]["path"] = str(workspace / "missing.jsonl")
    raw["corpus"] = {"name": "jsonl", "paths": [str(corpus)]}
    said: list[str] = []
    with pytest.raises(DatasetError, match=r"dataset\.path"):
        preflight(parse_spec(raw), said.append)
    assert said == []  # nothing said of reading the corpus
