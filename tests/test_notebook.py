"""`ragledger.run` from Python, and docs/walkthrough.ipynb executed in a real Jupyter kernel (nbclient, ipykernel) on
the store that run made: the flow end to end (Prefect, the store, MLflow) against the scripted OpenAI-compatible
server (tests/fakes), 5 questions × 4 cells, so the notebook cannot rot without a test failing."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

import ragledger
from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_scripted import PASSAGES, QUESTIONS, answer_from_context, make_spec

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "docs" / "walkthrough.ipynb"
EXPERIMENT = "walkthrough"


@pytest.fixture(scope="module")
def ran(tmp_path_factory, prefect_harness):
    """One experiment run through `ragledger.run` on the scripted server: (its result, the spec, the workspace)."""
    from prefect.settings import get_current_settings

    ws = tmp_path_factory.mktemp("walkthrough")
    (ws / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (ws / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    saved = dict(os.environ)  # a run sets Prefect's settings in the environment of the process running it
    os.environ["PREFECT_API_URL"] = str(get_current_settings().api.url)  # the harness's server, not a new one
    try:
        with ScriptedServer(answer=answer_from_context) as server:
            spec = {**make_spec(ws, server.base_url), "name": EXPERIMENT}
            result = ragledger.run(spec)
            again = ragledger.run(copy.deepcopy(spec))  # answered from the store: nothing runs
            assert again.execution == result.execution and again.summary["llm_calls"] == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return result, spec, ws


def test_run_returns_the_execution_its_readers_table_and_mlflow_run(ran):
    result, spec, _ = ran
    assert result.experiment == EXPERIMENT and result.summary["llm_calls"] > 0
    store = ragledger.open_store(spec["tracking"]["store"])
    executions = store.executions(EXPERIMENT)
    assert executions["execution"].tolist() == [result.execution]
    assert executions["mlflow_run_id"].tolist() == [result.mlflow_run_id] and result.mlflow_run_id
    assert store.readers_table(EXPERIMENT).equals(result.readers_table)
    assert len(result.readers_table) == 4 and set(result.readers_table["retriever"]) == {"bm25@2", "none"}
    # one execution: its segments hold every stored record
    for kind in ("outcomes", "generations", "retrievals"):
        latest = getattr(store, kind)(EXPERIMENT, execution="latest")
        assert latest.equals(getattr(store, kind)(EXPERIMENT)), kind
    by_name = store.outcomes(EXPERIMENT, execution=result.execution[:8], cell="bm25@2 post_fusion")
    assert len(by_name) == 5 and by_name["cell"].unique().tolist() == ["bm25@2 · post_fusion · scripted"]
    row = store.experiments().set_index("experiment").loc[EXPERIMENT]
    assert (row["executions"], row["questions"], row["cells"], row["dataset"]) == (1, 5, 4, "jsonl")


def test_run_refuses_a_bad_spec_with_the_commands_error_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ragledger.cli import app

    monkeypatch.chdir(tmp_path)
    bad = {"name": "x", "dataset": {"name": "jsonl", "path": str(tmp_path / "missing.jsonl")}, "retrievers": ["none"],
           "readers": ["concatenation"], "model": {"backend": "openai", "name": "m", "base_url": "http://127.0.0.1:9/v1"}}
    (tmp_path / "bad.yaml").write_text(json.dumps(bad))  # JSON is YAML
    for spec, args in ((tmp_path / "bad.yaml", ()), (bad, ()), (tmp_path / "nope.yaml", ()), (bad, ("--limit", "0"))):
        out = CliRunner().invoke(app, ["run", str(spec if isinstance(spec, Path) else tmp_path / "bad.yaml"), *args],
                                 env={"COLUMNS": "300"}).output
        (line,) = [x.removeprefix("error: ") for x in out.splitlines() if x.startswith("error: ")]
        with pytest.raises(ragledger.RagledgerError) as caught:
            ragledger.run(spec, limit=0 if args else None)
        if isinstance(spec, dict):  # a mapping is named <spec> where a file is named by its path
            line = line.replace(str(tmp_path / "bad.yaml"), "<spec>")
        assert str(caught.value) == line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written: no .ragledger/


@pytest.mark.timeout(600)
def test_the_walkthrough_notebook_runs_in_a_kernel(ran):
    """Every cell of docs/walkthrough.ipynb, in order, in a fresh ipykernel (nbclient), on the run's store; its
    parameters cell pointed there, as papermill would."""
    import nbclient
    import nbformat

    _, spec, ws = ran
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = (f"STORE = {spec['tracking']['store']!r}\nEXPERIMENT = {EXPERIMENT!r}\n"
                     "CELL_A, CELL_B = 'bm25@2 concatenation', 'bm25@2 post_fusion'\n")
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ws)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    for needed in ("bm25@2 · concatenation · scripted", "exact McNemar p", "gold:", "has_gold", "retrieval_failure"):
        assert needed in text, needed
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plot
    readers = ragledger.open_store(spec["tracking"]["store"]).readers_table(EXPERIMENT)
    assert f"{readers['em'].iloc[0]:.1f}" in text
