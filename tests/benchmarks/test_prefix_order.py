"""What prefix-ordered calls save on the embedded model (engines/call_gate.py).

The SuRe family and self-consistency part of configs/readers.yaml (sure, sure_base, sure_mcq, sure_generic,
sure_summaries, sure_ranking; concat_pf with 3 samples at temperature 0.7) runs twice on the real embedded model,
each in a fresh store and a fresh process (`ragledger run`, as a user runs it): once with the queued calls in
arrival order (RAGLEDGER_PREFIX_ORDER=0), once prefix-ordered (the default). 4 questions, one per shard, on the
1.5B model (the 0.5B one writes a single SuRe candidate on them, so SuRe's rounds 2-3, whose prompts share the
passages with other strategies' prompts, never run). Reported: the prompt tokens the llama.cpp server evaluated
by its own count against those sent, the wall time with the machine's load average and llama.cpp's own prompt
and generation seconds, how the gate admitted the calls (RAGLEDGER_GATE_LOG; each run's admissions.tsv), the
characters no order could avoid evaluating (the prompts sorted, round dependencies ignored), and which calls and
outcomes differ between the runs.

    .venv/bin/python -m pytest tests/benchmarks/test_prefix_order.py --benchmark-only -p no:cacheprovider -s

2 cores, nothing else running: 49 calls each; prompt tokens evaluated 31,947 in arrival order, 22,283
prefix-ordered (-30.3 %) of 45,387 sent; wall time 404.5 s and 284.0 s (-29.8 %); outcomes and generated texts
identical (the embedded server reuses a cached prefix only in whole batches, engines/llama_server.py).
RAGLEDGER_BENCH_PREFIX_QUESTIONS, RAGLEDGER_BENCH_PREFIX_SHARD and RAGLEDGER_BENCH_PREFIX_MODEL change the size.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from engines.embedded import _PROMPT_EVAL as PROMPT_EVAL

REPO = Path(__file__).resolve().parents[2]
RAGLEDGER = str(Path(sys.executable).with_name("ragledger"))
LIMIT = int(os.environ.get("RAGLEDGER_BENCH_PREFIX_QUESTIONS", "4"))
SHARD_SIZE = int(os.environ.get("RAGLEDGER_BENCH_PREFIX_SHARD", "1"))  # one question per shard: shards interleave
# the 1.5B model: the 0.5B one writes a single SuRe candidate, so SuRe's rounds 2-3 (most of the shared prefixes) never run
MODEL = os.environ.get("RAGLEDGER_BENCH_PREFIX_MODEL", "qwen2.5-coder-1.5b-instruct-q4km")


def _spec() -> dict:
    spec = yaml.safe_load((REPO / "configs" / "readers.yaml").read_text())
    keep = {"sure", "sure_base", "sure_mcq", "sure_generic", "sure_summaries", "sure_ranking"}
    readers = [r for r in spec["readers"] if (r if isinstance(r, str) else r["name"]) in keep]
    readers.append({"name": "concat_pf", "samples": 3})  # self-consistency: 3 samples of one prompt
    spec.update(name="prefix-order", readers=readers)
    spec["dataset"] = {**spec["dataset"], "limit": LIMIT}
    spec["execution"] = {"shard_size": SHARD_SIZE}
    if MODEL:
        spec["model"] = {**spec["model"], "embedded_model": MODEL}
    spec.pop("tracking", None)
    return spec


def _run(workdir: Path, prefix_order: bool) -> dict:
    workdir.mkdir(parents=True)
    (workdir / "spec.yaml").write_text(yaml.safe_dump(_spec(), sort_keys=False))
    env = {**os.environ, "RAGLEDGER_PREFIX_ORDER": "1" if prefix_order else "0",
           "RAGLEDGER_GATE_LOG": str(workdir / "admissions.jsonl")}
    for k in ("PREFECT_HOME", "PREFECT_LOCAL_STORAGE_PATH", "PREFECT_API_URL"):
        env.pop(k, None)
    started = time.perf_counter()
    out = subprocess.run([RAGLEDGER, "run", "spec.yaml", "--json", "run.json"], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=3600)
    command_s = time.perf_counter() - started
    load = os.getloadavg()  # the machine is shared: how busy it was over the run's last 1, 5 and 15 minutes
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    summary = json.loads((workdir / "run.json").read_text())
    sys.path.insert(0, str(REPO))
    from tracking.store.query import query

    store = workdir / ".ragledger" / "store"
    rows = query(store, "SELECT cell, qid, prediction, em FROM outcomes ORDER BY cell, qid").to_csv(index=False)
    outputs = query(store, "SELECT DISTINCT call_id, output FROM generations ORDER BY call_id").to_csv(index=False)
    return {"command_s": round(command_s, 1), "wall_time_s": summary["wall_time_s"],
            "load_average_at_end": [round(x, 1) for x in load],
            "llm_calls": summary["llm_calls"], "prompt_tokens_sent": summary["prompt_tokens_sent"],
            "prompt_tokens_evaluated": summary["prompt_tokens_evaluated"],
            "outcomes_sha256": hashlib.sha256(rows.encode()).hexdigest(),
            "outputs_sha256": hashlib.sha256(outputs.encode()).hexdigest(), **admissions(workdir, store)}


def compare_outputs(a: Path, b: Path) -> dict:
    """Which calls (by cache key) the two runs both made, and which of those returned different text: each named by
    its strategy, role and question, with the characters its prompt shared with the one before it in either run."""
    from tracking.store.query import query

    sql = "SELECT call_id, any_value(strategy) AS strategy, any_value(role) AS role, any_value(qid) AS qid, " \
          "any_value(output) AS output FROM generations WHERE NOT from_cache GROUP BY call_id"
    runs = [query(d / ".ragledger" / "store", sql).set_index("call_id") for d in (a, b)]
    common = runs[0].index.intersection(runs[1].index)
    differ = [c for c in common if runs[0].at[c, "output"] != runs[1].at[c, "output"]]
    outcomes = [query(d / ".ragledger" / "store", "SELECT strategy, qid, prediction FROM outcomes").set_index(["strategy", "qid"])
                for d in (a, b)]
    return {"calls_in_both": len(common), "calls_only_in_one": len(runs[0].index.symmetric_difference(runs[1].index)),
            "calls_with_different_output": [f"{runs[0].at[c, 'strategy']} {runs[0].at[c, 'role']} {runs[0].at[c, 'qid']}"
                                            for c in differ],
            "outcomes_that_differ": [f"{k[0]} {k[1]}" for k in outcomes[0].index
                                     if outcomes[0].at[k, "prediction"] != outcomes[1]["prediction"].get(k)]}


def admissions(workdir: Path, store: Path) -> dict:
    """What the call gate admitted, in order (RAGLEDGER_GATE_LOG), each call named by its generation record and
    given the prompt tokens the server evaluated for it (its log's per-completion report, in the same order: one
    slot); written to admissions.tsv beside the run. Also the characters any order could at best leave to evaluate:
    the prompts in lexicographic order, each sharing its longest possible prefix with the one before (round
    dependencies ignored, so a bound)."""
    from tracking.store.query import query

    log = [json.loads(line) for line in (workdir / "admissions.jsonl").read_text().splitlines()]
    gens = query(store, "SELECT DISTINCT system_prompt, prompt, strategy, round, role, qid, sample_index FROM generations")
    names, texts = {}, {}
    for g in gens.itertuples():
        text = f"{g.system_prompt}\x00{g.prompt}"
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        names.setdefault(digest, f"{g.qid[-6:]} r{g.round} {g.role}#{g.sample_index} {g.strategy}")
        texts[digest] = text
    server_log = next(iter((workdir / ".ragledger" / "logs").glob("embedded-server-*.log")), None)
    log_bytes = server_log.read_bytes() if server_log else b""
    evaluated = [int(n) for n in PROMPT_EVAL.findall(log_bytes)][1:]  # the first: the server's start-up check
    # llama.cpp's own timing of each completion (the start-up check's first): its prompt evaluation and its generation
    prompt_ms = [float(x) for x in re.findall(rb"prompt eval time =\s*([\d.]+) ms", log_bytes)][1:]
    generation_ms = [float(x) for x in re.findall(rb"_print:\s+eval time =\s*([\d.]+) ms", log_bytes)][1:]
    if len(evaluated) != len(log):
        evaluated = [None] * len(log)
    with (workdir / "admissions.tsv").open("w") as f:
        f.write("i\tqueued\tshared_chars\tchars\tevaluated_tokens\tcall\n")
        for i, (a, n) in enumerate(zip(log, evaluated, strict=True)):
            f.write(f"{i}\t{a['queued']}\t{a['shared']}\t{a['chars']}\t{n}\t{names.get(a['digest'], '?')}\n")
    from engines.call_gate import common_prefix_len

    best = sorted(texts.get(a["digest"], "") for a in log)
    lexicographic = sum(map(len, best)) - sum(common_prefix_len(a, b) for a, b in itertools.pairwise(best))
    chars = sum(a["chars"] for a in log)
    return {"server_prompt_eval_s": round(sum(prompt_ms) / 1000, 1), "server_generation_s": round(sum(generation_ms) / 1000, 1),
            "gate_processes": len({(a["pid"], a["gate"]) for a in log}),
            "admitted_from_a_queue_of_2_or_more": sum(a["queued"] >= 2 for a in log),
            "longest_queue": max((a["queued"] for a in log), default=0),
            "chars_sent": chars, "chars_not_shared_with_previous": chars - sum(a["shared"] for a in log),
            "distinct_prompt_chars_lexicographic": lexicographic}


def test_prefix_order_saves_prompt_evaluation(tmp_path, benchmark, record_result):
    from engines.embedded import llama_server_available

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
        "identical_outputs": ordered["outputs_sha256"] == fifo["outputs_sha256"],
        **compare_outputs(tmp_path / "arrival-order", tmp_path / "prefix-order"),
        "runs": str(tmp_path),
    }
    record_result("prefix_order", figures)
    # both runs reached the model; their calls can differ where an output did (compare_outputs names them)
    assert fifo["llm_calls"] > 0 and ordered["llm_calls"] > 0
