"""Start-up off the critical path: what `ragledger run` loads before its first model call, and what a cached rerun
starts. Timing is measured in tests/benchmarks/test_cold_start.py; these tests check only what is loaded.

- A fresh process importing the CLI and the flow modules (all that `ragledger run` imports before the flow
  starts) loads none of torch, transformers, sentence-transformers, Pyserini (and its JVM bridge), ONNX Runtime
  or MLflow: each is imported inside the function that needs it (engines/onnx_encoder.py, strategies/retrievers/bm25.py,
  engines/java.py, tracking/mlflow/log.py); the semantic match itself never imports torch.
- A rerun answered entirely from the caches starts no JVM, searches no BM25 index, loads no embedding model and
  makes no model call (flows/experiment.py starts the model endpoint only when a task must call it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_scripted import answer_from_context, make_spec, run_flow, workspace  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "sentence_transformers", "pyserini", "jnius", "onnxruntime", "mlflow")


def heavy_modules_after(statement: str) -> list[str]:
    script = f"import json, sys\n{statement}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = set(json.loads(proc.stdout.strip().splitlines()[-1]))
    return sorted(loaded & set(HEAVY))


def test_the_run_path_imports_nothing_heavy():
    # ragledger/cli.py `run` imports flows.sweep (which imports flows.experiment, tasks.*, tracking.*) before the flow
    assert heavy_modules_after("import ragledger.cli, flows.experiment, flows.sweep") == []


def test_a_first_run_imports_no_pandas_before_its_head_start(tmp_path):
    """`ragledger run` names its user errors, loads and checks the spec (retriever names, dataset, API key), checks
    where it will write and looks for a cached answer (flows/launch.py) before its head start starts the JVM and reads the corpus
    (flows/head_start.py); pandas, pyarrow and pandera are imported there, beside the JVM's start, not before it on the
    way to the first model call. The command runs as a user starts it, in an empty directory, stopped where the
    head start would begin."""
    script = ("import json, os, sys\n"
              "import ragledger.cli as cli\n"
              "from flows.head_start import HeadStart\n"
              "def stop(*args, **kwargs):\n"
              "    heavy = {m.split('.')[0] for m in sys.modules} & {'pandas', 'pyarrow', 'pandera'}\n"
              "    print(json.dumps(sorted(heavy)), flush=True)\n"
              "    os._exit(0)  # skips the interpreter's flush: the line above flushes itself (stdout is a pipe)\n"
              "HeadStart.begin = stop\n"
              f"sys.argv = ['ragledger', 'run', {str(REPO / 'configs' / 'demo.yaml')!r}]\n"
              "cli.main()\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_the_semantic_match_imports_no_torch():
    """The evaluate stage's semantic match (and every other embedding) runs the exported ONNX graph with the model's
    own tokenizer: a run never imports torch, transformers or sentence-transformers once the graph is exported
    (infra/setup.sh exports it; exporting here makes the test independent of that)."""
    from engines.onnx_encoder import export_graph

    export_graph()
    fresh = uuid.uuid4().hex  # texts this machine has not embedded yet (engines/vector_cache.py): encoded now
    statement = ("from engines.semantic import max_similarity; "
                 f"max_similarity(['Denver {fresh}'], [['Denver Broncos {fresh}']])")
    assert heavy_modules_after(statement) == ["onnxruntime"]


def test_the_check_sees_a_heavy_import():
    """The check above is real: a module importing Pyserini at module level would be seen (its package alone: the
    pyserini.search modules would pull in torch and the JVM, seconds for nothing)."""
    assert heavy_modules_after("import ragledger.cli, pyserini") == ["pyserini"]


def test_a_cached_rerun_starts_no_jvm_and_no_embedding_model(workspace, prefect_harness, monkeypatch):  # noqa: F811
    with ScriptedServer(answer=answer_from_context) as server:
        spec = make_spec(workspace, server.base_url)
        first = run_flow(spec)
        calls = server.calls

        refused: list[str] = []  # what was attempted, also where a background job swallows the error

        def refuse(what: str):
            def fail(*args, **kwargs):
                refused.append(what)
                raise AssertionError(f"a fully cached rerun {what}")
            return fail

        import engines.java
        import engines.onnx_encoder
        import engines.semantic
        import strategies.retrievers.bm25
        import strategies.retrievers.lucene

        monkeypatch.setattr(engines.java, "ensure_jvm", refuse("started the JVM"))
        monkeypatch.setattr(strategies.retrievers.bm25, "searcher", refuse("opened a BM25 searcher"))
        monkeypatch.setattr(strategies.retrievers.lucene, "searcher", refuse("opened the corpus's index"))
        monkeypatch.setattr(engines.onnx_encoder, "_session", refuse("loaded the embedding model"))
        monkeypatch.setattr(engines.semantic, "embed", refuse("embedded answers"))
        second = run_flow(spec)
        assert second["llm_calls"] == 0 and server.calls == calls
        assert second["tasks_from_cache"] == second["tasks_total"]
        assert second["cells"] == first["cells"]
        assert refused == []


def test_gold_answers_are_embedded_while_the_calls_are_in_flight(workspace, prefect_harness, monkeypatch):  # noqa: F811
    """The flow embeds each shard's gold answers once its retrieval is in, before its evaluation (flows/executor.py
    `PlanExecution`), so an evaluation after the run's last answer embeds only predictions. Seen here as the gold
    answers of the questions answered right ("Paris" on bm25@2), which an evaluation alone never embeds (EM decides
    them), reaching the encoder."""
    import engines.semantic
    from tests.test_flow_scripted import QUESTIONS

    asked: list[list[str]] = []
    embed = engines.semantic.embed
    monkeypatch.setattr(engines.semantic, "embed", lambda texts: asked.append(list(texts)) or embed(texts))
    with ScriptedServer(answer=answer_from_context) as server:
        summary = run_flow(make_spec(workspace, server.base_url))
    assert any(cell["em"] > 0 for cell in summary["cells"].values())  # some answered right
    golds = {a for q in QUESTIONS for a in q["answers"]}
    embedded = {t for texts in asked for t in texts}
    assert golds <= embedded, golds - embedded


def test_the_head_start_hands_its_stages_and_calls_to_the_flow(workspace, prefect_harness, monkeypatch):  # noqa: F811
    """flows/head_start.py, begun by `ragledger run` before Prefect is up: it plans the run, retrieves the plan's
    retrieve stages with the retrieve stage's function and sends their round-1 calls to the endpoint (up already: the
    scripted server). The flow takes the run it planned, its retrieve tasks take and store those records instead of
    searching again, its generate tasks take the early answers over as their own calls, the server sees no call
    twice, the results are those of a run without it, and a rerun (its stages persisted by Prefect) retrieves
    nothing ahead. The first shard is retrieved in two parts (its first question, then the rest), as a larger
    shard's first 16 questions are."""
    import flows.execute
    import flows.head_start
    from flows.execute import run_experiment
    from flows.head_start import HeadStart
    from flows.prepare import plan_run
    from schemas.spec import parse_spec

    prepared_by_flow: list[str] = []
    monkeypatch.setattr(flows.execute, "plan_run", lambda spec, root: prepared_by_flow.append(root) or plan_run(spec, root))

    def begun(spec: dict) -> HeadStart:
        head = HeadStart.begin(parse_spec(spec), spec["tracking"]["store"], None)
        assert head is not None
        head.thread.join()  # not stopped: it runs every retrieve stage
        return head

    def run_with(spec: dict, head: HeadStart) -> dict:
        return run_experiment(spec, spec["tracking"]["store"], head_start=head)

    with ScriptedServer(answer=answer_from_context) as server:
        spec = make_spec(workspace, server.base_url)
        monkeypatch.setattr(flows.head_start, "FIRST_QUESTIONS", 1)
        head = begun(spec)
        prepared = head.prepared()
        assert prepared is not None
        stages = len(head._retrievals)
        assert stages == 3 * 2  # 5 questions in shards of 2, for bm25@2 and none
        early = len(head.head_start_calls)
        assert early > 0
        warmed = run_with(spec, head)
        assert head._retrievals == {} and len(head.head_start_calls) == 0  # each taken by its own task
        assert prepared_by_flow == []  # the flow ran the run its head start planned
        warmed_server_calls = server.calls
        again_head = begun(spec)
        assert again_head._retrievals == {} and len(again_head.head_start_calls) == 0  # all persisted: nothing ahead
        cold = run_flow({**spec, "tracking": {**spec["tracking"], "store": str(workspace / "store-without-head-start")}})
        # the second store has no call cache: every call again, as many as with the head start
        assert server.calls - warmed_server_calls == warmed_server_calls == warmed["llm_calls"] == cold["llm_calls"]
        # the first store deleted: Prefect's persisted results remain, but the flow runs every stage again whose
        # segment is gone, so the head start retrieves every stage again instead of leaving it all to the flow
        shutil.rmtree(spec["tracking"]["store"])
        head = begun(spec)
        assert len(head._retrievals) == stages and len(head.head_start_calls) == early
        again = run_with(spec, head)
        assert len(head.head_start_calls) == 0  # every early call taken over by its generate task
        # (this process's model-call process still holds the deleted store's call cache: hits, not calls)
        assert again["llm_calls"] + again["cache_hits"] == cold["llm_calls"] + cold["cache_hits"]
        assert again["cells"] == cold["cells"]
    assert early == warmed["llm_calls"]  # every round-1 call (these readers have one round) went early
    assert warmed["cells"] == cold["cells"]
    assert "start-up" in warmed["stage_seconds"] and "start-up" not in cold["stage_seconds"]


def test_a_head_start_that_stops_before_planning_leaves_the_flow_to_plan(workspace, monkeypatch):  # noqa: F811
    """Whatever stops a head start before the run is planned (here the search engines' start), the flow waiting for
    its plan gets none at once and plans the run itself (flows/head_start.py `prepared`), and `ragledger run` is not
    held waiting for first calls that will not leave."""
    import flows.head_start
    from flows.head_start import HeadStart
    from schemas.spec import parse_spec

    def no_engines(spec, store_root):
        raise OSError("no JVM on this machine")

    monkeypatch.setattr(flows.head_start, "engines_started_for_a_first_run", no_engines)
    spec = make_spec(workspace, "http://127.0.0.1:9/v1")  # an endpoint up already: calls would be sent early
    head = HeadStart.begin(parse_spec(spec), spec["tracking"]["store"], None)
    assert head is not None
    head.thread.join(timeout=60)
    assert not head.thread.is_alive() and head.first_calls_sent.is_set()
    assert head.prepared() is None
