"""Four machines on one s3:// store at once, against an S3-compatible server of its own process (moto's server mode, or
RAGLEDGER_TEST_S3_URL): two run two experiments into it, a third runs `store compact` over and over meanwhile, a
fourth queries it in a loop. Nothing is lost or doubled (each experiment's outcomes are those of its run into a local
folder, each (cell, question) once), no read fails or sees outcomes disappear (readers follow committed catalogs;
replaced objects wait out a retention time before they are deleted), and `store verify` on a fifth machine finds the
store whole. There are no locks across machines: each writer's objects are content-named or its own."""

from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.servers import S3Server
from tests.test_reliability import cli, make_data, reader, write_spec

OUTCOMES = "SELECT cell, qid, prediction, em, f1, error_type FROM outcomes ORDER BY cell, qid"
COUNTS = ("SELECT experiment, count(*) AS n, count(DISTINCT cell || '/' || qid) AS pairs FROM outcomes "
          "GROUP BY experiment ORDER BY experiment")
QUESTIONS = 12
RETENTION_S = "20"  # the compacting machine deletes what its catalogs made unread once they are this old


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


def _machine(s3: S3Server, ws: Path, name: str) -> dict[str, str]:
    return {**s3.env, "RAGLEDGER_HOME": str(ws / "machines" / name)}


def _frame(proc) -> pd.DataFrame:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_json(io.StringIO(proc.stdout)) if proc.stdout.strip() else pd.DataFrame()


def _specs(ws: Path, base_url: str) -> dict[str, Path]:
    """Two experiments that ask the model different things (alpha: bm25@2, two readers; beta: bm25@3, one)."""
    specs = {name: write_spec(ws, base_url, name=name, compact=False) for name in ("alpha", "beta")}
    beta = yaml.safe_load(specs["beta"].read_text())
    beta.update(retrievers=["bm25@3"], readers=["concatenation"])
    specs["beta"].write_text(yaml.safe_dump(beta))
    return specs


def test_two_writers_a_compactor_and_a_reader_at_once(s3, tmp_path):
    make_data(tmp_path, QUESTIONS)
    url = s3.url("busy")
    with ScriptedServer(answer=reader, delay_s=0.05) as server:
        specs = _specs(tmp_path, server.base_url)
        local = {}
        for name, spec in specs.items():
            done = cli(tmp_path, "run", str(spec), "--store", str(tmp_path / "local"))
            assert done.returncode == 0, done.stderr[-3000:]
            local[name] = _frame(cli(tmp_path, "query", OUTCOMES, "--experiment", name, "--store",
                                     str(tmp_path / "local"), "--format", "json"))
        # the store exists before the compactor and the reader look at it
        seed = write_spec(tmp_path, server.base_url, name="seed")
        first = cli(tmp_path, "run", str(seed), "--limit", "2", "--store", url, env=_machine(s3, tmp_path, "setup"))
        assert first.returncode == 0, first.stderr[-3000:]

        writing = threading.Event()
        writing.set()

        def loop(*args: str, env: dict[str, str]) -> list:
            results = []
            while writing.is_set():
                results.append(cli(tmp_path, *args, "--store", url, env=env))
            results.append(cli(tmp_path, *args, "--store", url, env=env))  # once more, after the writers ended
            return results

        with ThreadPoolExecutor(4) as pool:
            compactions = pool.submit(loop, "store", "compact",
                                      env={**_machine(s3, tmp_path, "compactor"),
                                           "RAGLEDGER_STORE_RETENTION_S": RETENTION_S})
            reads = pool.submit(loop, "query", COUNTS, "--format", "json", env=_machine(s3, tmp_path, "reader"))
            writers = {name: pool.submit(cli, tmp_path, "run", str(spec), "--store", url,
                                         env={**_machine(s3, tmp_path, f"writer-{name}"),
                                              "RAGLEDGER_CACHED_ANSWER": "0"})
                       for name, spec in specs.items()}
            runs = {name: w.result() for name, w in writers.items()}
            writing.clear()
            compactions, reads = compactions.result(), reads.result()

    for name, run in runs.items():
        assert run.returncode == 0, (name, run.stderr[-3000:])
    for proc in compactions:
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(reads) >= 3, "the reader did not overlap the writers"
    seen: dict[str, int] = {}
    for proc in reads:  # every read answers, and what one read saw, the next sees too
        for row in _frame(proc).to_dict("records"):
            assert row["n"] == row["pairs"], row  # each (cell, question) once
            assert row["pairs"] >= seen.get(row["experiment"], 0), (row, seen)
            seen[row["experiment"]] = row["pairs"]

    auditor = _machine(s3, tmp_path, "auditor")  # a fifth machine, an empty mirror
    verify = cli(tmp_path, "store", "verify", "--store", url, env=auditor)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]
    for name in specs:
        remote = _frame(cli(tmp_path, "query", OUTCOMES, "--experiment", name, "--store", url, "--format", "json",
                            env=auditor))
        expected = local[name]
        assert len(expected) == QUESTIONS * (2 if name == "alpha" else 1)
        pd.testing.assert_frame_equal(remote, expected)
    keys = s3.keys(url)
    assert {"compacted/alpha.json", "compacted/beta.json"} <= set(keys)
