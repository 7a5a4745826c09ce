"""Corpus scale: what a corpus of N passages costs, as a user runs it (fresh processes from the shell).

Synthetic corpora of N passages made from real sentences (the SQuAD paragraphs split into sentences, ~100 words a
passage, seeded), written once as Pyserini's JsonCollection JSON lines ({id, contents: "title\\ntext"}), so the
same file is read by ragledger (`corpus: {name: jsonl}`) and by Pyserini's own indexer. For each N:
- Pyserini's indexer (`python -m pyserini.index.lucene`, 2 threads, positions, doc vectors, raw documents: what
  ragledger builds) on the file: time and peak RSS;
- `ragledger index --spec SPEC` on the same file, into an empty index folder (the one-time read that names the corpus
  by its content, then the index build): time and peak RSS, and its ratio to Pyserini's time (target <= 1.15);
- a 100-question `ragledger run` (SQuAD dev questions, bm25@5, Concatenation, a scripted OpenAI-compatible server
  answering at once) and the same command again, answered from the store: time and peak RSS of each (target: the
  first run's peak RSS grows by less than 300 MB from 20,963 to 5 M passages).
And `ragledger index` over the same N passages in DPR's psgs_w100.tsv layout (`corpus: {name: dpr-tsv}`, gzipped,
text and title quoted), beside Pyserini's indexer over the JSON lines in the same test: time, peak RSS and their
ratio (target <= 1.15; `-k dpr_tsv` runs these alone).
Peak RSS is the largest resident set of the command's processes (getrusage of the waited-for children, which
`ragledger run`'s Prefect server and model-call process are too).

Sizes: 20,963 and 1,000,000; 5,000,000 with RAGLEDGER_BENCH_5M=1 (3.3 GB of JSON lines; the three sizes take ~21 minutes
on 2 cores, docs/performance.md).
The corpora are kept under $RAGLEDGER_BENCH_DIR (default /tmp/ragledger-corpus-bench) between runs.
Skipped by default (`--benchmark-skip`). Run:
    .venv/bin/python -m pytest tests/benchmarks/test_corpus_scale.py --benchmark-only -p no:cacheprovider -s
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.corpora import PYSERINI_INDEXER
from tests.fakes.openai_server import ScriptedServer

REPO = Path(__file__).resolve().parents[2]
RAGLEDGER = str(Path(sys.executable).parent / "ragledger")
DATA = Path(os.environ.get("RAGLEDGER_DATA", REPO.parent / "shared" / "data"))
WORK = Path(os.environ.get("RAGLEDGER_BENCH_DIR", "/tmp/ragledger-corpus-bench"))
SIZES = [20_963, 1_000_000] + ([5_000_000] if os.environ.get("RAGLEDGER_BENCH_5M") == "1" else [])
WORDS = 100  # DPR's passages are 100 words
QUESTIONS = 100

# runs a command and reports its wall time, the CPU time and peak RSS of its processes, measured from outside
MEASURE = """
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": time.perf_counter() - started, "rc": done.returncode,
                  "peak_rss_mb": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "tail": (done.stdout + done.stderr)[-1500:]}))
"""


def measure(cmd: list[str], cwd: Path, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, *cmd], cwd=cwd, capture_output=True, text=True,
                         env=env or os.environ.copy(), timeout=6 * 3600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, result["tail"]
    return result


def sentences() -> tuple[list[str], list[str]]:
    """The SQuAD paragraphs' sentences, and the article titles, in file order."""
    found, titles = [], []
    for name in ("dev-v1.1.json.gz", "train-v1.0.json.gz"):
        with gzip.open(DATA / "squad" / name, "rt", encoding="utf-8") as fh:
            for article in json.load(fh)["data"]:
                titles.append(article["title"].replace("_", " "))
                for para in article["paragraphs"]:
                    found += [s.strip() for s in re.split(r"(?<=[.!?])\s+", para["context"]) if len(s.split()) >= 4]
    return found, titles


def synthetic_corpus(n: int) -> Path:
    """N passages of ~100 words of real sentences, seeded, as {id, contents} JSON lines (made once, kept)."""
    folder = WORK / f"corpus-{n}"
    path = folder / "passages.jsonl"
    if path.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    pool, titles = sentences()
    rng = random.Random(n)
    tmp = path.with_suffix(".part")
    with tmp.open("w", encoding="utf-8") as fh:
        for i in range(n):
            words: list[str] = []
            while len(words) < WORDS:
                words += rng.choice(pool).split()
            fh.write(json.dumps({"id": f"s{i}", "contents": f"{rng.choice(titles)}\n{' '.join(words[:WORDS])}"}) + "\n")
    tmp.rename(path)
    return folder


def dpr_tsv_corpus(n: int) -> Path:
    """The same N passages (ids, titles, texts) in DPR's psgs_w100.tsv layout, gzipped: a header `id<TAB>text<TAB>title`,
    the text and the title in double quotes (inner quotes doubled), as DPR's file quotes them. Beside the JSON-lines
    folder, not in it (Pyserini's JsonCollection reads every file of its folder). Made once, kept."""
    path = WORK / f"corpus-{n}-tsv" / "psgs_w100.tsv.gz"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    quote = lambda s: '"' + s.replace('"', '""') + '"'  # noqa: E731
    tmp = path.with_suffix(".part")
    with (synthetic_corpus(n) / "passages.jsonl").open(encoding="utf-8") as src, \
            gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as out:
        out.write("id\ttext\ttitle\n")
        for line in src:
            obj = json.loads(line)
            title, _, text = obj["contents"].partition("\n")
            out.write(f"{obj['id']}\t{quote(text)}\t{quote(title)}\n")
    tmp.rename(path)
    return path


def fresh_workspace(name: str) -> tuple[Path, dict]:
    """An empty folder and the environment of a machine ragledger has run on, before this corpus."""
    ws = WORK / name
    shutil.rmtree(ws, ignore_errors=True)
    ws.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
        "RAGLEDGER_HOME": str(ws / "home"),  # nothing kept from an earlier run: the corpus is read afresh
        "RAGLEDGER_INDEX_DIR": str(ws / "indexes")}
    seed_machine(ws / "home")
    return ws, env


def pyserini_indexer(corpus_dir: Path, index: Path, env: dict) -> dict:
    """Pyserini's own indexer over the JSON-lines folder, with what ragledger's index holds."""
    return measure([sys.executable, "-c", PYSERINI_INDEXER, "--collection", "JsonCollection", "--input", str(corpus_dir),
                    "--index", str(index), "--generator", "DefaultLuceneDocumentGenerator", "--threads", "2",
                    "--storePositions", "--storeDocvectors", "--storeRaw"], REPO, env)


def seed_machine(home: Path) -> None:
    """A machine ragledger has run on before: its models and the JVM's start-up cache (trained once per machine, on
    the first index build) are there, the corpus is new. Linked from this machine's cache home."""
    from core.paths import cache_home

    home.mkdir(parents=True, exist_ok=True)
    for name in ("jvm", "models"):
        if (cache_home() / name).is_dir() and not (home / name).exists():
            (home / name).symlink_to(cache_home() / name)


def write_spec(ws: Path, corpus: Path, base_url: str, kind: str = "jsonl") -> Path:
    spec = {"name": "scale", "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": QUESTIONS, "seed": 0},
            "corpus": {"name": kind, "paths": [str(corpus)]}, "retrievers": ["bm25@5"], "readers": ["concatenation"],
            "model": {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 8},
            "execution": {"shard_size": 25}}
    path = ws / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.timeout(6 * 3600)  # 5 M passages: two index builds of ~10 minutes each on 2 cores
@pytest.mark.parametrize("n", SIZES)
def test_corpus_scale(benchmark, record_result, n):
    corpus_dir = synthetic_corpus(n)
    corpus = corpus_dir / "passages.jsonl"
    ws, env = fresh_workspace(f"ws-{n}")
    pyserini = pyserini_indexer(corpus_dir, ws / "pyserini-index", env)
    with ScriptedServer(answer=lambda *_: "Denver Broncos") as server:
        spec = write_spec(ws, corpus, server.base_url)
        index = measure([RAGLEDGER, "index", "--spec", str(spec)], ws, env)
        first: dict = {}
        benchmark.pedantic(lambda: first.update(measure([RAGLEDGER, "run", str(spec)], ws, env)), rounds=1, iterations=1)
        again = measure([RAGLEDGER, "run", str(spec)], ws, env)
    figures = {
        "passages": n, "corpus_mb": round(corpus.stat().st_size / 2**20),
        "pyserini_index_s": round(pyserini["seconds"], 1), "pyserini_index_peak_rss_mb": round(pyserini["peak_rss_mb"]),
        "ragledger_index_s": round(index["seconds"], 1), "ragledger_index_peak_rss_mb": round(index["peak_rss_mb"]),
        "index_time_ratio": round(index["seconds"] / pyserini["seconds"], 3),
        "run_s": round(first["seconds"], 1), "run_peak_rss_mb": round(first["peak_rss_mb"]),
        "rerun_s": round(again["seconds"], 1), "rerun_peak_rss_mb": round(again["peak_rss_mb"]),
    }
    benchmark.extra_info.update(figures)
    record_result(f"corpus_{n}", figures)


@pytest.mark.timeout(6 * 3600)
@pytest.mark.parametrize("n", SIZES)
def test_dpr_tsv_index(benchmark, record_result, n):
    """`ragledger index` over the N passages in DPR's TSV layout (gzipped, quoted), against Pyserini's indexer over the
    same passages as JSON lines, side by side: the TSV is converted as Lucene indexes it (target <= 1.15)."""
    corpus_dir, tsv = synthetic_corpus(n), dpr_tsv_corpus(n)
    ws, env = fresh_workspace(f"ws-tsv-{n}")
    pyserini = pyserini_indexer(corpus_dir, ws / "pyserini-index", env)
    spec = write_spec(ws, tsv, "http://127.0.0.1:9/v1", kind="dpr-tsv")  # no model is called by `ragledger index`
    index: dict = {}
    benchmark.pedantic(lambda: index.update(measure([RAGLEDGER, "index", "--spec", str(spec)], ws, env)),
                       rounds=1, iterations=1)
    figures = {
        "passages": n, "tsv_gz_mb": round(tsv.stat().st_size / 2**20),
        "pyserini_index_s": round(pyserini["seconds"], 1), "pyserini_index_peak_rss_mb": round(pyserini["peak_rss_mb"]),
        "ragledger_index_tsv_s": round(index["seconds"], 1), "ragledger_index_peak_rss_mb": round(index["peak_rss_mb"]),
        "index_time_ratio": round(index["seconds"] / pyserini["seconds"], 3),
        # CPU seconds of each command's processes: what the wall times cost on a machine shared with other work
        "pyserini_index_cpu_s": round(pyserini["cpu_s"], 1), "ragledger_index_cpu_s": round(index["cpu_s"], 1),
    }
    benchmark.extra_info.update(figures)
    record_result(f"dpr_tsv_{n}", figures)
