"""`ragledger index`: builds a spec's indexes ahead of time (BM25 + dense), idempotently."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from ragledger.cli import app


def test_index_command_builds_bm25_and_dense_once(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGLEDGER_INDEX_DIR", str(tmp_path / "indexes"))  # indexes are shared per machine by default
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": f"T{i}", "text": f"passage number {i} about topic {i}"}) + "\n"
                              for i in range(7)))
    qs = tmp_path / "q.jsonl"
    qs.write_text(json.dumps({"id": "q1", "question": "topic 3?", "answers": ["3"]}) + "\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "idx", "dataset": {"name": "jsonl", "path": str(qs)}, "corpus": {"name": "jsonl", "paths": [str(corpus)]},
        "retrievers": ["hybrid(bm25@2,dense@2)", "none", "parametric"], "readers": ["concatenation"],
        "tracking": {"store": str(tmp_path / "store")},
    }))  # fmt: skip
    result = CliRunner().invoke(app, ["index", "--spec", str(spec)])
    assert result.exit_code == 0, result.output
    built = sorted(p.name.split("-")[0] for p in (tmp_path / "indexes").iterdir())
    assert built == ["bm25", "dense"]
    assert all((p / "ragledger-complete").exists() for p in (tmp_path / "indexes").iterdir())
    assert "hybrid(bm25@2,dense@2)" in result.output and "indexes ready" in result.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "retrievers": ["dense@0"], "readers": ["concatenation"]}))
    result = CliRunner().invoke(app, ["index", "--spec", str(bad)])
    assert result.exit_code == 2 and "'dense@0': k must be a positive integer, got 0" in " ".join(result.output.split())
