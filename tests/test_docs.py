"""The user documentation (README.md, docs/) is kept true by the code: the spec reference equals what the pydantic
models render, every reader and retriever kind is documented, every paper config is named, the extension examples
run, and every code block marked runnable runs as written."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, info: str) -> list[str]:
    """The bodies of the fenced code blocks of a page whose info string is exactly `info`."""
    return [body for head, body in FENCE.findall(path.read_text()) if head.strip() == info]


def test_readme_is_short():
    assert len(README.read_text().splitlines()) < 250


# Words about how the project was built (work periods, tickets) have no place in user documentation.
WORK_WORDS = re.compile(r"session|issue's|milestone|\bthe issue\b", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_words_about_work_periods_or_issues(page):
    hits = [f"{page.name}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
            if WORK_WORDS.search(line)]
    assert not hits, "\n".join(hits)


def test_spec_reference_is_the_rendered_models():
    from ragledger.spec_doc import current_block, render

    assert current_block((DOCS / "spec.md").read_text()) == render(), (
        "docs/spec.md is out of date: run `.venv/bin/python -m ragledger.spec_doc --write`")


def test_every_spec_field_is_in_the_reference():
    from schemas.spec import (
        CorpusSpec,
        DatasetEntry,
        DatasetSpec,
        ExecutionSpec,
        ExperimentSpec,
        ModelSpec,
        ReaderEntry,
        TrackingSpec,
    )
    from strategies.readers import READERS

    text = (DOCS / "spec.md").read_text()
    models = (ExperimentSpec, DatasetSpec, DatasetEntry, CorpusSpec, ModelSpec, ExecutionSpec, TrackingSpec, ReaderEntry,
              *{r.Settings for r in READERS.values()})
    missing = sorted({f"{m.__name__}.{name}" for m in models for name in m.model_fields
                      if f"`{name}`" not in text and not (m is ReaderEntry and name == "settings")})
    assert not missing, missing


def test_spec_examples_validate():
    from schemas.spec import parse_spec

    specs = [doc for body in blocks(DOCS / "spec.md", "yaml") for doc in yaml.safe_load_all(body)
             if isinstance(doc, dict) and {"name", "retrievers", "readers"} <= doc.keys()]
    assert len(specs) >= 2
    for doc in specs:
        parse_spec(doc, "docs/spec.md")


def test_every_reader_and_retriever_kind_is_documented():
    from strategies.readers import READERS
    from strategies.retrievers import PLAIN, SOURCES, WRAPPERS

    text = (DOCS / "spec.md").read_text()
    missing = [f"reader {n}" for n in READERS if f"`{n}`" not in text]
    missing += [f"retriever {n}@k" for n in SOURCES if f"`{n}@k`" not in text]
    missing += [f"retriever {n}" for n in PLAIN if f"`{n}`" not in text]
    missing += [f"retriever {n}(...)" for n in WRAPPERS if f"`{n}(" not in text]
    missing += [] if "`X@rr@k`" in text else ["retriever X@rr@k"]
    assert not missing, missing


def test_every_paper_config_is_named_in_papers_md():
    text = (DOCS / "papers.md").read_text()
    missing = [p.name for p in sorted((REPO / "configs" / "papers").glob("*.yaml")) if p.name not in text]
    assert not missing, missing


def test_every_command_is_in_the_readme_table():
    """A command added to the CLI gets its row in the README's command table (`name ...` or `group a|b|c`)."""
    import typer.main

    from ragledger.cli import app

    rows = [re.split(r"(?<!\\)\|", line)[1].strip().strip("`") for line in README.read_text().splitlines()
            if line.startswith("| `")]  # the first cell; `\|` inside a cell is not a column border
    first_words = {row.split()[0] for row in rows if row}
    missing = []
    for name, command in typer.main.get_command(app).commands.items():
        if name not in first_words:
            missing.append(name)
        for sub in getattr(command, "commands", {}) or {}:
            if not any(row.startswith(f"{name} ") and sub in re.split(r"[\s|\\]+", row) for row in rows):
                missing.append(f"{name} {sub}")
    assert not missing, f"README.md's command table lacks {missing}"


def test_every_environment_variable_is_documented():
    """Every RAGLEDGER_* variable the code or the scripts read is in docs/operations.md."""
    text = (DOCS / "operations.md").read_text()
    used = set()
    from tests.test_architecture import LAYERS

    for folder in (*LAYERS, "infra"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".sh", ".yaml", ".yml"):
                used |= set(re.findall(r"RAGLEDGER_[A-Z_]*[A-Z]", path.read_text(errors="replace")))
    assert used, "no RAGLEDGER_* variable found: the scan is broken"
    missing = sorted(v for v in used if f"`{v}`" not in text)
    assert not missing, f"docs/operations.md does not document {missing}"


@pytest.fixture
def registries():
    """The live registries, restored after a test adds to them."""
    from core.datasets import CORPUS_FORMATS, DATASET_FORMATS
    from strategies.readers import READERS
    from strategies.retrievers import PLAIN, SOURCES, WRAPPERS
    from tracking.analysis.registry import ANALYSES

    saved = [(r, dict(r)) for r in (READERS, SOURCES, PLAIN, WRAPPERS, DATASET_FORMATS, CORPUS_FORMATS, ANALYSES)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)


def test_extending_examples_run(registries):
    """Every python block of docs/extending.md, in order, in one namespace (the page's own checks included)."""
    code = [body for head, body in FENCE.findall((DOCS / "extending.md").read_text())
            if head.strip() in ("python", "python module")]
    assert len(code) >= 12
    namespace: dict = {"__name__": "docs_extending"}
    for i, body in enumerate(code):
        exec(compile(body, f"docs/extending.md block {i + 1}", "exec"), namespace)
    from core.datasets import CORPUS_FORMATS, DATASET_FORMATS
    from strategies.readers import READERS
    from strategies.retrievers import SOURCES
    from tracking.analysis.registry import ANALYSES

    assert "top_passage" in READERS and "overlap" in SOURCES  # the examples registered themselves
    assert "qa-tsv" in DATASET_FORMATS and "passages-tsv" in CORPUS_FORMATS and "em_by_context" in ANALYSES


def outcome_row(cell: str, qid: str, em: float) -> dict:
    from tracking.store.events import event_id

    retriever, reader, model = cell.split(" · ")
    return {"event_id": event_id("outcomes", "demo", cell, qid), "cell": cell, "qid": qid, "retriever": retriever,
            "reader": reader, "model": model, "prediction": "x", "em": em, "f1": em, "semantic_match": None,
            "is_unknown": False, "gold_in_context": True, "pool_has_correct": None,
            "error_type": "correct" if em else "extraction_error", "tokens_in": 10, "tokens_out": 2, "llm_calls": 1}


@pytest.fixture
def repo_copy(tmp_path):
    """A stand-in for the repository root: every top-level entry linked, and a small store of its own in
    .ragledger/store (a demo experiment with two cells), so runnable commands touch nothing of the real checkout."""
    from tracking.store.events import EventStore, new_events

    root = tmp_path / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".ragledger", ".git"):
            (root / entry.name).symlink_to(entry)
    rows = [outcome_row(cell, f"q{i}", float(i % k == 0)) for cell, k in
            (("bm25@5 · concatenation · m", 3), ("bm25@5 · post_fusion · m", 2)) for i in range(6)]
    EventStore(root / ".ragledger" / "store").write("outcomes", new_events("outcomes", "demo", rows))
    return root


RUNNABLE = [(page, body) for page in PAGES for body in blocks(page, "bash runnable")]
# python blocks marked runnable (the Python API's examples) run with .venv's Python, in the same stand-in repository
RUNNABLE += [(page, f".venv/bin/python - <<'PYTHON'\n{body}PYTHON\n") for page in PAGES
             for body in blocks(page, "python runnable")]


def test_runnable_blocks_exist():
    assert len(RUNNABLE) >= 3
    assert [p.name for p, body in RUNNABLE if "import ragledger" in body] == ["README.md", "api.md"]


@pytest.mark.parametrize(("page", "body"), RUNNABLE, ids=[f"{p.name}:{b.splitlines()[0][:60]}" for p, b in RUNNABLE])
def test_runnable_block_runs_as_written(page, body, repo_copy):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["HOME"] = str(repo_copy.parent)  # nothing goes to the real home either
    env["COLUMNS"] = "200"
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=repo_copy, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"{page.name}:\n{body}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.stdout.strip(), f"{page.name}: {body!r} printed nothing"


def test_query_block_reads_the_store(repo_copy):
    """The README's query block answers from the store it runs against."""
    (body,) = [b for p, b in RUNNABLE if "ragledger query" in b]
    proc = subprocess.run(["bash", "-c", body], cwd=repo_copy, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "bm25@5 · concatenation · m" in proc.stdout and "bm25@5 · post_fusion · m" in proc.stdout
    assert re.search(r"concatenation · m\W+6\W+33\.3\b", proc.stdout), proc.stdout
    assert re.search(r"post_fusion · m\W+6\W+50\b", proc.stdout), proc.stdout
