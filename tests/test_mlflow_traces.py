"""Per-example lineage as MLflow traces (tracking/mlflow/traces.py): a scripted experiment's run logs one trace per
sampled question (RAGLEDGER_MLFLOW_TRACES, the hardest first) to its own tracking URI and experiment, with spans
for the retrieval, each generation, the vote and the outcome of every cell, all carrying the question id; the
traces are linked to the cell runs; nothing goes to MLflow's process-wide default store (an mlflow.db in the cwd).
A second logging of the same execution adds no trace."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli, make_data, reader, write_spec
from tracking.mlflow.traces import QID_ATTRIBUTE, TRACES_ENV, hardest_qids, sample_size

EXPERIMENT = "traced"
N_TRACES = 3


def wrong_for_some(system: str, prompt: str, body: dict) -> str:
    """The reader, wrong on q1 and q4 for every reader: they are the hardest."""
    question = prompt.split("Question:")[-1]
    return "nothing" if "fact 1 " in question or "fact 4 " in question else reader(system, prompt, body)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    ws = tmp_path_factory.mktemp("traces")
    make_data(ws, 6)
    uri = f"sqlite:///{ws / 'tracking' / 'mlflow.db'}"
    with ScriptedServer(answer=wrong_for_some) as model:
        spec = write_spec(ws, model.base_url, name=EXPERIMENT)
        proc = cli(ws, "run", str(spec), "--store", str(ws / "store"), "--json", str(ws / "run.json"),
                   env={"MLFLOW_TRACKING_URI": uri, TRACES_ENV: str(N_TRACES)})
        assert proc.returncode == 0, proc.stderr[-3000:]
    yield {"ws": ws, "uri": uri, "summary": json.loads((ws / "run.json").read_text())}


def traces_of(uri: str, experiment_id: str, **kw):
    from mlflow import MlflowClient

    return list(MlflowClient(tracking_uri=uri).search_traces(locations=[experiment_id], max_results=100, **kw))


def test_a_run_logs_the_hardest_questions_lineage_as_traces(traced):
    summary, uri = traced["summary"], traced["uri"]
    traces = traces_of(uri, summary["mlflow_experiment_id"])
    assert len(traces) == N_TRACES
    qids = {t.info.tags[QID_ATTRIBUTE] for t in traces}
    assert {"q1", "q4"} <= qids  # wrong in every cell: the hardest
    cells = sorted(summary["cells"])
    for t in traces:
        qid = t.info.tags[QID_ATTRIBUTE]
        spans = t.data.spans
        assert spans and all(s.attributes.get(QID_ATTRIBUTE) == qid for s in spans)
        names = [s.name for s in spans]
        root = next(s for s in spans if s.parent_id is None)
        assert root.name == f"question {qid}" and root.inputs["qid"] == qid
        assert sorted(n for n in names if n in cells) == cells  # one span per cell
        for cell in cells:
            cell_span = next(s for s in spans if s.name == cell)
            children = [s for s in spans if s.parent_id == cell_span.span_id]
            kinds = [s.span_type for s in children]
            assert "RETRIEVER" in kinds and "LLM" in kinds and "EVALUATOR" in kinds, (cell, names)
            assert any(s.name.startswith("vote") for s in children), (cell, names)
            retrieval = next(s for s in children if s.span_type == "RETRIEVER")
            assert retrieval.outputs and all("page_content" in d for d in retrieval.outputs)
            generation = next(s for s in children if s.span_type == "LLM")
            assert "Question:" in generation.inputs["prompt"] and "output" in generation.outputs
            assert generation.attributes["parse_status"] in ("ok", "unmarked", "unparseable", "empty", "error")
            outcome = next(s for s in children if s.span_type == "EVALUATOR")
            assert outcome.outputs["em"] == cell_span.outputs["em"]
        assert t.info.trace_metadata["mlflow.sourceRun"] == summary["mlflow_parent_run_id"]
    for cell, run_id in summary["mlflow_cell_run_ids"].items():  # each cell run's Traces tab lists them
        assert len(traces_of(uri, summary["mlflow_experiment_id"], run_id=run_id)) == N_TRACES, cell
    # nothing went to MLflow's process-wide default store
    assert not (traced["ws"] / "mlflow.db").exists() and not (traced["ws"] / "mlruns").exists()


def test_logging_the_execution_again_adds_no_trace(traced, monkeypatch):
    from tracking.mlflow.runs import log_execution

    summary = traced["summary"]
    monkeypatch.setenv(TRACES_ENV, str(N_TRACES + 1))
    manifest = Path(summary["manifest"])
    record = json.loads(manifest.read_text())
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=traced["uri"])
    client.set_terminated(summary["mlflow_parent_run_id"], "RUNNING")  # as if the parent's end had not been logged
    log_execution(traced["uri"], manifest.stem, record, traced["ws"] / "store")
    traces = traces_of(traced["uri"], summary["mlflow_experiment_id"])
    qids = [t.info.tags[QID_ATTRIBUTE] for t in traces]
    assert len(qids) == len(set(qids)) == N_TRACES + 1  # one more question, none twice
    assert not (Path.cwd() / "mlflow.db").exists()  # this process's logging did not use the default store either


def test_sample_size_and_order():
    assert sample_size({}) == 10 and sample_size({TRACES_ENV: "0"}) == 0 and sample_size({TRACES_ENV: "4"}) == 4
    with pytest.raises(ValueError, match=TRACES_ENV):
        sample_size({TRACES_ENV: "many"})
    df = pd.DataFrame({"qid": ["a", "a", "b", "b", "c", "c", "c"], "retriever": ["bm25"] * 6 + ["eor(x)"],
                       "em": [0, 0, 0, 1, 1, 1, 0], "f1": [0.2, 0.1, 0.0, 1, 1, 1, 0]})
    assert hardest_qids(df, 2) == ["a", "b"] and hardest_qids(df, 0) == []
