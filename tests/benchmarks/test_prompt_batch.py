"""What batch-aligned prefix reuse costs on the embedded model (engines/llama_server.py).

Six prompts of ~350-550 tokens over SQuAD passages (several share three passages, as SuRe's and Post-Fusion's calls
of one question do) are evaluated with llama.cpp's Python bindings, in one process per batch size:
- from scratch each, at batch 64 (what engines/embedded.py starts the server with) and at 512 (llama.cpp's
  default): the prompt-evaluation time, i.e. the price of the smaller batch when nothing is reused;
- one after another with the aligned reuse: the tokens evaluated, and the last-token logits against the fresh ones
  (reported: the largest difference, which the alignment makes 0.0).

    .venv/bin/python -m pytest tests/benchmarks/test_prompt_batch.py --benchmark-only -p no:cacheprovider -s

RAGLEDGER_BENCH_BATCH_MODEL names the model (default: the 0.5B one; the 1.5B one is qwen2.5-coder-1.5b-instruct-q4km).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODEL = os.environ.get("RAGLEDGER_BENCH_BATCH_MODEL", "qwen2.5-coder-0.5b-instruct-awq-q4km")

# run in a fresh process per batch size: one llama.cpp context each, nothing else loaded
SCRIPT = r"""
import gzip, json, sys, time
import numpy as np
from llama_cpp import Llama
from engines.llama_server import aligned_prefix
from engines.models import ensure_model

model, batch, data = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with gzip.open(data, "rt") as f:
    paras = [p["context"] for a in json.load(f)["data"][:3] for p in a["paragraphs"]][:12]
llm = Llama(str(ensure_model(model, log=lambda *a, **k: None)), n_ctx=4096, n_batch=batch, n_ubatch=batch,
            n_threads=2, flash_attn=True, verbose=False)

def prompt(ps, q):
    listed = "".join(f"Passage {i + 1}: {p}\n" for i, p in enumerate(ps))
    return f"Answer the question using the passages.\n{listed}Question: {q}\nAnswer:"

prompts = [llm.tokenize(p.encode()) for p in (
    prompt(paras[0:3], "Who won?"), prompt(paras[0:3], "When was it?"), prompt(paras[0:2] + [paras[5]], "Who won?"),
    prompt(paras[0:3], "Who won? Candidate: Denver"), prompt(paras[6:9], "Where?"), prompt(paras[0:3], "Who won?"))]

def logits():
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm._n_vocab,)).copy()

started = time.perf_counter()
fresh = []
for tokens in prompts:
    llm.reset()
    llm.eval(tokens)
    fresh.append(logits())
fresh_s = time.perf_counter() - started
llm.reset()
evaluated, whole, diffs = 0, 0, []
for tokens, reference in zip(prompts, fresh):
    keep = aligned_prefix(llm._input_ids, tokens, whole, batch) if llm.n_tokens else 0
    llm.n_tokens = keep
    llm.eval(tokens[keep:])
    evaluated += len(tokens) - keep
    whole = len(tokens) // batch * batch
    diffs.append(float(np.abs(logits() - reference).max()))
print(json.dumps({"batch": batch, "tokens": sum(map(len, prompts)), "fresh_eval_s": round(fresh_s, 2),
                  "aligned_reuse_evaluated": evaluated, "max_logit_diff_vs_fresh": max(diffs)}))
"""


def test_what_batch_aligned_reuse_costs(benchmark, data_dir):
    def measure() -> dict:
        out = {}
        for batch in (64, 512):
            proc = subprocess.run([sys.executable, "-c", SCRIPT, MODEL, str(batch), str(data_dir / "squad" / "dev-v1.1.json.gz")],
                                  cwd=REPO, capture_output=True, text=True, timeout=1800, check=True)
            out[batch] = json.loads(proc.stdout.strip().splitlines()[-1])
        return out

    result = benchmark.pedantic(measure, rounds=1, iterations=1)
    report = {"model": MODEL, "batch_64": result[64], "batch_512": result[512],
              "fresh_eval_slowdown_pct": round(100 * (result[64]["fresh_eval_s"] / result[512]["fresh_eval_s"] - 1), 1)}
    print("prompt_batch:", json.dumps(report))
    assert result[64]["max_logit_diff_vs_fresh"] == 0.0 == result[512]["max_logit_diff_vs_fresh"]
