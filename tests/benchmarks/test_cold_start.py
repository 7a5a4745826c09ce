"""P1 cold: `ragledger run SPEC` as a user runs it (a fresh process started from a shell, the BM25 index already
built) beside a fresh bare-loop script process timed the same way, both against the same test server, in one run.

The server, the spec and the loop are those of tests/benchmarks/test_flow_throughput.py (2,000 SQuAD dev
questions, bm25@5, Post-Fusion, concurrency 64, answers after 100 ms). Reported, never asserted on time:
- the run's own ratio: calls per second over the run's wall time (its summary's `wall_time_s`: from the start of
  the run's work, the warm-up that retrieves and sends the first calls before Prefect is up, to the end of its
  flow before the MLflow logging) against the bare loop's calls per second over its loop (target >= 0.90);
- the command-time ratio: the `ragledger run` command's time over the bare-loop script's command time, both
  from process start to exit (target <= 1.3);
- for both, the seconds from the command's start to its first model call, as the server saw it (target: ~2 s);
- then the same command again, answered from the caches: its command time and its model calls (0).

Before the timed commands, one `ragledger run` of 20 questions into another store in the same directory builds
the BM25 index if needed and creates the directory's Prefect and MLflow databases, as a user's earlier runs would.

Skipped by default (`--benchmark-skip`). Run:
    .venv/bin/python -m pytest tests/benchmarks/test_cold_start.py --benchmark-only -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.benchmarks.test_flow_throughput import (  # noqa: F401  (latency_server is a fixture)
    CALLS,
    CONCURRENCY,
    DELAY_S,
    QUESTIONS,
    K,
    latency_server,
)

REPO = Path(__file__).resolve().parents[2]
RAGLEDGER = Path(sys.executable).parent / "ragledger"

# the bare loop as a user would write it: the SQuAD file read with the standard library, the `openai` client's
# default transport, a semaphore of 64; it reports its own loop time beside the command time taken from outside
BARE_LOOP_SCRIPT = """
import asyncio, gzip, json, sys, time
from openai import AsyncOpenAI

base_url, path, n, k, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with gzip.open(path, "rt", encoding="utf-8") as fh:
    squad = json.load(fh)
questions = [qa["question"] for art in squad["data"] for par in art["paragraphs"] for qa in par["qas"]][:n]
prompts = [f"Passage {i}: ...\\nQuestion: {q}" for q in questions for i in range(k)]

async def main():
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt):
        async with gate:
            r = await client.chat.completions.create(model="latency", max_tokens=16, temperature=0.0,
                                                     messages=[{"role": "user", "content": prompt}])
            return r.choices[0].message.content or ""

    answers = await asyncio.gather(*(one(p) for p in prompts))
    await client.close()
    return len(answers)

t = time.perf_counter()
calls = asyncio.run(main())
print(json.dumps({"calls": calls, "loop_s": time.perf_counter() - t}))
"""


def user_env() -> dict[str, str]:
    """A shell's environment: no Prefect API or home from the pytest process, the bench key set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env["RAGLEDGER_BENCH_KEY"] = "unused"
    return env


def timed(args: list[str], cwd: Path) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=user_env(), capture_output=True, text=True)
    seconds = time.perf_counter() - t
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-4000:])
    return seconds, proc.stdout


def server_stats(base_url: str, reset: bool = False) -> dict:
    """The latency server's count and the wall-clock time its first completion request arrived (tests/fakes)."""
    import urllib.request

    url = base_url.removesuffix("/v1") + ("/stats/reset" if reset else "/stats")
    with urllib.request.urlopen(urllib.request.Request(url, method="POST" if reset else "GET"), timeout=10) as r:
        return json.loads(r.read())


def first_call_after(args: list[str], cwd: Path, base_url: str) -> tuple[float, str, float]:
    """(command seconds, stdout, seconds from the command's start to its first model call at the server)."""
    server_stats(base_url, reset=True)
    started = time.time()
    seconds, out = timed(args, cwd)
    return seconds, out, round(server_stats(base_url)["first_request_at"] - started, 2)


def write_spec(path: Path, base_url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "p1-cold",
        "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": QUESTIONS, "seed": 0},
        "retrievers": [f"bm25@{K}"],
        "readers": ["post_fusion"],
        "model": {"backend": "openai", "name": "latency", "base_url": base_url, "api_key_env": "RAGLEDGER_BENCH_KEY",
                  "concurrency": CONCURRENCY, "max_tokens": 16},
        "execution": {"shard_size": 250},
        "tracking": {"store": "store"},
    }))
    return path


def test_p1_cold_ragledger_run_beside_a_fresh_bare_loop(benchmark, latency_server, tmp_path,  # noqa: F811
                                                        record_result):
    from ragledger.paths import data_dir

    work = tmp_path / "shell"
    work.mkdir()
    spec = write_spec(work / "p1-cold.yaml", latency_server)
    # index, Prefect and MLflow databases of this directory: a user's earlier run
    timed([str(RAGLEDGER), "run", str(spec), "--limit", "20", "--store", "warm-store"], work)

    bare_s, out, bare_first = first_call_after([sys.executable, "-c", BARE_LOOP_SCRIPT, latency_server,
                                                str(data_dir() / "squad" / "dev-v1.1.json.gz"), str(QUESTIONS), str(K),
                                                str(CONCURRENCY)], work, latency_server)
    bare = json.loads(out.strip().splitlines()[-1])
    assert bare["calls"] == CALLS

    summary_path = work / "summary.json"
    command = [str(RAGLEDGER), "run", str(spec), "--json", str(summary_path)]
    times: list[tuple[float, str, float]] = []
    benchmark.pedantic(lambda: times.append(first_call_after(command, work, latency_server)), rounds=1, iterations=1)
    run_s, _, run_first = times[0]
    first = json.loads(summary_path.read_text())
    assert 0.99 * CALLS <= first["llm_calls"] <= CALLS, first["llm_calls"]

    rerun_s, _ = timed(command, work)
    rerun = json.loads(summary_path.read_text())
    assert rerun["llm_calls"] == 0 and rerun["cells"] == first["cells"]

    bare_rate = bare["calls"] / bare["loop_s"]
    run_rate = first["llm_calls"] / first["wall_time_s"]
    record_result("p1_cold_fresh_processes", {
        "bare_loop_command_s": round(bare_s, 2), "bare_loop_s": round(bare["loop_s"], 2),
        "bare_loop_calls_per_s": round(bare_rate, 1), "bare_loop_first_call_after_s": bare_first,
        "run_command_s": round(run_s, 2), "run_first_call_after_s": run_first, "run_wall_time_s": first["wall_time_s"],
        "run_calls": first["llm_calls"], "run_calls_per_s": round(run_rate, 1),
        "run_stage_seconds": first["stage_seconds"],
        "run_ratio_calls_per_s": round(run_rate / bare_rate, 3), "run_ratio_target": ">= 0.90",
        "command_time_ratio": round(run_s / bare_s, 3), "command_time_ratio_target": "<= 1.3",
        "command_outside_flow_s": round(run_s - first["wall_time_s"], 2),
        "cached_rerun_command_s": round(rerun_s, 2), "cached_rerun_wall_time_s": rerun["wall_time_s"],
        "cached_rerun_model_calls": rerun["llm_calls"], "ideal_s": CALLS / CONCURRENCY * DELAY_S,
    })
