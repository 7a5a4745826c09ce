"""A store is told from any other folder before a command reads or writes it (tracking/store/identity.py): every
store command given a folder that is not a store (one holding other files, an empty one, a missing one) ends with
one error line naming it, and leaves the folder as it was; a command that makes a store takes a new or empty one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ragledger.cli import app
from tracking.store.events import EventStore, event_id, new_events
from tracking.store.identity import NotAStoreError, StoreState, require_store, store_state


def snapshot(folder: Path) -> dict[str, tuple[bool, int, int]] | None:
    """Every entry under `folder` (and the folder itself): whether a directory, size, modification time."""
    if not folder.exists():
        return None
    found = {".": (True, 0, folder.stat().st_mtime_ns)}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(base) / name
            st = p.stat()
            found[str(p.relative_to(folder))] = (p.is_dir(), 0 if p.is_dir() else st.st_size, st.st_mtime_ns)
    return found


def questions_store(root: Path) -> None:
    rows = [{"event_id": event_id("questions", "exp", "q1"), "cell": "", "qid": "q1", "dataset": "jsonl",
             "question": "Which?", "answers": ["A"], "gold_pids": []}]
    EventStore(root).write("questions", new_events("questions", "exp", rows))


def test_what_marks_a_store(tmp_path):
    assert store_state(tmp_path / "missing").state is StoreState.MISSING
    (tmp_path / "file").write_text("x")
    assert store_state(tmp_path / "file").state is StoreState.FILE
    (tmp_path / "empty").mkdir()
    assert store_state(tmp_path / "empty").state is StoreState.EMPTY
    records = tmp_path / "records"
    questions_store(records)
    assert store_state(records).state is StoreState.STORE
    # each of a store's own files marks it alone: a run manifest, a catalog, the call cache
    for own in ("runs/exp/20260101T000000-abcdefgh.json", "compacted/exp.json", "llm_cache.sqlite"):
        root = tmp_path / own.replace("/", "_")
        (root / own).parent.mkdir(parents=True)
        (root / own).write_text("{}")
        assert store_state(root).state is StoreState.STORE, own
    # a store's folders with none of its files (what a compaction wrote into a mistyped folder, or a store before its
    # first record) make an empty store; anything else a foreign folder
    littered = tmp_path / "littered"
    (littered / "compacted").mkdir(parents=True)
    (littered / "compacted" / ".readers.lock").touch()
    (littered / "projections" / "questions").mkdir(parents=True)
    (littered / "questions" / "exp").mkdir(parents=True)
    assert store_state(littered).state is StoreState.EMPTY
    (littered / "questions" / "exp" / "notes.parquet").touch()  # not a segment's name
    (littered / "thesis.tex").touch()
    check = store_state(littered)
    assert check.state is StoreState.FOREIGN and check.foreign == ("thesis.tex",)


def test_require_store_names_the_folder_and_what_it_holds(tmp_path):
    folder = tmp_path / "papers"
    folder.mkdir()
    for name in ("a.pdf", "b.pdf", "c.pdf", "d.pdf"):
        (folder / name).touch()
    with pytest.raises(NotAStoreError) as exc:
        require_store(folder)
    assert str(exc.value) == (f"--store {folder}: not a ragledger store: it holds a.pdf, b.pdf, c.pdf and 1 more and no "
                              "records, run manifests or call cache; give an existing store")
    with pytest.raises(NotAStoreError, match="give a new or empty folder, or an existing store"):
        require_store(folder, "tracking.store", creating=True)
    with pytest.raises(NotAStoreError, match=r"^--store .*/none: no such directory$"):
        require_store(tmp_path / "none")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotAStoreError, match=r"it holds no records, run manifests or call cache$"):
        require_store(tmp_path / "empty")
    require_store(tmp_path / "empty", creating=True)
    require_store(tmp_path / "none", creating=True)
    questions_store(tmp_path / "store")
    require_store(tmp_path / "store")
    require_store(tmp_path / "store", creating=True)


@pytest.fixture
def inputs(tmp_path):
    """A spec whose inputs all pass the run's checks (its store aside), and a call pack to import."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "corpus.jsonl").write_text('{"id": "p0", "title": "Alpha", "text": "Alpha is item 0."}\n')
    (ws / "questions.jsonl").write_text('{"id": "q0", "question": "Which item is 0?", "answers": ["Alpha"]}\n')
    spec = {"name": "exp", "dataset": {"name": "jsonl", "path": str(ws / "questions.jsonl")},
            "corpus": {"name": "jsonl", "paths": [str(ws / "corpus.jsonl")]}, "retrievers": ["bm25@1"],
            "readers": ["concatenation"],
            "model": {"backend": "openai", "name": "scripted", "base_url": "http://127.0.0.1:9/v1"}}
    (ws / "spec.yaml").write_text(yaml.safe_dump(spec))
    return ws


READERS = [
    ("store", "compact"), ("store", "verify"), ("query", "SELECT 1"), ("errors", "exp"), ("flips", "a", "b"),
    ("hardest", "exp"), ("across", "exp"), ("analyze", "exp", "--no-mlflow"), ("trace", "exp", "q1"),
    ("history", "q1"), ("leaderboard",), ("diff", "exp"), ("sync",), ("cache", "export", "{ws}/calls.jsonl.gz"),
]
MAKERS = [
    ("run", "{ws}/spec.yaml"), ("pull", "exp", "--mlflow-uri", "http://127.0.0.1:9"),
    ("cache", "import", "{ws}/calls.jsonl.gz"),
    # a command over stored records pulls an experiment the store lacks into it: a store it makes
    ("query", "SELECT 1", "--experiment", "exp", "--mlflow-uri", "http://127.0.0.1:9"),
]


def not_a_store(tmp_path: Path, kind: str) -> Path:
    folder = tmp_path / "nostore"
    if kind == "foreign":
        (folder / "photos").mkdir(parents=True)
        (folder / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
        (folder / "notes.txt").write_text("not a store")
    elif kind == "empty":
        folder.mkdir()
    return folder


def run_on(folder: Path, ws: Path, args: tuple[str, ...]):
    argv = [a.format(ws=ws) for a in args] + ["--store", str(folder)]
    return CliRunner().invoke(app, argv, env={"MLFLOW_TRACKING_URI": None, "COLUMNS": "300"})


@pytest.mark.parametrize("kind", ["foreign", "empty", "missing"])
@pytest.mark.parametrize("args", READERS, ids=lambda a: " ".join(a[:2]))
def test_a_command_over_a_store_refuses_a_folder_that_is_not_one(tmp_path, inputs, kind, args):
    folder = not_a_store(tmp_path, kind)
    before = snapshot(folder)
    result = run_on(folder, inputs, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: --store {folder}: "), lines[0]
    assert snapshot(folder) == before


@pytest.mark.parametrize("args", MAKERS, ids=lambda a: " ".join(a[:2]))
def test_a_command_that_makes_a_store_refuses_a_folder_holding_other_files(tmp_path, inputs, args):
    folder = not_a_store(tmp_path, "foreign")
    before = snapshot(folder)
    result = run_on(folder, inputs, args)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: --store {folder}: not a ragledger store: it holds notes.txt, photos and no "), \
        lines[0]
    assert snapshot(folder) == before
