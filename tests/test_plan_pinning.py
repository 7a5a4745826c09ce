"""Pins what the experiment flow produces for one small scripted spec: the outcome rows and every stage's cache key.

Keys chain from the dataset path, the store root and the spec's model identity, so the workspace sits at a fixed path
and the spec names a fixed base_url (the scripted server's own, on a free port, is passed to the flow beside it:
it reaches the LLM-call cache's keys, not the stage keys). A changed value here means existing stores and Prefect's
cached stage results no longer hit.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.test_flow_readers import PASSAGES, QUESTIONS, logprob_of, scripted_model

WORKSPACE = Path(tempfile.gettempdir()) / "ragledger-plan-pinning"
SPEC_BASE_URL = "http://127.0.0.1:9/v1"  # enters the model identity of the keys; never called
READERS = ["concatenation", "post_fusion", {"name": "post_fusion", "samples": 2, "vote": "first"}, "concat_pf", "sure",
           "refeed"]


def answer(system: str, prompt: str, body: dict) -> str:
    """tests/test_flow_readers.py's scripted model, which also knows France's capital closed book (Fig. 7 with an empty
    context), so the closed-book filter drops a question."""
    if prompt.startswith("Context:\n\nQuestion:\nWhat is the capital of France?"):
        return "Paris"
    return scripted_model(system, prompt, body)


def make_spec(ws: Path, readers: list, closed_book_filter: bool = False) -> dict:
    return {
        "name": "pinning",
        "dataset": {"name": "jsonl", "path": str(ws / "questions.jsonl"), "closed_book_filter": closed_book_filter},
        "corpus": {"name": "jsonl", "paths": [str(ws / "corpus.jsonl")]},
        "retrievers": ["bm25@2", "none"],
        "readers": readers,
        "model": {"backend": "openai", "name": "scripted", "base_url": SPEC_BASE_URL, "concurrency": 8},
        "execution": {"shard_size": 2},
        "tracking": {"store": str(ws / "store"), "mlflow_uri": f"sqlite:///{ws / 'mlflow.db'}"},
    }


@pytest.fixture
def pinned_workspace():
    shutil.rmtree(WORKSPACE, ignore_errors=True)
    WORKSPACE.mkdir(parents=True)
    (WORKSPACE / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (WORKSPACE / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    yield WORKSPACE
    shutil.rmtree(WORKSPACE, ignore_errors=True)


@pytest.fixture
def submitted(monkeypatch) -> dict[str, str]:
    """Every stage task the flow submits: a readable label -> its stage_key (the task's cache key)."""
    from flows.pipeline import Pipeline

    keys: dict[str, str] = {}
    submit = Pipeline.submit

    def recording(self, stage, task_obj, params, then):
        inputs = described(params)
        label = "|".join(str(inputs.get(p, "")) for p in ("retriever_name", "reader", "round_no"))
        label = f"{stage}|{label}|{','.join(inputs['qids'])}"
        assert label not in keys, f"two tasks submitted as {label}"  # each task once, and no label collides
        keys[label] = inputs["stage_key"]
        return submit(self, stage, task_obj, params, then)

    monkeypatch.setattr(Pipeline, "submit", recording)
    return keys


def described(params: dict) -> dict:
    """A task's inputs by the names of the stage functions' keyword arguments, whether passed one by one or as one
    stage object (its `key`, `qids`, `retriever`, `reader`, `round_no`)."""
    stage = params.get("stage")
    if stage is None:
        return params
    return {"stage_key": stage.key, "qids": list(stage.qids), "retriever_name": getattr(stage, "retriever", ""),
            "reader": getattr(stage, "reader", ""), "round_no": getattr(stage, "round_no", "")}


def outcome_digest(store_root: str) -> tuple[list[tuple], str, str]:
    """(cell, qid, prediction, em) of every outcome, a hash of the whole rows (sorted; created_at left out: it is the
    write time), and the same hash with the `reader` column under its earlier name `strategy`."""
    from tracking.store.events import EventStore

    df = EventStore(store_root).read("outcomes", "pinning").drop(columns=["created_at"])
    df = df.sort_values(["cell", "qid"]).reset_index(drop=True)
    rows = json.loads(df.to_json(orient="records"))
    strategy_named = [{("strategy" if k == "reader" else k): v for k, v in r.items()} for r in rows]
    return [(r["cell"], r["qid"], r["prediction"], r["em"]) for r in rows], _digest(rows), _digest(strategy_named)


def _digest(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def run(spec: dict, base_url: str) -> dict:
    from flows.execute import experiment_flow

    return experiment_flow(spec, spec["tracking"]["store"], spec["tracking"]["mlflow_uri"], base_url)


def test_outcomes_and_stage_keys_are_pinned(pinned_workspace, submitted, prefect_harness):
    with ScriptedServer(answer=answer, logprob_fn=logprob_of) as server:
        spec = make_spec(pinned_workspace, READERS)
        summary = run(spec, server.base_url)
        keys = dict(submitted)
        rows, digest, strategy_named_digest = outcome_digest(spec["tracking"]["store"])
        # the closed-book filter (seed 001 §4): its own keys, and the cells' on the questions it leaves
        filtered = make_spec(pinned_workspace, ["concatenation"], closed_book_filter=True)
        submitted.clear()
        filtered_summary = run(filtered, server.base_url)
        filter_keys = dict(submitted)
    assert sorted(summary["cells"]) == sorted(CELLS)
    # with `reader` named `strategy` the rows hash to the strategy-named pin: the values are those rows', only the name differs
    assert strategy_named_digest == OUTCOMES_DIGEST_STRATEGY_NAMED
    assert digest == OUTCOMES_DIGEST
    assert [list(r) for r in rows] == OUTCOME_ROWS
    assert keys == STAGE_KEYS
    assert filtered_summary["closed_book_dropped"] == 1 and filtered_summary["questions"] == 2
    assert filter_keys == FILTER_STAGE_KEYS


CELLS = [
    'bm25@2 · concat_pf · scripted',
    'bm25@2 · concatenation · scripted',
    'bm25@2 · post_fusion · scripted',
    'bm25@2 · post_fusion(samples=2,vote=first) · scripted',
    'bm25@2 · refeed · scripted',
    'bm25@2 · sure · scripted',
    'none · concat_pf · scripted',
    'none · concatenation · scripted',
    'none · post_fusion · scripted',
    'none · post_fusion(samples=2,vote=first) · scripted',
    'none · refeed · scripted',
    'none · sure · scripted',
]
OUTCOMES_DIGEST = '79ba7fdf0373e758'
OUTCOMES_DIGEST_STRATEGY_NAMED = '6a19ed9ad742084e'
OUTCOME_ROWS = [
    ['bm25@2 · concat_pf · scripted', 'q1', 'Denver Broncos', 1.0],
    ['bm25@2 · concat_pf · scripted', 'q2', 'Paris', 1.0],
    ['bm25@2 · concat_pf · scripted', 'q3', 'Everest', 1.0],
    ['bm25@2 · concatenation · scripted', 'q1', 'Denver Broncos', 1.0],
    ['bm25@2 · concatenation · scripted', 'q2', 'unknown', 0.0],
    ['bm25@2 · concatenation · scripted', 'q3', 'Everest', 1.0],
    ['bm25@2 · post_fusion · scripted', 'q1', 'Denver Broncos', 1.0],
    ['bm25@2 · post_fusion · scripted', 'q2', 'Paris', 1.0],
    ['bm25@2 · post_fusion · scripted', 'q3', 'Everest', 1.0],
    ['bm25@2 · post_fusion(samples=2,vote=first) · scripted', 'q1', 'Denver Broncos', 1.0],
    ['bm25@2 · post_fusion(samples=2,vote=first) · scripted', 'q2', 'Paris', 1.0],
    ['bm25@2 · post_fusion(samples=2,vote=first) · scripted', 'q3', 'Everest', 1.0],
    ['bm25@2 · refeed · scripted', 'q1', 'Denver Broncos', 1.0],
    ['bm25@2 · refeed · scripted', 'q2', 'Paris', 1.0],
    ['bm25@2 · refeed · scripted', 'q3', 'K2', 0.0],
    ['bm25@2 · sure · scripted', 'q1', 'Denver Broncos', 1.0],
    ['bm25@2 · sure · scripted', 'q2', 'Paris', 1.0],
    ['bm25@2 · sure · scripted', 'q3', 'Everest', 1.0],
    ['none · concat_pf · scripted', 'q1', 'unknown', 0.0],
    ['none · concat_pf · scripted', 'q2', 'Paris', 1.0],
    ['none · concat_pf · scripted', 'q3', 'unknown', 0.0],
    ['none · concatenation · scripted', 'q1', 'unknown', 0.0],
    ['none · concatenation · scripted', 'q2', 'Paris', 1.0],
    ['none · concatenation · scripted', 'q3', 'unknown', 0.0],
    ['none · post_fusion · scripted', 'q1', 'unknown', 0.0],
    ['none · post_fusion · scripted', 'q2', 'unknown', 0.0],
    ['none · post_fusion · scripted', 'q3', 'unknown', 0.0],
    ['none · post_fusion(samples=2,vote=first) · scripted', 'q1', 'unknown', 0.0],
    ['none · post_fusion(samples=2,vote=first) · scripted', 'q2', 'unknown', 0.0],
    ['none · post_fusion(samples=2,vote=first) · scripted', 'q3', 'unknown', 0.0],
    ['none · refeed · scripted', 'q1', 'Carolina Panthers', 0.0],
    ['none · refeed · scripted', 'q2', 'Paris', 1.0],
    ['none · refeed · scripted', 'q3', 'K2', 0.0],
    ['none · sure · scripted', 'q1', 'Denver Broncos', 1.0],
    ['none · sure · scripted', 'q2', 'Paris', 1.0],
    ['none · sure · scripted', 'q3', 'Everest', 1.0],
]
STAGE_KEYS = {
    'evaluate|bm25@2|concat_pf||q1,q2': 'f913fbc06838bfacadb35925dfba9ce1',
    'evaluate|bm25@2|concat_pf||q3': '1856c9376286459a56d2ed93a82a3cd5',
    'evaluate|bm25@2|concatenation||q1,q2': '6e25c86e980c1833716aad41824f823c',
    'evaluate|bm25@2|concatenation||q3': 'f27b43ff67faebae3bc92893eaae8bfa',
    'evaluate|bm25@2|post_fusion(samples=2,vote=first)||q1,q2': 'fff66096ec9a03646d8a94884ee71180',
    'evaluate|bm25@2|post_fusion(samples=2,vote=first)||q3': '8bdcb1650993eaeed9df5aade822579a',
    'evaluate|bm25@2|post_fusion||q1,q2': '44139ba71055e513c0eae9d81f045a27',
    'evaluate|bm25@2|post_fusion||q3': 'dd523565c64522995aa5bc9055c478f6',
    'evaluate|bm25@2|refeed||q1,q2': '5a2b7279abef734e1c2f71009513a0be',
    'evaluate|bm25@2|refeed||q3': 'b42868c10438c54fa6d70655684e75e5',
    'evaluate|bm25@2|sure||q1,q2': 'ce5357df446cda12a51564a857d247d2',
    'evaluate|bm25@2|sure||q3': 'bee458d9c722331e9e2bd99dddbb1de9',
    'evaluate|none|concat_pf||q1,q2': '42f6796a84028320cfc1786a025c8125',
    'evaluate|none|concat_pf||q3': 'e7fba03eb82a6dc858192a92d1185a25',
    'evaluate|none|concatenation||q1,q2': '2f6c50dd0f663efaa09dcd6c919e068d',
    'evaluate|none|concatenation||q3': '3b148740217e8d62a800ea8a6251cd62',
    'evaluate|none|post_fusion(samples=2,vote=first)||q1,q2': '2b83de6da5f7ee38b3a1ba481156d8b0',
    'evaluate|none|post_fusion(samples=2,vote=first)||q3': '742df33a06aba6c040fd66c007e39790',
    'evaluate|none|post_fusion||q1,q2': 'faaab879dac79b5334cce07c67482190',
    'evaluate|none|post_fusion||q3': 'd9e434132acbee146eb50d3eb52fb15a',
    'evaluate|none|refeed||q1,q2': 'f5f709ab37425ad705bba0a6a1eb9b3c',
    'evaluate|none|refeed||q3': '935d6956aee412099ae4c0a9cc0f0d22',
    'evaluate|none|sure||q1,q2': 'a80e018b2e924a53e7c88b7e23cb4925',
    'evaluate|none|sure||q3': '20a881269333e05ef39396c689487da4',
    'generate|bm25@2|concat_pf|1|q1,q2': '6900bc9b25747d667a4909a5f7be6edd',
    'generate|bm25@2|concat_pf|1|q3': '009bbdc04a2cefd4b7dd51fb51c9349f',
    'generate|bm25@2|concat_pf|2|q1,q2': '86a83bd25d6d4d53e4bd5e6596806791',
    'generate|bm25@2|concat_pf|2|q3': 'cc981ebe524c98922ec8cdf0327007bc',
    'generate|bm25@2|concatenation|1|q1,q2': 'bb26318fe05571e7626318bd1267064a',
    'generate|bm25@2|concatenation|1|q3': '51ef565afd48d44a63370d9ef463a79e',
    'generate|bm25@2|post_fusion(samples=2,vote=first)|1|q1,q2': '31ace7eee4759e961eccfd8f2a88c002',
    'generate|bm25@2|post_fusion(samples=2,vote=first)|1|q3': '3c2a844cd9f1346b89f546faa406fd1d',
    'generate|bm25@2|post_fusion|1|q1,q2': '41a3658af0a64ef0cdb14c69477ec2a7',
    'generate|bm25@2|post_fusion|1|q3': '339df8c1daecd3e229c131c648407e0a',
    'generate|bm25@2|refeed|1|q1,q2': 'bf52e23ff26a8c71793876e27540914c',
    'generate|bm25@2|refeed|1|q3': 'e0d58c0fe5493527c9bbae62a283e937',
    'generate|bm25@2|refeed|2|q1,q2': '93a325c6d9c6bf1d15cfbbbdcffce503',
    'generate|bm25@2|refeed|2|q3': '5d15c2d1c6680fe68399392ade626f00',
    'generate|bm25@2|sure|1|q1,q2': '7d4c928080e10abe2b1017f453e6cd67',
    'generate|bm25@2|sure|1|q3': '413b7155e02f31248c27362416b537ea',
    'generate|bm25@2|sure|2|q1,q2': 'e9eb1f46bd3e4e44d2f22a73cd8a295d',
    'generate|bm25@2|sure|2|q3': '26f45bee3457a1b91ff1672690242396',
    'generate|bm25@2|sure|3|q1,q2': '0576db7938df9d426acf2390029afff9',
    'generate|bm25@2|sure|3|q3': '38e33ecb579873a9416d862bd086662c',
    'generate|none|concat_pf|1|q1,q2': '40098d8bf660985688ebe4d2ff893609',
    'generate|none|concat_pf|1|q3': 'c2b22e034f5654d06624037b8baa7496',
    'generate|none|concat_pf|2|q1,q2': '8f476ad97411bc6e2e72fa96d99d4598',
    'generate|none|concat_pf|2|q3': 'd33893985c952d48937bb6a8ded49df5',
    'generate|none|concatenation|1|q1,q2': 'd80d8cce91b38edb7a78135bc0a6223f',
    'generate|none|concatenation|1|q3': '5c6baef14eba3cdc80a3da707fddb44c',
    'generate|none|post_fusion(samples=2,vote=first)|1|q1,q2': 'a8317b2c2a2fe167341f8c16c82a9ce2',
    'generate|none|post_fusion(samples=2,vote=first)|1|q3': '07ade399b334a6940e321b25475cd6bb',
    'generate|none|post_fusion|1|q1,q2': '342deeee505ee8d16d0ab1737b2ea79a',
    'generate|none|post_fusion|1|q3': 'e0704127c702f525c5c200a76d37c739',
    'generate|none|refeed|1|q1,q2': 'b255fa87e7074a5392dd716846496394',
    'generate|none|refeed|1|q3': '9066c12ad494dd3b1a4535031375bd8c',
    'generate|none|refeed|2|q1,q2': '2a7cffb338205c3d6ef3f4999bbe4c6e',
    'generate|none|refeed|2|q3': '9230454d6ff96550f0f986b25040d98c',
    'generate|none|sure|1|q1,q2': '2d401a950ee8a211f38cec4585115aa2',
    'generate|none|sure|1|q3': '26f2d808d13f67e27c1e5d245d394604',
    'generate|none|sure|2|q1,q2': '6af41a47fc868717545f2883176a4262',
    'generate|none|sure|2|q3': '660cd66e0a0293f66b07c1c081aefa3d',
    'generate|none|sure|3|q1,q2': 'd39c643c9b42f7255c346f3a7b4a887d',
    'generate|none|sure|3|q3': '06d029c91a3ff04c52362ea824119b3e',
    'retrieve|bm25@2|||q1,q2': '1c90cb80a3281788f6c3427128c38ad7',
    'retrieve|bm25@2|||q3': '408687c95849d29db666815eb95ea7f4',
    'retrieve|none|||q1,q2': '60199ab9e7f07d2c362af1eb14d16b0e',
    'retrieve|none|||q3': 'eaf198a6b1b43c58e74f91d5e5e44fdc',
    'vote|bm25@2|concat_pf||q1,q2': '9af22afb24095787e9bb55ee31ce02f7',
    'vote|bm25@2|concat_pf||q3': '08e9741352e1249b80c870ca413709e8',
    'vote|bm25@2|concatenation||q1,q2': 'f3825c9537f93a7b94efdfb6c0c552a7',
    'vote|bm25@2|concatenation||q3': '5feb2f248d694bec8ade0ce07eff8536',
    'vote|bm25@2|post_fusion(samples=2,vote=first)||q1,q2': 'db2178ec8e03429bd02299b48d7783e9',
    'vote|bm25@2|post_fusion(samples=2,vote=first)||q3': 'c8cd67f61a4b8cbc76ee2f456bcd3792',
    'vote|bm25@2|post_fusion||q1,q2': 'ae3d57a81eecc50ff70d031c5212824a',
    'vote|bm25@2|post_fusion||q3': 'c5d89fa0825a44c190474975097e0b15',
    'vote|bm25@2|refeed||q1,q2': '07680b0d00fd4e679a40a5269f31cb20',
    'vote|bm25@2|refeed||q3': '8f2051d2adf5f61e86b8029530db3bc1',
    'vote|bm25@2|sure||q1,q2': 'a9985e312c1003a2cba7713b79146b2a',
    'vote|bm25@2|sure||q3': '47063055298f2054d4def80bc6c79df4',
    'vote|none|concat_pf||q1,q2': '432e0b395c985af19d1d009a883fe31f',
    'vote|none|concat_pf||q3': '75c228402ea7e4b233a46212321c1f83',
    'vote|none|concatenation||q1,q2': 'a0d366a2e5cac017f5ac9023dd2147f1',
    'vote|none|concatenation||q3': '4ae8521dee023c374634d3e200076ed2',
    'vote|none|post_fusion(samples=2,vote=first)||q1,q2': '2f83370e39a469eed274039607876a3d',
    'vote|none|post_fusion(samples=2,vote=first)||q3': '8aca6a58b41e283a5d3e537f0b907b29',
    'vote|none|post_fusion||q1,q2': '242fa2ef328d283a058616a00f20db0d',
    'vote|none|post_fusion||q3': '5873d0cf0080d99fc26171583438ff16',
    'vote|none|refeed||q1,q2': 'b24868db399894ec13cd34ae19008cbc',
    'vote|none|refeed||q3': 'd8425ef87bea0285157283cd4541b1d1',
    'vote|none|sure||q1,q2': '48f9ff06a0f53b1a515fd5575c4fb213',
    'vote|none|sure||q3': '6306d7277fa043353dbfea85b3f7781f',
}
FILTER_STAGE_KEYS = {
    'closed-book filter||||q1,q2': 'ef2c5cf2d98d92a312528abbe8e80ab6',
    'closed-book filter||||q3': 'beccc9b4f4b9c1996803821ebe10cbf6',
    'evaluate|bm25@2|concatenation||q1,q3': 'bbf512c2bf069fd49c622dddc29dbb05',
    'evaluate|none|concatenation||q1,q3': '87d5c706cb4d4b31f5baf35c093e2bf4',
    'generate|bm25@2|concatenation|1|q1,q3': '52e1cba13e40f409c25b8dae0f914a9f',
    'generate|none|concatenation|1|q1,q3': '00ed5a738c34c63c37a2fa3e9b63bd12',
    'retrieve|bm25@2|||q1,q3': 'ff6db530b61c000615d1a17cc5378a00',
    'retrieve|none|||q1,q3': '5481ebcc03dde8892312e569ccf98599',
    'vote|bm25@2|concatenation||q1,q3': '4cbc34c579ef7f2c22a9940233c1b3a1',
    'vote|none|concatenation||q1,q3': 'a79b6dc6d57b236cef85d535c495488f',
}
