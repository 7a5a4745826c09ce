"""What prefix-ordered calls save on the embedded model (ragledger/call_gate.py).

The SuRe family and self-consistency part of configs/readers.yaml run twice on the real embedded model, each in a
fresh store and a fresh process (`ragledger run`, as a user runs it): once with the queued calls in arrival order
(RAGLEDGER_PREFIX_ORDER=0), once prefix-ordered (the default). Reported: the prompt tokens the llama.cpp server
evaluated by its own count (`prompt_tokens_evaluated` of the run summary) against the prompt tokens sent, the
run's wall time, and whether the two runs' outcome tables are identical.

    .venv/bin/python -m pytest tests/benchmarks/test_prefix_order.py --benchmark-only -p no:cacheprovider -s

Targets: prompt tokens evaluated -30 % and wall time -20 % with prefix order; identical outcomes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RAGLEDGER = str(Path(sys.executable).with_name("ragledger"))
LIMIT = int(os.environ.get("RAGLEDGER_BENCH_PREFIX_QUESTIONS", "4"))


def _spec() -> dict:
    spec = yaml.safe_load((REPO / "configs" / "readers.yaml").read_text())
    keep = {"sure", "sure_base", "sure_mcq", "sure_generic", "sure_summaries", "sure_ranking"}
    readers = [r for r in spec["readers"] if (r if isinstance(r, str) else r["name"]) in keep]
    readers.append({"name": "concat_pf", "samples": 3})  # self-consistency: 3 samples of one prompt
    spec.update(name="prefix-order", readers=readers)
    spec["dataset"] = {**spec["dataset"], "limit": LIMIT}
    spec["execution"] = {"shard_size": LIMIT}
    spec.pop("tracking", None)
    return spec


def _run(workdir: Path, prefix_order: bool) -> dict:
    workdir.mkdir(parents=True)
    (workdir / "spec.yaml").write_text(yaml.safe_dump(_spec(), sort_keys=False))
    env = {**os.environ, "RAGLEDGER_PREFIX_ORDER": "1" if prefix_order else "0"}
    for k in ("PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH", "PREFECT_API_URL"):
        env.pop(k, None)
    started = time.perf_counter()
    out = subprocess.run([RAGLEDGER, "run", "spec.yaml", "--json", "run.json"], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=3600)
    command_s = time.perf_counter() - started
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads((workdir / "run.json").read_text())
    sys.path.insert(0, str(REPO))
    from tracking.query import query

    rows = query(workdir / ".ragledger" / "store",
                 "SELECT cell, qid, prediction, em FROM outcomes ORDER BY cell, qid").to_csv(index=False)
    return {"command_s": round(command_s, 1), "wall_time_s": summary["wall_time_s"],
            "llm_calls": summary["llm_calls"], "prompt_tokens_sent": summary["prompt_tokens_sent"],
            "prompt_tokens_evaluated": summary["prompt_tokens_evaluated"],
            "outcomes_sha256": hashlib.sha256(rows.encode()).hexdigest()}


def test_prefix_order_saves_prompt_evaluation(tmp_path, benchmark, record_result):
    from ragledger.embedded import llama_server_available

    if not llama_server_available():
        pytest.skip("the embedded model is not installed (bash infra/setup.sh)")
    fifo = _run(tmp_path / "arrival-order", prefix_order=False)
    ordered = benchmark.pedantic(lambda: _run(tmp_path / "prefix-order", prefix_order=True), rounds=1, iterations=1)
    figures = {
        "questions": LIMIT,
        "arrival_order": fifo,
        "prefix_order": ordered,
        "evaluated_change_pct": round(100 * (ordered["prompt_tokens_evaluated"] / fifo["prompt_tokens_evaluated"] - 1), 1),
        "wall_time_change_pct": round(100 * (ordered["wall_time_s"] / fifo["wall_time_s"] - 1), 1),
        "identical_outcomes": ordered["outcomes_sha256"] == fifo["outcomes_sha256"],
    }
    record_result("prefix_order", figures)
    assert fifo["llm_calls"] == ordered["llm_calls"] > 0  # the same calls, each made once
