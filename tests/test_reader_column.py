"""The reader column in a store that also holds segments with it under its earlier name, `strategy`.

Segments are never rewritten, so one store, even one experiment, may hold segments of both names. Here cell `a`'s
records sit in hand-made segments with a `strategy` column, cell `b`'s in segments written now, and a later segment
holds some of cell `a`'s outcomes again under the name `reader` (overlapping segments of both names). Every reader of
the store sees one `reader` column: EventStore.read, the query views (which keep `strategy` as the same column,
last), the records of a trace, `store verify`, the check of a pulled segment, `errors`, `trace` and `analyze`.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from ragledger.cli import app
from schemas.records import columns_of, validate_records
from tracking.store.events import (
    CHECKSUM_KEY,
    KIND_KEY,
    EventStore,
    event_id,
    new_events,
    stable_hash,
    written_checksum,
)

EXP = "mixed"
READER = "concatenation"
QIDS = [f"q{k}" for k in range(1, 9)]
RIGHT = {"a": {"q1", "q2", "q3", "q5", "q8"}, "b": {"q1", "q4", "q5", "q6"}}  # the questions each retriever's cell gets right


def cell(retriever: str) -> str:
    return f"{retriever} · {READER} · m"


def records(retriever: str) -> dict[str, list[dict]]:
    """Retrievals, generations, votes and outcomes of one cell on every question."""
    out: dict[str, list[dict]] = {"retrievals": [], "generations": [], "votes": [], "outcomes": []}
    for qid in QIDS:
        right = qid in RIGHT[retriever]
        pred = f"gold {qid}" if right else "wrong"
        common = {"cell": cell(retriever), "qid": qid, "retriever": retriever}
        out["retrievals"].append({**common, "cell": "", "event_id": event_id("retrievals", EXP, retriever, qid), "rank": 1,
                                  "pid": f"p{qid}", "score": 1.0, "title": "T", "text": f"About {qid}: gold {qid}.",
                                  "text_hash": "h" * 16})
        common["reader"] = READER
        out["generations"].append({
            **common, "event_id": event_id("generations", EXP, retriever, qid), "round": 1, "role": "answer",
            "call_index": 0, "sample_index": 0, "call_id": f"{retriever}{qid}".ljust(16, "c"), "prompt_version": "v1",
            "prompt_hash": "p" * 16, "system_prompt": "s", "prompt": f"Question {qid}?", "passage_ids": [f"p{qid}"],
            "output": f"Answer: {pred} ({retriever})", "parsed_answer": pred, "parse_status": "ok", "logprob": None,
            "answer_prob": None, "output_prob": None, "tokens_in": 20, "tokens_out": 3, "latency_ms": 5.0, "model": "m",
            "from_cache": False, "retries": 0})
        out["votes"].append({**common, "event_id": event_id("votes", EXP, retriever, qid), "method": "single",
                             "candidates": [pred], "scores": [1.0], "chosen": pred})
        out["outcomes"].append({
            **common, "event_id": event_id("outcomes", EXP, retriever, qid), "model": "m", "prediction": pred,
            "em": float(right), "f1": float(right), "semantic_match": None, "is_unknown": False, "gold_in_context": True,
            "gold_in_retrieval": True, "gold_in_feedback": None, "pool_has_correct": None,
            "error_type": "correct" if right else "extraction_error", "tokens_in": 20, "tokens_out": 3, "llm_calls": 1})
    return out


def write_strategy_named(store: EventStore, kind: str, rows: list[dict]):
    """A segment holding the reader column as `strategy`, otherwise as EventStore.write writes one (the same
    validation, checksum metadata and name)."""
    df = validate_records(kind, new_events(kind, EXP, rows)).rename(columns={"reader": "strategy"})
    table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), KIND_KEY: kind.encode(),
                                           CHECKSUM_KEY: written_checksum(table).encode()})
    path = store.kind_dir(kind, EXP) / f"seg-{stable_hash(kind, sorted(df['event_id']), length=24)}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    return path


@pytest.fixture
def mixed_store(tmp_path):
    root = tmp_path / "store"
    store = EventStore(root)
    questions = [{"event_id": event_id("questions", EXP, q), "cell": "", "qid": q, "dataset": "jsonl",
                  "question": f"Question {q}?", "answers": [f"gold {q}"], "gold_pids": []} for q in QIDS]
    store.write("questions", new_events("questions", EXP, questions))
    old, new = records("a"), records("b")
    old_paths = {kind: write_strategy_named(store, kind, rows) for kind, rows in old.items() if kind != "retrievals"}
    for kind, rows in new.items():
        store.write(kind, new_events(kind, EXP, rows))
    store.write("retrievals", new_events("retrievals", EXP, old["retrievals"]))
    store.write("outcomes", new_events("outcomes", EXP, old["outcomes"][:3]))  # overlaps cell a's segment
    for path in old_paths.values():
        assert "strategy" in pq.read_schema(path).names and "reader" not in pq.read_schema(path).names
    return root, old_paths


def test_every_read_of_a_mixed_store_sees_one_reader_column(mixed_store):
    root, old_paths = mixed_store
    store = EventStore(root)
    for kind in ("generations", "votes", "outcomes"):
        df = store.read(kind, EXP)
        assert list(df.columns) == columns_of(kind), kind
        assert len(df) == 16 and set(df["reader"]) == {READER} and df["reader"].notna().all(), kind
        assert len(store.read(kind, paths=[old_paths[kind]])) == 8
        validate_records(kind, df)
    assert store.verify() == (10, [])  # every segment sound, of either name

    from tracking.mlflow.pull import segment_problem
    from tracking.store.ledger import Ledger
    from tracking.store.query import connect, query

    for kind, path in old_paths.items():  # a segment pulled from another machine's MLflow run is checked the same way
        assert segment_problem(path, kind, EXP) is None, kind
    for kind in ("generations", "votes", "outcomes"):
        got = query(root, f"SELECT reader, strategy, count(*) AS n FROM {kind} GROUP BY ALL")
        assert got.to_dict("records") == [{"reader": READER, "strategy": READER, "n": 16}], kind
        chain = Ledger(root).records(kind, EXP, qids=["q2"])
        assert "strategy" not in chain and list(chain["reader"]) == [READER, READER], kind
    con = connect(root)
    try:
        cols = [c[0] for c in con.execute("DESCRIBE outcomes").fetchall()]
        assert cols == [*columns_of("outcomes"), "strategy"]  # `reader` in its place, `strategy` the same values, last
        for kind in ("generations", "votes", "outcomes"):
            cols = [c[0] for c in con.execute(f"DESCRIBE {kind}").fetchall()]
            assert cols.index("reader") == columns_of(kind).index("reader") and cols[-1] == "strategy"
    finally:
        con.close()
    ems = query(root, "SELECT reader, retriever, avg(em) AS em FROM outcomes GROUP BY ALL ORDER BY retriever")
    assert ems.to_dict("records") == [{"reader": READER, "retriever": "a", "em": 5 / 8},
                                      {"reader": READER, "retriever": "b", "em": 4 / 8}]


def test_query_views_of_old_only_and_new_only_stores(tmp_path):
    old_root, new_root = tmp_path / "old", tmp_path / "new"
    write_strategy_named(EventStore(old_root), "votes", records("a")["votes"])
    EventStore(new_root).write("votes", new_events("votes", EXP, records("b")["votes"]))
    from tracking.store.query import query

    for root in (old_root, new_root, tmp_path / "empty"):
        got = query(root, "SELECT * FROM votes")
        assert list(got.columns) == [*columns_of("votes"), "strategy"]
        assert (got["reader"] == got["strategy"]).all() and len(got) == (0 if root.name == "empty" else 8)


def cli(*args, **env):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "220", **env})


def test_the_cli_commands_on_a_mixed_store(mixed_store, monkeypatch):
    root, _ = mixed_store
    r = cli("query", "SELECT reader, count(*) AS n FROM generations GROUP BY reader", "--store", root, "--format", "csv")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["reader,n", f"{READER},16"]
    r = cli("query", "SELECT DISTINCT strategy FROM votes", "--store", root, "--format", "csv")
    assert r.exit_code == 0 and r.output.splitlines() == ["strategy", READER], r.output

    r = cli("errors", EXP, "--store", root, "--format", "json")
    assert r.exit_code == 0, r.output
    wrong = {(x["cell"], x["qid"]) for x in json.loads(r.output)}
    assert wrong == {(cell(ret), q) for ret in RIGHT for q in QIDS if q not in RIGHT[ret]}

    r = cli("trace", EXP, "q3", "--store", root)
    assert r.exit_code == 0, r.output
    for needed in ("raw output: Answer: gold q3 (a)", "raw output: Answer: wrong (b)", "vote single", "extraction_error"):
        assert needed in r.output, needed

    from flows import analyze

    monkeypatch.setattr(analyze, "analyze_flow", analyze.analyze_flow.fn)  # the flow's body, without a Prefect run
    r = cli("analyze", EXP, "--store", root, "--no-eor", "--no-mlflow")
    assert r.exit_code == 0, r.output
    assert f"reader {READER} · model m: 2 retrievers" in r.output
    decomposition = pq.read_table(root / "analysis" / EXP / "decomposition.parquet").to_pandas()
    assert set(decomposition["reader"]) == {READER} and "strategy" not in decomposition
