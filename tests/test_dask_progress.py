"""A run on Dask workers shows its progress as the workers' tasks make it (core/progress.py `relayed`, through the
scheduler: flows/dask_workers.py `progress_from_workers`), as a run in threads does: each model call as it is
answered, each retrieved shard, the calls' forecast revised as each worker's task plans its calls."""

from __future__ import annotations

from core import progress
from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_scripted import answer_from_context, make_spec, workspace  # noqa: F401  (a fixture)
from tests.test_progress import Recording


def test_a_dask_runs_progress_comes_from_its_workers_as_their_tasks_make_it(workspace, prefect_harness):  # noqa: F811
    from flows.execute import run_experiment
    from tracking.store.query import query

    listener = Recording()
    progress.set_listener(listener)
    try:
        with ScriptedServer(answer=answer_from_context) as server:
            spec = make_spec(workspace, server.base_url, readers=("post_fusion",))
            summary = run_experiment(spec, spec["tracking"]["store"], tracking_uri=spec["tracking"]["mlflow_uri"], runner="dask",
                                     workers=2)
    finally:
        progress.set_listener(None)
    assert summary["task_processes"] == 2  # every stage task ran in the two worker processes
    store = spec["tracking"]["store"]
    calls = int(query(store, "SELECT count(*) AS n FROM generations")["n"][0])
    questions = int(query(store, "SELECT count(*) AS n FROM questions")["n"][0])
    reports = listener.reports
    # each call as it was answered on a worker (one report a call), not the task's count once its result came back
    answered = [r for r in reports if r[:2] == ("advance", "generate calls")]
    assert len(answered) == calls and all(r[2] == 1 and r[3] > 0 for r in answered), answered
    # the forecast, made here, revised by the plans the workers' tasks made: it ends at the calls made
    assert [r for r in reports if r[:2] == ("revise", "generate calls")][-1][2] == calls
    # every shard each retriever retrieved (bm25@2 and none) on the workers
    assert sum(r[2] for r in reports if r[:2] == ("advance", "retrieve questions")) == 2 * questions
    # the stage tasks' own count, kept here from their results
    assert sum(r[2] for r in reports if r[:2] == ("advance", "evaluate")) == summary["tasks_total"] // 4
