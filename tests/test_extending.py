"""docs/extending.md followed literally: its `python module` blocks (a dataset format, a corpus kind, an analysis, each
registered by its decorator) become a module in a temporary folder; importing it is the whole registration, and the
command line then runs them: `ragledger recall` over the new format's questions and the new kind's passages (real
BM25, no model), `ragledger analyze` with the new analysis beside its own tables."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from ragledger.cli import app
from tests.test_docs import DOCS, FENCE

pytestmark = pytest.mark.usefixtures("registries")


@pytest.fixture
def registries():
    """The live registries, restored after the module registered into them."""
    from core.datasets import CORPUS_FORMATS, DATASET_FORMATS
    from tracking.analysis.registry import ANALYSES

    saved = [(r, dict(r)) for r in (DATASET_FORMATS, CORPUS_FORMATS, ANALYSES)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)


@pytest.fixture
def docs_module(tmp_path, monkeypatch):
    """The page's `python module` blocks, in order, as the module `toy_extensions` in tmp_path, imported."""
    code = [body for head, body in FENCE.findall((DOCS / "extending.md").read_text()) if head.strip() == "python module"]
    assert len(code) == 3  # a dataset format, a corpus kind, an analysis
    (tmp_path / "toy_extensions.py").write_text("\n\n".join(code))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_extensions", raising=False)
    return importlib.import_module("toy_extensions")


def test_a_new_dataset_format_and_corpus_kind_run_through_recall(docs_module, tmp_path):
    (tmp_path / "questions.tsv").write_text("t1\tWhat is the capital of France?\tParis\n"
                                            "t2\tWhich mountain is the highest on Earth?\tMount Everest|Everest\n"
                                            "t3\tWho wrote Hamlet?\tShakespeare\n")
    (tmp_path / "passages.tsv").write_text("France_0\tFrance\tParis is the capital of France.\n"
                                           "Everest_0\tEverest\tMount Everest is the highest mountain on Earth.\n"
                                           "Rome_0\tRome\tRome is the capital of Italy.\n")
    r = CliRunner().invoke(app, ["recall", "-r", "bm25@1", "--dataset", "qa-tsv", "--path", str(tmp_path / "questions.tsv"),
                                 "--corpus", f"passages-tsv:{tmp_path / 'passages.tsv'}", "--store", str(tmp_path / "store")])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output.strip().splitlines()[-1])
    assert (row["retriever"], row["questions"]) == ("bm25@1", 3)
    assert row["recall_at_k"] == pytest.approx(200 / 3, abs=0.01)  # Paris and Everest found; Hamlet is in no passage

    r = CliRunner().invoke(app, ["recall", "-r", "bm25@1", "--dataset", "qa-tsv", "--path", str(tmp_path / "questions.tsv"),
                                 "--corpus", f"passages-tsvx:{tmp_path / 'passages.tsv'}", "--store", str(tmp_path / "store")])
    assert r.exit_code != 0 and "'passages-tsvx' is not one of" in r.output and "'passages-tsv'" in r.output


def test_a_new_analysis_runs_in_analyze(docs_module, tmp_path, prefect_harness):
    from tracking.store.events import EventStore, new_events

    store = tmp_path / "store"
    cells = ["bm25@5 · top_passage · m", "dense@5 · top_passage · m"]
    rows = [docs_module_outcome(cell, q, correct, gold) for cell in cells
            for q, correct, gold in (("q1", True, True), ("q2", cell.startswith("bm25"), True), ("q3", False, False))]
    EventStore(store).write("outcomes", new_events("outcomes", "exp", rows))
    out = tmp_path / "analysis"
    r = CliRunner().invoke(app, ["analyze", "exp", "--store", str(store), "--out", str(out), "--no-eor", "--no-mlflow"],
                           env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    assert "EM by whether the passages held a gold answer" in r.output  # printed with its title
    table = pd.read_parquet(out / "em_by_context.parquet")
    assert table[["cell", "gold_in_context", "questions", "em"]].values.tolist() == [
        [cells[0], False, 1, 0.0], [cells[0], True, 2, 100.0], [cells[1], False, 1, 0.0], [cells[1], True, 2, 50.0]]
    report = (out / "report.html").read_text()
    assert 'data-analysis="em_by_context"' in report and "EM by whether the passages held a gold answer" in report


def docs_module_outcome(cell: str, qid: str, correct: bool, gold_in_context: bool) -> dict:
    """An outcome event as docs/extending.md's check writes one."""
    from tracking.store.events import event_id

    retriever, reader, model = cell.split(" · ")
    return {"event_id": event_id("outcomes", "exp", cell, qid), "cell": cell, "qid": qid, "retriever": retriever,
            "reader": reader, "model": model, "prediction": "Paris" if correct else "Lyon",
            "em": float(correct), "f1": float(correct), "semantic_match": None, "is_unknown": False,
            "gold_in_context": gold_in_context, "pool_has_correct": None,
            "error_type": "correct" if correct else "extraction_error", "tokens_in": 10, "tokens_out": 2, "llm_calls": 1}


def test_the_module_is_what_the_docs_register(docs_module):
    from core.datasets import CORPUS_FORMATS, DATASET_FORMATS
    from tracking.analysis.registry import ANALYSES

    assert DATASET_FORMATS["qa-tsv"].load is docs_module.load_qa_tsv
    assert CORPUS_FORMATS["passages-tsv"].read is docs_module.read_passages_tsv
    assert ANALYSES["em_by_context"].table is docs_module.em_by_context
    assert Path(docs_module.__file__).name == "toy_extensions.py"
