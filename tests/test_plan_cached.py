"""flows/cached.py: a fully cached rerun answered from the plan and the store, starting nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_readers import PASSAGES, QUESTIONS, logprob_of, scripted_model
from tests.test_plan_pinning import make_spec

HEAVY = ("prefect", "jnius", "pyserini", "torch", "sentence_transformers", "mlflow", "llama_cpp", "onnxruntime")
PROBE = f"""
import json, sys
from flows.cached import cached_result
summary = cached_result(json.loads(sys.argv[1]))
print(json.dumps({{"summary": summary, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def as_json(value) -> str:
    return json.dumps(value, sort_keys=True, default=float)


def cached_in_fresh_process(spec: dict) -> tuple[dict | None, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(spec)], capture_output=True, text=True, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return answer["summary"], answer["heavy"]


def test_a_fully_cached_rerun_is_answered_from_the_store(tmp_path, prefect_harness):
    from flows.cached import cached_result
    from flows.experiment import experiment_flow

    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp_path / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    spec = make_spec(tmp_path, ["concatenation", "sure"])
    assert cached_result(spec) is None  # nothing stored yet
    with ScriptedServer(answer=scripted_model, logprob_fn=logprob_of) as server:
        ran = experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"], server.base_url)

    summary, heavy = cached_in_fresh_process(spec)
    assert heavy == []
    assert summary is not None and summary["manifest"] == ran["manifest"]
    assert as_json(summary["cells"]) == as_json(ran["cells"])  # NaN metrics (no gold) compare equal as JSON
    assert summary["llm_calls"] == 0 and summary["tasks_from_cache"] == summary["tasks_total"] == ran["tasks_total"]
    assert summary["mlflow_parent_run_id"] == ran["mlflow_parent_run_id"]

    # another reader is a cell the store does not have; a lost outcome segment must be recomputed
    assert cached_result(make_spec(tmp_path, ["concatenation", "sure", "post_fusion"])) is None
    assert cached_result(make_spec(tmp_path, ["concatenation"])) is None  # no run had exactly these cells
    segments = json.loads(Path(ran["manifest"]).read_text())["segments"]
    Path(segments["none · sure · scripted"]["outcomes"][0]).unlink()
    assert cached_result(spec) is None
