"""Call packs (tracking/store/callpack.py) and `ragledger cache export/import` (ragledger/cli_share.py): an experiment's
LLM calls move between call caches with their responses, usage and token log-probabilities; a damaged pack is one
error line and imports nothing."""

from __future__ import annotations

import gzip
import json

import pytest
import typer
from typer.testing import CliRunner

from engines.llm_cache import LLMCallCache
from tracking.store import callpack
from tracking.store.events import EventStore, new_events, stable_hash


def response(i: int) -> dict:
    return {"text": f"answer {i}", "mean_logprob": -0.25 * i, "tokens_in": 100 + i, "tokens_out": 3, "latency_ms": 12.5,
            "retries": 0, "token_logprobs": [[" answer", -0.1], [f" {i}", -0.4]]}


def key(i: int) -> str:
    return stable_hash("llm-call", i, length=40)


def generation_rows(n: int, cell: str = "bm25@2 · concatenation · scripted") -> list[dict]:
    return [{"event_id": stable_hash("gen", i), "cell": cell, "qid": f"q{i}", "retriever": "bm25@2",
             "reader": "concatenation", "round": 1, "role": "answer", "call_index": 0, "sample_index": 0,
             "call_id": key(i), "prompt_version": "v1", "prompt_hash": stable_hash("p", i), "system_prompt": "sys",
             "prompt": f"prompt {i}", "passage_ids": ["p1"], "output": f"answer {i}", "parsed_answer": f"answer {i}",
             "parse_status": "ok", "logprob": -0.25 * i, "answer_prob": None, "tokens_in": 100 + i, "tokens_out": 3,
             "latency_ms": 12.5, "model": "scripted", "from_cache": False, "retries": 0} for i in range(n)]


@pytest.fixture
def app() -> typer.Typer:
    from ragledger.cli_share import register

    app = typer.Typer()
    register(app)
    return app


def test_cache_bulk_reads_and_writes(tmp_path):
    cache = LLMCallCache(tmp_path / "c.sqlite")
    assert cache.put_many((key(i), response(i)) for i in range(3)) == 3
    assert cache.put_many((key(i), {**response(i), "text": "other"}) for i in range(5)) == 2  # existing keys kept
    assert cache.get(key(0))["text"] == "answer 0"
    assert set(cache.get_many([key(0), key(4), "absent"])) == {key(0), key(4)}
    assert [k for k, _ in cache.items()] == sorted(key(i) for i in range(5))


def test_pack_round_trip_keeps_responses_usage_and_logprobs(tmp_path):
    src = LLMCallCache(tmp_path / "a.sqlite")
    src.put_many((key(i), response(i)) for i in range(4))
    calls = {key(i): {"model": "scripted", "role": "answer", "sample_index": 0, "prompt_hash": "h"} for i in range(5)}
    data, head = callpack.build(src, calls, {"experiment": "exp"})
    assert head["calls"] == 4 and head["missing_from_cache"] == 1 and head["experiment"] == "exp"
    callpack.write(tmp_path / "p.jsonl.gz", data)
    pack = callpack.read(tmp_path / "p.jsonl.gz")
    assert [c["key"] for c in pack.calls] == sorted(key(i) for i in range(4))
    dst = LLMCallCache(tmp_path / "b.sqlite")
    r = callpack.import_into(pack, dst)
    assert (r.calls, r.added, r.present) == (4, 4, 0)
    assert dst.get(key(2)) == response(2)  # text, usage and token log-probabilities as they were cached
    again = callpack.import_into(callpack.read(tmp_path / "p.jsonl.gz"), dst)
    assert (again.added, again.present) == (0, 4)


def _rewrite(path, edit) -> None:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    path.write_bytes(gzip.compress(("\n".join(edit(lines)) + "\n").encode()))


@pytest.mark.parametrize("damage, expected", [
    ("truncated", "not a readable call pack"),
    ("altered", "checksum mismatch"),
    ("not_a_pack", "not a call pack"),
    ("bad_entry", "line 2: response lacks tokens_in"),
])
def test_a_damaged_pack_is_one_error_line_and_imports_nothing(tmp_path, app, damage, expected):
    src = LLMCallCache(tmp_path / "a.sqlite")
    src.put_many((key(i), response(i)) for i in range(3))
    pack = tmp_path / "p.jsonl.gz"
    callpack.write(pack, callpack.build_all(src)[0])
    if damage == "truncated":
        pack.write_bytes(pack.read_bytes()[:-20])
    elif damage == "altered":
        _rewrite(pack, lambda lines: [lines[0], lines[1].replace('"answer', '"altered'), *lines[2:]])
    elif damage == "not_a_pack":
        pack.write_bytes(gzip.compress(b'{"hello": 1}\n'))
    else:  # a well-formed pack whose entry lacks a field: its checksum is recomputed, the entry check catches it
        def drop_field(lines):
            body = [json.loads(line) for line in lines[1:]]
            del body[0]["response"]["tokens_in"]
            text = "".join(json.dumps(b, sort_keys=True) + "\n" for b in body)
            head = {**json.loads(lines[0]), "sha256": __import__("hashlib").sha256(text.encode()).hexdigest()}
            return [json.dumps(head), *text.splitlines()]
        _rewrite(pack, drop_field)
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["cache", "import", str(pack), "--store", str(store)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], result.output
    assert str(pack) in lines[0]
    assert not (store / "llm_cache.sqlite").exists() or len(LLMCallCache(store / "llm_cache.sqlite")) == 0


def test_cache_export_of_one_experiment_then_import_elsewhere(tmp_path, app):
    store = tmp_path / "a"
    EventStore(store).write("generations", new_events("generations", "exp", generation_rows(3)))
    cache = LLMCallCache(store / "llm_cache.sqlite")
    cache.put_many((key(i), response(i)) for i in range(6))  # 3 of another experiment
    cache.close()
    runner = CliRunner()
    out = runner.invoke(app, ["cache", "export", str(tmp_path / "exp.jsonl.gz"), "--store", str(store), "--experiment", "exp"])
    assert out.exit_code == 0, out.output
    assert "3 LLM call(s) written" in out.output
    whole = runner.invoke(app, ["cache", "export", str(tmp_path / "all.jsonl.gz"), "--store", str(store)])
    assert whole.exit_code == 0 and "6 LLM call(s) written" in whole.output, whole.output
    pack = callpack.read(tmp_path / "exp.jsonl.gz")
    assert pack.calls[0]["request"]["model"] == "scripted"  # what was asked travels with the response
    imported = runner.invoke(app, ["cache", "import", str(tmp_path / "exp.jsonl.gz"), "--store", str(tmp_path / "b")])
    assert imported.exit_code == 0, imported.output
    assert "3 added" in imported.output
    assert LLMCallCache(tmp_path / "b" / "llm_cache.sqlite").get(key(1)) == response(1)
    missing = runner.invoke(app, ["cache", "export", str(tmp_path / "x.jsonl.gz"), "--store", str(tmp_path / "none")])
    assert missing.exit_code == 2 and missing.output.startswith("error:") and "no such directory" in missing.output
    records_only = tmp_path / "c"  # a store whose run made no model call
    EventStore(records_only).write("generations", new_events("generations", "exp", generation_rows(1)))
    uncached = runner.invoke(app, ["cache", "export", str(tmp_path / "x.jsonl.gz"), "--store", str(records_only)])
    assert uncached.exit_code == 2 and uncached.output.startswith("error:") and "no call cache" in uncached.output
