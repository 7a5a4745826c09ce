"""engines/java.py: the JVM's start-up cache. Made once per machine, runtime, jar and options right after a BM25 index
is built or opened without one; a JVM started with it finds the same hits; a damaged cache is ignored without a word;
a training that fails is marked and not retried by every run. Each JVM is started in a fresh process, with its own
cache home, so the machine's cache is neither used nor touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engines import java
from strategies.retrievers.lucene import lucene_index
from tests.corpora import jsonl_corpus

REPO = Path(__file__).resolve().parents[1]
PASSAGES = [{"pid": f"p{i}", "title": f"Topic {i}", "text": f"passage {i} about the river number {i} and its bridges"}
            for i in range(30)]

SEARCH = """
import json, sys
from pathlib import Path
from engines import java
from strategies.retrievers.base import Query
from strategies.retrievers.bm25 import bm25_batch_search
from strategies.retrievers.lucene import PassageStore

java.ensure_jvm()
from jnius import autoclass
args = autoclass("java.lang.management.ManagementFactory").getRuntimeMXBean().getInputArguments()
hits = bm25_batch_search(PassageStore(Path(sys.argv[1])), [Query("q", "river number 7 bridges")], 3)
print(json.dumps({"args": [args.get(i) for i in range(args.size())], "hits": [[h.pid, h.score] for h in hits["q"]]}))
"""


def search_in_a_fresh_process(index: Path, home: Path) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"} | {"RAGLEDGER_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-c", SEARCH, str(index)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_the_start_cache_is_made_with_the_index_and_a_jvm_started_from_it_finds_the_same_hits(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("RAGLEDGER_HOME", str(home))
    said: list[str] = []
    index = lucene_index(jsonl_corpus(tmp_path / "corpus", PASSAGES), tmp_path / "indexes", log=said.append)
    cache = java.start_cache_path()
    assert cache is not None and cache.is_file() and cache.parent == home / "jvm"
    assert any("start-up cache" in line for line in said) and not java.start_cache_wanted()
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]  # the training's files are gone

    cached, _ = search_in_a_fresh_process(index, home)
    without, _ = search_in_a_fresh_process(index, tmp_path / "another-home")  # no cache there
    assert f"-XX:AOTCache={cache}" in cached["args"]
    assert not any(a.startswith("-XX:AOTCache") for a in without["args"])
    assert cached["hits"] == without["hits"] and cached["hits"][0][0] == "p7"

    said.clear()  # opened again: nothing more to make
    assert lucene_index(jsonl_corpus(tmp_path / "corpus", PASSAGES), tmp_path / "indexes", log=said.append) == index
    assert said == []

    cache.write_bytes(os.urandom(100_000))  # damaged: the JVM starts as it would without it, and says nothing
    damaged, stderr = search_in_a_fresh_process(index, home)
    assert damaged["hits"] == without["hits"]
    assert "aot" not in stderr.lower() and "shared" not in stderr.lower(), stderr[-2000:]


def test_a_failed_training_is_marked_and_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "anserini-0.0.0-fatjar.jar").write_bytes(b"not a jar")
    monkeypatch.setenv("ANSERINI_CLASSPATH", str(jars))
    assert java.start_cache_wanted()
    assert java.keep_start_cache(tmp_path) is None
    cache = java.start_cache_path()
    assert cache is not None and not cache.exists()
    assert cache.with_suffix(".failed").read_text().strip()  # the reason, for whoever looks
    assert not java.start_cache_wanted()
