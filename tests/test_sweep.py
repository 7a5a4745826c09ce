"""Specs with a list of datasets run as a sweep: one ordinary experiment per dataset, in one MLflow experiment,
sharing one model endpoint. Real SQuAD dev and NQ-open dev questions (3 of each) over a tiny JSONL corpus,
answered by the scripted OpenAI-compatible server (standing in for the embedded server, or for vLLM via the CLI)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from engines.models import DEFAULT_MODEL
from schemas.spec import ExperimentSpec, SpecError, SweepSpec, load_spec, parse_spec
from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli

PASSAGES = [
    {"id": "p1", "title": "Broncos", "text": "The Denver Broncos defeated the Carolina Panthers to win Super Bowl 50."},
    {"id": "p2", "title": "Moon", "text": "The last crewed Moon landing was Apollo 17 in December 1972."},
    {"id": "p3", "title": "Paris", "text": "Paris is the capital and largest city of France."},
]
BASE = {"retrievers": ["bm25@2", "none"], "readers": ["concatenation"]}
SQUAD = {"name": "squad", "path": "squad/dev-v1.1.json.gz", "limit": 3, "seed": 0}
NQ = {"name": "nq-open", "path": "nq-open/NQ-open.dev.jsonl", "limit": 3, "seed": 0}


def answer(system: str, prompt: str, body: dict) -> str:
    context = prompt.split("Question:")[0]
    return next((t for t in ("Broncos", "1972", "Paris") if t in context), "unknown")


# ---- the spec ----------------------------------------------------------------------------------------

# computed by the code on main before list datasets existed (commit 57829a1): a single-mapping spec keeps its
# spec hash, its dataset identity (in every stage's cache key) and its question event ids, so existing
# experiments keep hitting their caches. The spec hashes include the default embedded model's name, and were
# computed again when it became qwen2.5-coder-0.5b-instruct-awq-q4km (engines/models.py, its former name).
BEFORE = {
    "minimal": ({"name": "t"}, "0836a99b73729d45", "662ac598d8f824bba642cb8dea2a8ef9", "39daadfbc1d62a8141d7fe4dd252cd3a"),
    "squad": ({"name": "retrievers", "dataset": {**SQUAD, "limit": 200}}, "06b125efb3f38552",
              "43b49168a85aa9722c1201b9a63193cd", "1cdc553dfe8165631baf44117c014dc2"),
    "filter": ({"name": "t", "dataset": {**NQ, "closed_book_filter": True}}, "e425f0f171d49a43",
               "6427104dd2ffabbe08a10a17cff6138c", "1f20dd4c77a4e051203ac533415e0875"),
}


@pytest.mark.parametrize("case", list(BEFORE))
def test_a_single_mapping_spec_keeps_its_hash_and_cache_identity(case):
    from core.datasets import Question
    from flows.plan import question_rows
    from tracking.store.events import stable_hash

    patch, spec_hash, dataset_key, question_event = BEFORE[case]
    spec = parse_spec({**BASE, **patch})
    assert type(spec) is ExperimentSpec and spec.expand() == [spec]
    assert spec.spec_hash() == spec_hash
    assert stable_hash(spec.dataset.identity()) == dataset_key
    assert question_rows(spec, [Question("q1", "Who?", ["A"])])[0]["event_id"] == question_event
    assert "label" not in spec.model_dump()["dataset"]


def test_a_list_expands_into_one_ordinary_experiment_per_dataset():
    sweep = parse_spec({"name": "sw", "dataset": [SQUAD, {**NQ, "label": "nq"}], **BASE})
    assert isinstance(sweep, SweepSpec)
    squad, nq = sweep.expand()
    assert (squad.name, nq.name) == ("sw.squad", "sw.nq")
    assert squad.dataset.model_dump(exclude={"closed_book_filter"}) == SQUAD and nq.dataset.name == "nq-open"
    # one MLflow experiment for the sweep, the spec's or else the sweep's name
    assert squad.tracking.mlflow_experiment == nq.tracking.mlflow_experiment == "sw"
    named = parse_spec({"name": "sw", "dataset": [SQUAD, NQ], "tracking": {"mlflow_experiment": "grids"}, **BASE})
    assert {e.tracking.mlflow_experiment for e in named.expand()} == {"grids"}
    # each is exactly the experiment one would write by hand (same hash, so the same caches)
    by_hand = parse_spec({"name": "sw.nq", "dataset": NQ, "tracking": {"mlflow_experiment": "sw"}, **BASE})
    assert nq == by_hand and nq.spec_hash() == by_hand.spec_hash()
    assert squad.retrievers == nq.retrievers == BASE["retrievers"] and squad.model == nq.model == sweep.model
    # the same dataset twice, told apart by labels
    two = parse_spec({"name": "sw", "dataset": [SQUAD, {**SQUAD, "seed": 1, "label": "squad-s1"}], **BASE})
    assert [e.name for e in two.expand()] == ["sw.squad", "sw.squad-s1"]


@pytest.mark.parametrize(
    ("datasets", "retrievers", "needle"),
    [
        ([SQUAD, SQUAD], None, "dataset[1].label: 'squad' is already the label of dataset[0]"),
        ([SQUAD, {**NQ, "label": "x"}, {**SQUAD, "label": "x"}], None,
         "dataset[2].label: 'x' is already the label of dataset[1]"),
        ([SQUAD, {**NQ, "pth": "x.jsonl"}], None, "dataset[1].pth: unknown field"),
        ([SQUAD, {**NQ, "limit": 0}], None, "dataset[1].limit: Input should be greater than 0"),
        ([SQUAD, {**NQ, "name": "mnist"}], None, "dataset[1].name: 'mnist' is not one of 'squad', "),
        ([{**SQUAD, "label": "has space"}], None, "dataset[0].label: String should match pattern"),
        ([SQUAD, "nq-open"], None, "dataset[1]: expected a mapping"),
        ([], None, "an empty list"),
        ([SQUAD, NQ], ["gold(bm25@2)"], "dataset[1]: retrievers: 'gold(bm25@2)' inserts each question's gold paragraph"),
    ],
)
def test_bad_list_entries_are_named(tmp_path, datasets, retrievers, needle):
    path = tmp_path / "spec.yaml"
    spec = {"name": "sw", "dataset": datasets, **BASE}
    if retrievers:
        spec["retrievers"] = retrievers
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    assert str(exc.value).startswith(str(path)) and needle in str(exc.value), str(exc.value)


def test_retrievers_config_is_the_seed_002_pool_over_squad_and_nq():
    spec = load_spec(Path(__file__).resolve().parent.parent / "configs" / "retrievers.yaml")
    assert isinstance(spec, SweepSpec) and len(spec.retrievers) >= 8 and spec.readers == ["concatenation"]
    assert {"dense@5", "bm25@rr@5", "hybrid(bm25@3,dense@3)", "compress(bm25@5)", "parametric", "none"} <= set(spec.retrievers)
    assert [(e.name, e.dataset.name, e.dataset.path, e.dataset.limit) for e in spec.expand()] == [
        ("retrievers.squad", "squad", "squad/dev-v1.1.json.gz", 25),
        ("retrievers.nq-open", "nq-open", "nq-open/NQ-open.dev.jsonl", 25)]
    from flows.launch import preflight

    preflight(spec)  # both datasets and the corpus are there


# ---- the sweep flow ------------------------------------------------------------------------------------

def sweep_spec(ws: Path, model: dict) -> dict:
    corpus = ws / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    return {"name": "sw", "dataset": [SQUAD, NQ], "corpus": {"name": "jsonl", "paths": [str(corpus)]}, **BASE,
            "model": model, "execution": {"shard_size": 2},
            "tracking": {"store": str(ws / "store"), "mlflow_uri": f"sqlite:///{ws / 'mlflow.db'}"}}


def test_sweep_runs_each_dataset_as_an_experiment_with_one_endpoint(tmp_path, data_dir, prefect_harness, monkeypatch):
    from flows.experiment import scheduled_experiment
    from flows.sweep import run_spec
    from tracking.store.query import query

    with ScriptedServer(answer=answer) as server:
        starts: list[str] = []

        @contextlib.contextmanager
        def embedded_server(model_name: str, context_window: int = 4096, log_dir=None, log=print, logits_all=False):
            starts.append(model_name)  # the scripted server stands in for llama.cpp
            yield server.base_url

        monkeypatch.setattr("engines.embedded.embedded_server", embedded_server)
        spec = sweep_spec(tmp_path, {"backend": "embedded", "embedded_model": DEFAULT_MODEL, "concurrency": 4})
        store, uri = spec["tracking"]["store"], spec["tracking"]["mlflow_uri"]
        first = run_spec(parse_spec(spec), store, tracking_uri=uri)
        assert starts == [DEFAULT_MODEL]  # started once for both experiments
        assert [e["experiment"] for e in first["experiments"]] == ["sw.squad", "sw.nq-open"]
        assert [e["questions"] for e in first["experiments"]] == [3, 3]
        assert first["llm_calls"] == sum(e["llm_calls"] for e in first["experiments"]) == server.calls > 0
        assert all(e["llm_calls"] > 0 for e in first["experiments"])

        # rerun as a `ragledger schedule` deployment runs it (scheduled flow -> sweep -> experiments): all cached
        calls = server.calls
        second = scheduled_experiment(spec, store, uri)
        assert second["llm_calls"] == 0 and server.calls == calls and len(starts) == 1
        assert second["tasks_from_cache"] == second["tasks_total"] > 0
        assert [e["cells"] for e in second["experiments"]] == [e["cells"] for e in first["experiments"]]

    # the store holds two ordinary experiments, each with its own questions and dataset
    counts = query(store, "SELECT experiment, dataset, count(DISTINCT qid) AS n FROM questions GROUP BY ALL ORDER BY 1")
    assert [tuple(r) for r in counts.itertuples(index=False)] == [("sw.nq-open", "nq-open", 3), ("sw.squad", "squad", 3)]
    nq_qids = set(query(store, "SELECT DISTINCT qid FROM outcomes", "sw.nq-open")["qid"])
    assert len(nq_qids) == 3 and all(q.startswith("nq-") for q in nq_qids)
    outcomes = query(store, "SELECT experiment, count(*) AS n FROM outcomes GROUP BY ALL ORDER BY 1")
    assert [tuple(r) for r in outcomes.itertuples(index=False)] == [("sw.nq-open", 6), ("sw.squad", 6)]  # 3 q x 2 cells

    # MLflow, read from another process: one experiment "sw" holding a parent run per dataset and execution
    script = f"""
import json, mlflow
mlflow.set_tracking_uri({uri!r})
runs = mlflow.search_runs(experiment_names=['sw'], output_format='list')
names = [e.name for e in mlflow.search_experiments()]
print(json.dumps({{"experiments": names, "runs": [dict(id=r.info.run_id, name=r.info.run_name, tags=r.data.tags,
                  metrics=r.data.metrics) for r in runs]}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "sw" in got["experiments"] and not any(n.startswith("sw.") for n in got["experiments"])
    parents = [r for r in got["runs"] if r["tags"].get("ragledger.level") == "experiment"]
    assert sorted(r["name"] for r in parents) == ["sw.nq-open", "sw.nq-open", "sw.squad", "sw.squad"]  # two executions
    for p in parents:
        dataset = "squad:squad/dev-v1.1.json.gz" if p["name"] == "sw.squad" else "nq-open:nq-open/NQ-open.dev.jsonl"
        assert p["tags"]["ragledger.dataset"] == dataset and p["metrics"]["questions"] == 3
        cells = [r for r in got["runs"] if r["tags"].get("mlflow.parentRunId") == p["id"]]
        assert sorted(c["tags"]["retriever"] for c in cells) == ["bm25@2", "none"]
        assert all("recall_at_k" in c["metrics"] and "em" in c["metrics"] for c in cells)
    latest = {e["mlflow_parent_run_id"] for e in second["experiments"]}
    assert latest <= {p["id"] for p in parents} and len(latest) == 2

    # `ragledger runs` lists the sweep with both parent runs
    from ragledger.cli_ops import _flow_runs

    rows = {r["flow"]: r for r in _flow_runs(10, "sw")}
    assert set(rows) == {"ragledger-sweep", "ragledger-scheduled"}
    assert set(rows["ragledger-scheduled"]["mlflow_run"].split(", ")) == latest


# ---- the command line -----------------------------------------------------------------------------------

def write_cli_spec(ws: Path, base_url: str, nq_path: str) -> Path:
    spec = sweep_spec(ws, {"backend": "openai", "name": "scripted", "base_url": base_url, "concurrency": 4})
    spec["dataset"][1] = {**NQ, "path": nq_path}
    del spec["tracking"]  # the defaults: .ragledger/ under the working directory
    path = ws / "sw.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_run_checks_every_dataset_before_anything_runs(tmp_path, data_dir):
    spec = write_cli_spec(tmp_path, "http://127.0.0.1:9/v1", "nq-open/no-such-file.jsonl")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = cli(tmp_path, "run", str(spec), env={"RAGLEDGER_DATA": str(data_dir)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert f"dataset[1].path: {data_dir / 'nq-open' / 'no-such-file.jsonl'}: file not found" in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, not even .ragledger/


def test_run_a_sweep_from_one_command(tmp_path, data_dir):
    with ScriptedServer(answer=answer) as server:
        spec = write_cli_spec(tmp_path, server.base_url, NQ["path"])
        proc = cli(tmp_path, "run", str(spec), "--json", "summary.json", env={"RAGLEDGER_DATA": str(data_dir),
                                                                              "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["sweep"] == "sw" and summary["llm_calls"] == server.calls > 0
    assert [(e["experiment"], e["questions"]) for e in summary["experiments"]] == [("sw.squad", 3), ("sw.nq-open", 3)]
    out = proc.stdout
    assert "sw.squad — 3 questions" in out and "sw.nq-open — 3 questions" in out  # a readers table per dataset
    assert f"model calls this sweep (2 experiments): {server.calls}" in out
    for e in summary["experiments"]:
        assert e["mlflow_parent_run_id"] in out
