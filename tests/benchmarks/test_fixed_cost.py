"""The fixed cost of a run: `ragledger run` of a small experiment as a user runs it (a fresh process from the shell)
beside a fresh bare-loop script process making the same calls, both against the test server of
tests/benchmarks/test_flow_throughput.py (answers after 100 ms, concurrency 64), in one run. Reported, never
asserted on time:
- 20 SQuAD questions, bm25@5, Concatenation (20 calls), with no Prefect server running (each run starts its
  temporary one), in a new store each time: through the warm runner the run before started as it ended
  (ragledger/warm_start.py), and in the command's own process (`RAGLEDGER_WARM=0`, as a first command in a
  directory runs): command seconds, the run's stage seconds (`start-up` counts from the head start to the flow's
  start), the bare loop's command seconds;
- the same command again, answered from the store (0 calls);
- 2,000 questions (1,999 distinct calls) beside the bare loop of the same calls: the command-time ratio, right after
  the small runs (their recorders recording beside it and the bare loops), again once they have recorded them, both
  embedding the answers for the semantic match afresh, and once more with those embeddings kept; through the warm
  runner, and the first of them again in its own process;
- 20 questions while the directory's `ragledger server` runs: through its warm runner, and in the command's own
  process.

Before the timed commands, one run of 20 questions into another store builds the BM25 index if needed and creates
the directory's Prefect and MLflow databases, as a user's earlier runs would (and, ending, starts the directory's
warm runner). Each small command runs ROUNDS times, alternating with its bare loop; the medians are recorded.

Skipped by default (`--benchmark-skip`). Run:
    .venv/bin/python -m pytest tests/benchmarks/test_fixed_cost.py --benchmark-only -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

from tests.benchmarks.test_cold_start import BARE_LOOP_SCRIPT, RAGLEDGER, fresh_cache_home, timed
from tests.benchmarks.test_flow_throughput import CONCURRENCY, latency_server  # noqa: F401  (a fixture)
from tests.servers import free_port

ROUNDS = 3
SMALL = 20


def write_spec(path: Path, base_url: str, questions: int) -> Path:
    path.write_text(yaml.safe_dump({
        "name": f"fixed-cost-{questions}",
        "dataset": {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": questions, "seed": 0},
        "retrievers": ["bm25@5"],
        "readers": ["concatenation"],
        "model": {"backend": "openai", "name": "latency", "base_url": base_url, "api_key_env": "RAGLEDGER_BENCH_KEY",
                  "concurrency": CONCURRENCY, "max_tokens": 16},
        "tracking": {"store": "store"},
    }))
    return path


def bare_loop(work: Path, base_url: str, questions: int) -> tuple[float, dict]:
    """The bare-loop script (tests/benchmarks/test_cold_start.py) making one call per question: command seconds."""
    from core.paths import data_dir

    seconds, out = timed([sys.executable, "-c", BARE_LOOP_SCRIPT, base_url, str(data_dir() / "squad" / "dev-v1.1.json.gz"),
                          str(questions), "1", str(CONCURRENCY)], work)
    return seconds, json.loads(out.strip().splitlines()[-1])


def ragledger_run(work: Path, spec: Path, store: str, own_process: bool = False) -> tuple[float, dict]:
    """`own_process`: not through the directory's warm runner (ragledger/warm_start.py), as without one."""
    out = work / f"{store}.json"
    seconds, _ = timed([*shell(own_process), str(RAGLEDGER), "run", str(spec), "--store", store, "--json", str(out)],
                       work)
    return seconds, json.loads(out.read_text())


def shell(own_process: bool = False) -> list[str]:
    """A user's shell: the warm runner on (tests/conftest.py turns it off for the tests), or off for this command."""
    return ["env", "RAGLEDGER_WARM=0" if own_process else "RAGLEDGER_WARM=1"]


def small_runs(work: Path, base_url: str, spec: Path, tag: str, own_process: bool = False) -> dict:
    """ROUNDS first runs of the small spec (a new store each), each after a fresh bare loop: their medians."""
    runs, bares, stages = [], [], []
    for i in range(ROUNDS):
        bares.append(bare_loop(work, base_url, SMALL)[0])
        seconds, summary = ragledger_run(work, spec, f"{tag}-{i}", own_process)
        assert summary["llm_calls"] == SMALL, summary["llm_calls"]
        runs.append(seconds)
        stages.append(summary["stage_seconds"])
    return {f"{tag}_command_s": [round(s, 2) for s in runs], f"{tag}_command_median_s": round(statistics.median(runs), 2),
            f"{tag}_bare_loop_command_median_s": round(statistics.median(bares), 2),
            f"{tag}_stage_seconds": stages}


def test_the_fixed_cost_of_a_small_run(benchmark, latency_server, tmp_path, record_result):  # noqa: F811
    work = tmp_path / "shell"
    work.mkdir()
    fresh_cache_home(work / "cache-home")
    spec = write_spec(work / "small.yaml", latency_server, SMALL)
    timed([*shell(), str(RAGLEDGER), "run", str(spec), "--store", "warm-store"], work)  # starts the warm runner

    figures: dict = {}
    try:
        benchmark.pedantic(lambda: figures.update(small_runs(work, latency_server, spec, "no_server")), rounds=1,
                           iterations=1)
        figures |= small_runs(work, latency_server, spec, "no_server_own_process", own_process=True)
        cached = [timed([*shell(), str(RAGLEDGER), "run", str(spec), "--store", "no_server-0"], work)[0]
                  for _ in range(ROUNDS)]
        figures["cached_rerun_command_s"] = [round(s, 2) for s in cached]

        large = write_spec(work / "large.yaml", latency_server, 2000)
        figures |= large_run(work, latency_server, large, "large")  # the small runs' recorders still recording
        recorders_done(work / "cache-home")
        figures |= large_run(work, latency_server, large, "large_quiet")
        recorders_done(work / "cache-home")
        figures |= large_run(work, latency_server, large, "large_quiet_own_process", own_process=True)
        recorders_done(work / "cache-home")
        figures |= large_run(work, latency_server, large, "large_kept", keep_embeddings=True)

        timed([str(RAGLEDGER), "server", "start", "--port", str(free_port())], work)  # a runner that stays, instead
        figures |= small_runs(work, latency_server, spec, "local_server")
        figures |= small_runs(work, latency_server, spec, "local_server_own_process", own_process=True)
    finally:
        timed([str(RAGLEDGER), "server", "stop"], work)  # the Prefect server and the warm runner
    record_result("fixed_cost", figures)


def large_run(work: Path, base_url: str, spec: Path, tag: str, keep_embeddings: bool = False,
              own_process: bool = False) -> dict:
    """The 2,000-question run (a new store) between two bare loops: its command time, and its ratio to their mean. It
    embeds its answers for the semantic match as a first run over these questions on this machine would
    (engines/vector_cache.py), or with `keep_embeddings` finds them kept by the run before."""
    import shutil

    if not keep_embeddings:
        shutil.rmtree(work / "cache-home" / "embeddings", ignore_errors=True)
    bare_s, bare = bare_loop(work, base_url, 2000)
    run_s, summary = ragledger_run(work, spec, tag, own_process)
    bare_after_s, _ = bare_loop(work, base_url, 2000)
    return {f"{tag}_calls": summary["llm_calls"], f"{tag}_bare_loop_calls": bare["calls"],
            f"{tag}_command_s": round(run_s, 2), f"{tag}_bare_loop_command_s": [round(bare_s, 2), round(bare_after_s, 2)],
            f"{tag}_command_time_ratio": round(run_s / ((bare_s + bare_after_s) / 2), 2),
            f"{tag}_stage_seconds": summary["stage_seconds"]}


def recorders_done(home: Path, timeout_s: float = 600) -> None:
    """Until the recorders of the runs so far have recorded them (ragledger/recorder.py): nothing queued, and no
    recorder holding the lock."""
    import fcntl
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not list((home / "recordings").glob("*.json")):
            with open(home / "recorder.lock", "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    pass
        time.sleep(0.5)
    raise AssertionError(f"the recorders did not finish within {timeout_s} s")
