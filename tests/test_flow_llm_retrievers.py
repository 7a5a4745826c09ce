"""compress(X) and parametric (GenRead) through the whole flow, against the scripted OpenAI-compatible server:
the model is called during retrieval, its text is the RetrievalRecord text the reader sees, the calls are
counted and cached, and the Recall@k plot lands on the parent MLflow run."""

from __future__ import annotations

import json
import subprocess
import sys

from strategies.retrievers.llm_prompts import COMPRESS_USER, GENREAD_USER
from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_scripted import answer_from_context, make_spec, run_flow
from tests.test_flow_scripted import workspace as workspace  # the pytest fixture

GENREAD_HEAD = GENREAD_USER.split("{query}")[0]
COMPRESS_HEAD = COMPRESS_USER.split("{query}")[0]
BACKGROUND = {
    "Who won Super Bowl 50?": "Super Bowl 50 was won by the Denver Broncos.",
    "What is the capital of France?": "Paris is the capital of France.",
}


def scripted(system: str, prompt: str, body: dict) -> str:
    if prompt.startswith(GENREAD_HEAD):  # GenRead: a background document, only for questions the "model" knows
        question = prompt[len(GENREAD_HEAD) :].strip()
        return BACKGROUND.get(question, "I could not find anything about this topic.")
    if prompt.startswith(COMPRESS_HEAD):  # compression: keep the document's first sentence, marked
        document = prompt.split("Document:\n", 1)[1].rsplit("\n\nSummary:", 1)[0]
        return "SUMMARY " + document.split(".")[0] + "."
    return answer_from_context(system, prompt, body)


def test_compress_and_parametric_through_the_flow(workspace, prefect_harness):
    with ScriptedServer(answer=scripted) as server:
        spec = make_spec(workspace, server.base_url, readers=("concatenation",))
        spec["retrievers"] = ["compress(bm25@2)", "parametric", "hybrid(bm25@1,parametric)"]
        first = run_flow(spec)
        from tracking.store.query import query

        store = spec["tracking"]["store"]
        r = query(store, "SELECT retriever, qid, rank, pid, text FROM retrievals ORDER BY retriever, qid, rank")
        comp = r[r["retriever"] == "compress(bm25@2)"]
        # one hit per question that BM25 found anything for, holding exactly the model's summary
        assert len(comp) >= 4 and set(comp["rank"]) == {1}
        assert all(t.startswith("SUMMARY ") for t in comp["text"])
        assert all(p == f"compress:{q}" for p, q in zip(comp["pid"], comp["qid"], strict=True))
        gen = r[r["retriever"] == "parametric"].set_index("qid")
        assert len(gen) == 5 and gen.loc["q2", "pid"] == "genread:q2"
        assert gen.loc["q2", "text"] == "Paris is the capital of France."
        hyb = r[r["retriever"] == "hybrid(bm25@1,parametric)"]
        assert set(hyb.groupby("qid")["pid"].apply(lambda s: s.str.startswith("genread:").sum())) == {1}

        # every retrieval-time call was made once and counted; the readers saw the retrieved texts
        compress_calls = sum(1 for b in server.requests if b["messages"][-1]["content"].startswith(COMPRESS_HEAD))
        genread_calls = sum(1 for b in server.requests if b["messages"][-1]["content"].startswith(GENREAD_HEAD))
        user_prompts = [b["messages"][-1]["content"] for b in server.requests]
        genread_prompts = {p for p in user_prompts if p.startswith(GENREAD_HEAD)}
        # parametric and hybrid ask the same GenRead prompts; concurrent shards may both miss the LLM cache
        assert compress_calls == len(comp) and len(genread_prompts) == 5 and 5 <= genread_calls <= 10
        reader_calls = server.calls - compress_calls - genread_calls
        assert reader_calls == 15 and first["llm_calls"] == server.calls
        prompts = query(store, "SELECT retriever, qid, prompt FROM generations")
        p2 = prompts[(prompts["retriever"] == "parametric") & (prompts["qid"] == "q2")]["prompt"].iloc[0]
        assert "Paris is the capital of France." in p2
        cells = first["cells"]
        assert cells["parametric · concatenation · scripted"]["em"] == 40.0  # q1 and q2 answered from the documents
        assert cells["compress(bm25@2) · concatenation · scripted"]["questions"] == 5

        calls = server.calls
        second = run_flow(spec)
        assert server.calls == calls and second["llm_calls"] == 0 and second["cells"] == first["cells"]

    # the Recall@k plot and its numbers are on the parent run
    script = f"""
import json
from mlflow import MlflowClient
c = MlflowClient({spec['tracking']['mlflow_uri']!r})
print(json.dumps([a.path for a in c.list_artifacts({second['mlflow_parent_run_id']!r}, 'analysis')]))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert {"analysis/recall_at_k.png", "analysis/recall_at_k.csv"} <= set(json.loads(proc.stdout.strip().splitlines()[-1]))
