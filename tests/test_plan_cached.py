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
    from flows.execute import experiment_flow
    from tracking.store.catalog import packed_in

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
    lost = Path(segments["none · sure · scripted"]["outcomes"][0])
    (packed_in(lost) or lost).unlink()  # the run compacted its experiment: the pack holding the segment is lost
    assert cached_result(spec) is None


def test_ragledger_run_answers_a_cached_rerun_from_the_store_and_falls_back_to_the_flow(tmp_path):
    """`ragledger run` twice: the second is answered from the store (no task, no model call, the same table, no
    new MLflow run); the flow runs instead when MLflow would log elsewhere, when logging is pending, or when
    RAGLEDGER_CACHED_ANSWER=0."""
    from tests.test_reliability import cli, make_data, reader, write_spec
    from tracking.store.ledger import Ledger

    make_data(tmp_path, 6)
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(tmp_path, model.base_url, name="again")
        first = cli(tmp_path, "run", str(spec), "--json", "first.json")
        assert first.returncode == 0, first.stderr[-2000:]
        calls = model.calls
        second = cli(tmp_path, "run", str(spec), "--json", "second.json")
        assert second.returncode == 0, second.stderr[-2000:]
        assert "answered from the store" in second.stdout and "no task ran" in second.stdout, second.stdout
        a, b = (json.loads((tmp_path / f).read_text()) for f in ("first.json", "second.json"))
        assert b["llm_calls"] == 0 and model.calls == calls
        assert as_json(b["cells"]) == as_json(a["cells"])
        assert b["mlflow_parent_run_id"] == a["mlflow_parent_run_id"]  # nothing new logged
        assert len(Ledger(tmp_path / ".ragledger" / "store").manifests("again")) == 1
        for env in ({"RAGLEDGER_CACHED_ANSWER": "0"}, {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'other.db'}"}):
            through_flow = cli(tmp_path, "run", str(spec), env=env)
            assert through_flow.returncode == 0, through_flow.stderr[-2000:]
            assert "answered from the store" not in through_flow.stdout and "tasks from the cache" in \
                through_flow.stdout, (env, through_flow.stdout)
        pending = tmp_path / ".ragledger" / "store" / "mlflow-pending" / "again"
        pending.mkdir(parents=True, exist_ok=True)
        (pending / "x.json").write_text("{}")
        assert "answered from the store" not in cli(tmp_path, "run", str(spec)).stdout  # the flow syncs pending logs
        assert model.calls == calls


def test_the_corpus_is_kept_on_the_machine_for_its_files_as_they_are(tmp_path, monkeypatch):
    """strategies/retrievers/corpus.py keeps the corpus's hash and size in the cache home, named by the corpus files'
    identity: the next load and the plan's hash read no corpus file, and a changed file (or one replaced by a copy
    of the same size and modification time) is read and hashed afresh. The hash is the content hash of every id,
    title and text, streamed: equal to core.hashing.stable_hash over the three lists."""
    import os

    import strategies.retrievers.corpus as corpus_module
    from core.hashing import stable_hash
    from flows.plan import corpus_hash_for
    from schemas.spec import parse_spec

    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    (tmp_path / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    spec = parse_spec(make_spec(tmp_path, ["concatenation"]))
    paths = tuple(spec.corpus.paths)
    reads = []
    real_read = corpus_module.iter_corpus_batches  # the corpus's one read: in batches (core/datasets.py)

    def counting_read(name, paths, shape=None):
        reads.append(paths)
        return real_read(name, paths, shape)

    monkeypatch.setattr(corpus_module, "iter_corpus_batches", counting_read)

    def load_uncached() -> corpus_module.Corpus:  # the process's memo aside: only what was kept may spare a read
        return corpus_module._file_corpus(spec.corpus.name, paths, corpus_module._identity(spec.corpus.name, paths))

    fresh = load_uncached()
    assert len(reads) == 1 and len(list((tmp_path / "home" / "corpora").glob("*.json"))) == 1
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert fresh.corpus_hash == stable_hash("corpus", [str(r["id"]) for r in rows], [r.get("title") or "" for r in rows],
                                            [r["text"] for r in rows])
    assert fresh.passages == len(rows)
    kept = load_uncached()
    assert len(reads) == 1 and kept == fresh
    assert corpus_hash_for(spec) == fresh.corpus_hash and len(reads) == 1

    corpus.write_text(corpus.read_text().replace("Paris", "Lutetia"))
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 1_000_000))
    changed = load_uncached()
    assert len(reads) == 2 and changed.corpus_hash != fresh.corpus_hash

    # a damaged record is computed from the files again (and kept whole again)
    for kept_file in (tmp_path / "home" / "corpora").glob("*.json"):
        kept_file.write_text("not json")
    assert load_uncached().corpus_hash == changed.corpus_hash and len(reads) == 3

    # a file replaced by one of the same size and modification time (`cp -p`): a new inode and ctime, read afresh;
    # and the process's own memo follows the file too
    before = corpus_module.Corpus.load(spec.corpus.name, paths)
    stat = corpus.stat()
    replacement = tmp_path / "replacement.jsonl"
    replacement.write_text(corpus.read_text().replace("Lutetia", "Lutecia"))
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, corpus)
    assert corpus.stat().st_size == stat.st_size and corpus.stat().st_mtime_ns == stat.st_mtime_ns
    after = corpus_module.Corpus.load(spec.corpus.name, paths)
    assert len(reads) == 4 and after.corpus_hash != before.corpus_hash
