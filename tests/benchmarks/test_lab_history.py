"""A lab's whole history: questions across experiments over a synthetic lab, before and after compaction.

The lab (tests/benchmarks/lab.py) is written once through ragledger's own writer: N experiments x 16 cells x 2,000
questions of outcomes (32 M rows at N = 1,000, in 128 segments an experiment) and each experiment's questions. Each
run hard-links it into a scratch store (compaction replaces files; the written lab keeps its own links), then
measures, every figure in a fresh process (`python -c`, the function's own time after its imports; the OS page cache
is warm), with raw DuckDB over the same files as the baseline in the same run:
- before compaction: the cross-experiment leaderboard (ragledger: each (experiment, cell, question) once, its latest
  outcome), twice (the first also computes and caches each experiment's overlap projection), one question's history,
  one experiment's readers table; raw DuckDB's GROUP BY over every outcome file and its `WHERE qid = ...`;
- the compaction: `ragledger store compact` as a user runs it, its wall time and rows per second, and the store's
  record files before and after;
- after compaction: the same queries, and the whole `ragledger leaderboard` / `ragledger history` commands from the
  shell (Python start-up and imports included).
Targets (docs/performance.md): after compaction, the leaderboard <= 2 s and a question's history <= 200 ms.

Size: RAGLEDGER_BENCH_LAB=<experiments> (default 20; the documented figures use 1000: ~30 minutes to write the lab
once on 2 cores, ~12 GB of disk while both copies exist). Kept under $RAGLEDGER_BENCH_DIR (default
/tmp/ragledger-lab-bench). Skipped by default (`--benchmark-skip`). Run:
    RAGLEDGER_BENCH_LAB=1000 .venv/bin/python -m pytest tests/benchmarks/test_lab_history.py \
        --benchmark-only -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchmarks import lab

REPO = Path(__file__).resolve().parents[2]
RAGLEDGER = str(Path(sys.executable).parent / "ragledger")
WORK = Path(os.environ.get("RAGLEDGER_BENCH_DIR", "/tmp/ragledger-lab-bench"))
EXPERIMENTS = int(os.environ.get("RAGLEDGER_BENCH_LAB", "20"))
QID = lab.sample(1)[1][100]  # a TriviaQA question: asked by experiment 1 and about one in sixteen of the others

# each figure: a fresh interpreter imports what the query needs, then times the query alone
TIMED = """
import json, sys, time
root, what, arg = sys.argv[1], sys.argv[2], sys.argv[3]
if what.startswith("raw"):
    import glob, duckdb
    con = duckdb.connect()
    files = sorted(glob.glob(f"{root}/outcomes/*/*.parquet"))
    questions = sorted(glob.glob(f"{root}/questions/*/*.parquet"))
else:
    from tracking.analysis.history import experiment_readers_table, leaderboard
    from tracking.store.ledger import Ledger
started = time.perf_counter()
if what == "leaderboard":
    rows = len(leaderboard(root, top=None))
elif what == "history":
    rows = len(Ledger(root).question_history(arg))
elif what == "readers":
    rows = len(experiment_readers_table(root, arg))
elif what == "raw-leaderboard":
    rows = len(con.execute("WITH d AS (SELECT DISTINCT experiment, dataset FROM read_parquet(?, union_by_name = true)) "
                           "SELECT d.dataset, o.experiment, o.cell, count(*), avg(o.em), avg(o.f1) FROM read_parquet(?, "
                           "union_by_name = true) AS o LEFT JOIN d USING (experiment) GROUP BY ALL",
                           [questions, files]).fetchall())
elif what == "raw-history":
    rows = len(con.execute("SELECT experiment, cell, prediction, em, f1, error_type, created_at FROM read_parquet(?, "
                           "union_by_name = true) WHERE qid = ?", [files, arg]).fetchall())
print(json.dumps({"seconds": time.perf_counter() - started, "rows": rows}))
"""


def timed(root: Path, what: str, arg: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", TIMED, str(root), what, arg], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout[done.stdout.rindex("{"):])


def command(*args: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([RAGLEDGER, *args], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return time.perf_counter() - started


def queries(root: Path, when: str) -> dict:
    figures = {}
    for what, arg in (("leaderboard", ""), ("leaderboard", ""), ("history", QID), ("readers", lab.experiment_name(1)),
                      ("raw-leaderboard", ""), ("raw-history", QID)):
        key = f"{when}_{what}_s" if f"{when}_{what}_s" not in figures else f"{when}_{what}_again_s"
        r = timed(root, what, arg)
        figures[key], figures[f"{when}_{what}_rows"] = round(r["seconds"], 3), r["rows"]
    return figures


@pytest.mark.timeout(6 * 3600)
def test_lab_history_before_and_after_compaction(benchmark, record_result):
    from tracking.store.compaction import record_files
    from tracking.store.events import EventStore

    written = lab.build(WORK / f"lab-{EXPERIMENTS}", EXPERIMENTS)
    store = WORK / f"scratch-{EXPERIMENTS}"
    shutil.rmtree(store, ignore_errors=True)
    subprocess.run(["cp", "-al", str(written), str(store)], check=True)  # hard links: the written lab stays as it is
    figures = {"experiments": EXPERIMENTS, "outcome_rows": EXPERIMENTS * 16 * lab.QUESTIONS,
               "record_files_before": record_files(EventStore(store))}
    figures |= queries(store, "before")
    compaction: dict = {}
    benchmark.pedantic(lambda: compaction.update(seconds=command("store", "compact", "--store", str(store))),
                       rounds=1, iterations=1)
    figures["compact_s"] = round(compaction["seconds"], 1)
    figures["compact_rows_per_s"] = round((figures["outcome_rows"] + EXPERIMENTS * lab.QUESTIONS) / compaction["seconds"])
    figures["record_files_after"] = record_files(EventStore(store))
    figures |= queries(store, "after")
    figures["after_leaderboard_command_s"] = round(command("leaderboard", "--store", str(store)), 2)
    figures["after_history_command_s"] = round(command("history", QID, "--store", str(store)), 2)
    for what in ("leaderboard", "history"):  # compaction changes which files hold the events, not the answers
        assert figures[f"before_{what}_rows"] == figures[f"after_{what}_rows"]
    assert figures["after_history_rows"] == figures["after_raw-history_rows"] > 0
    if EXPERIMENTS <= 20:  # at full size a verify re-validates 32 M rows: tests/test_compaction.py covers it
        assert EventStore(store).verify()[1] == []
    benchmark.extra_info.update(figures)
    record_result(f"lab_{EXPERIMENTS}", figures)
    shutil.rmtree(store, ignore_errors=True)
