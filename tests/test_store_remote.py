"""Two machines' mirrors of one s3:// store (tracking/store/remote.py), in this process, against moto's S3 server as
its own process (or RAGLEDGER_TEST_S3_URL): a segment is in the bucket as soon as it is written; a catalog committed
by one machine is not overwritten by another that did not read it (compare-and-swap), and that machine reads the
committed one after its next fetch."""

from __future__ import annotations

import pytest

from tests.servers import S3Server
from tests.test_store_identity import questions_store
from tracking.store.compaction import compact_experiment
from tracking.store.events import EventStore, event_id, new_events
from tracking.store.objects import ConflictError
from tracking.store.remote import open_remote, push_up, pushed


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


@pytest.fixture
def bucket(s3, monkeypatch):
    return s3.point(monkeypatch)


def on(machine, monkeypatch, url: str, creating: bool = False):
    monkeypatch.setenv("RAGLEDGER_HOME", str(machine))
    return open_remote(url, creating=creating)


def test_segments_go_to_the_bucket_as_written_and_catalogs_by_compare_and_swap(bucket, tmp_path, monkeypatch):
    url = bucket.url("cas")
    a = on(tmp_path / "a", monkeypatch, url, creating=True)
    questions_store(a)  # EventStore.write: the segment is put create-only at once
    assert [k for k in bucket.keys(url) if k.startswith("questions/")] == \
        [p.relative_to(a).as_posix() for p in EventStore(a).segments("questions")]
    b = on(tmp_path / "b", monkeypatch, url)
    assert b != a and EventStore(b).read("questions")["qid"].tolist() == ["q1"]

    compact_experiment(EventStore(a), "exp")
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "a"))
    push_up(a, collect=True)
    # the catalog committed and the pack in; the segment it replaced kept for the retention time, for readers that
    # listed the store before the commit
    kept = sorted(k.split("/")[-1][:4] for k in bucket.keys(url) if k.startswith("questions/"))
    assert "compacted/exp.json" in bucket.keys(url) and kept == ["pack", "seg-"], kept
    monkeypatch.setenv("RAGLEDGER_STORE_RETENTION_S", "0")
    push_up(a, collect=True)  # the next command that collects, once the retention time has passed
    held = bucket.keys(url)
    questions = [k.split("/")[-1] for k in held if k.startswith("questions/")]
    assert len(questions) == 1 and questions[0].startswith("pack-")
    # machine b compacts from its old mirror: its catalog would replace one it never read
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "b"))
    (b / "compacted").mkdir(exist_ok=True)
    (b / "compacted" / "exp.json").write_text('{"version": 1, "experiment": "exp", "kinds": {}}')
    with pytest.raises(ConflictError, match=r"compacted/exp.json: changed by another writer since this machine read it"):
        push_up(b)
    # after fetching, b holds a's commit and reads the pack
    b = on(tmp_path / "b", monkeypatch, url)
    assert (b / "compacted" / "exp.json").read_text() == (a / "compacted" / "exp.json").read_text()
    assert EventStore(b).read("questions")["qid"].tolist() == ["q1"]
    assert EventStore(b).segments("questions")[0].name.startswith("pack-")


def test_a_run_in_one_process_puts_its_segments_at_its_end_and_compacted_ones_never(bucket, tmp_path, monkeypatch):
    """`pushed(..., segments_at_end=True)` (a run on the thread runner): nothing is put while the command writes;
    at its end the segments go to the bucket, except those a compaction already replaced by a pack, which are put
    neither then nor later; the next command on the mirror puts segments as they are written again."""
    url = bucket.url("at-end")
    a = on(tmp_path / "a", monkeypatch, url, creating=True)
    with pushed(a, segments_at_end=True):
        questions_store(a)
        assert not [k for k in bucket.keys(url) if k.startswith("questions/")]
    assert [k for k in bucket.keys(url) if k.startswith("questions/")] == \
        [p.relative_to(a).as_posix() for p in EventStore(a).segments("questions")]
    url = bucket.url("compacted-at-end")
    c = on(tmp_path / "c", monkeypatch, url, creating=True)
    with pushed(c, segments_at_end=True):
        questions_store(c)
        compact_experiment(EventStore(c), "exp")
    assert [k.split("/")[-1][:5] for k in bucket.keys(url) if k.startswith("questions/")] == ["pack-"]
    EventStore(c).write("questions", new_events("questions", "exp2", [{
        "event_id": event_id("questions", "exp2", "q2"), "cell": "", "qid": "q2", "dataset": "jsonl",
        "question": "Which?", "answers": ["A"], "gold_pids": []}]))
    assert [k for k in bucket.keys(url) if k.startswith("questions/exp2/seg-")]


def test_what_a_committed_catalog_made_unread_is_not_fetched_again(bucket, tmp_path, monkeypatch):
    """While the replaced segments wait out their retention time in the bucket, a mirror holding the catalog that
    replaced them (the compacting machine's, whose own copies compaction deleted, or any later reader's) fetches the
    pack only; one whose catalog is older still reads the events."""
    from tracking.store.objects import s3_objects
    from tracking.store.remote import pull_down

    url = bucket.url("unread")
    a = on(tmp_path / "a", monkeypatch, url, creating=True)
    questions_store(a)
    old = on(tmp_path / "old", monkeypatch, url)  # a reader that fetched before the compaction
    compact_experiment(EventStore(a), "exp")
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "a"))
    push_up(a, collect=True)
    segment = next(k for k in bucket.keys(url) if k.startswith("questions/exp/seg-"))  # kept for the retention time
    assert not (a / segment).exists()
    assert pull_down(a, s3_objects(url)) == 0 and not (a / segment).exists()
    c = on(tmp_path / "c", monkeypatch, url)
    assert not (c / segment).exists()
    assert [p.name[:5] for p in (c / "questions" / "exp").iterdir()] == ["pack-"]
    assert EventStore(c).read("questions")["qid"].tolist() == ["q1"]
    assert EventStore(old).read("questions")["qid"].tolist() == ["q1"]  # its listed segment is still there
    old = on(tmp_path / "old", monkeypatch, url)  # and after its next fetch, it reads the pack
    assert EventStore(old).segments("questions")[0].name.startswith("pack-")


def _response(text: str) -> dict:
    return {"text": text, "mean_logprob": -0.5, "tokens_in": 10, "tokens_out": 2, "latency_ms": 3.0}


def _cached(root) -> dict:
    from engines.llm_cache import LLMCallCache

    cache = LLMCallCache(root / "llm_cache.sqlite")
    try:
        return dict(cache.items())
    finally:
        cache.close()


def _put_calls(root, calls: dict) -> None:
    from engines.llm_cache import LLMCallCache

    cache = LLMCallCache(root / "llm_cache.sqlite")
    try:
        cache.put_many(calls.items())
    finally:
        cache.close()


def test_calls_are_shared_as_call_packs_each_put_once(bucket, tmp_path, monkeypatch):
    url = bucket.url("calls")
    a = on(tmp_path / "a", monkeypatch, url, creating=True)
    questions_store(a)
    first = {"a" * 32: _response("Paris"), "b" * 32: _response("Rome")}
    _put_calls(a, first)
    push_up(a)
    packs = [k for k in bucket.keys(url) if k.startswith("callpacks/")]
    assert len(packs) == 1 and packs[0].endswith(".jsonl.gz")
    push_up(a)  # nothing new: no second pack
    assert [k for k in bucket.keys(url) if k.startswith("callpacks/")] == packs

    b = on(tmp_path / "b", monkeypatch, url)  # an empty cache, filled from the bucket, keyed as machine a's
    assert _cached(b) == first
    _put_calls(b, {"c" * 32: _response("Oslo")})
    push_up(b)  # only the call no pack holds
    new = sorted(set(k for k in bucket.keys(url) if k.startswith("callpacks/")) - set(packs))
    assert len(new) == 1
    from tracking.store import callpack

    assert [c["key"] for c in callpack.read(b / new[0]).calls] == ["c" * 32]
    a = on(tmp_path / "a", monkeypatch, url)
    assert _cached(a) == {**first, "c" * 32: _response("Oslo")}


def test_a_damaged_call_pack_is_one_error_naming_it_and_imports_nothing(bucket, tmp_path, monkeypatch):
    import gzip

    from tracking.store.objects import StorageError

    url = bucket.url("badcalls")
    a = on(tmp_path / "a", monkeypatch, url, creating=True)
    questions_store(a)
    _put_calls(a, {"d" * 32: _response("Bern")})
    push_up(a)
    (key,) = [k for k in bucket.keys(url) if k.startswith("callpacks/")]
    raw = gzip.decompress((a / key).read_bytes()).replace(b"Bern", b"Bonn")
    prefix = url.removeprefix(f"s3://{bucket.bucket}/")
    bucket.client().put_object(Bucket=bucket.bucket, Key=f"{prefix}/callpacks/{'e' * 32}.jsonl.gz",
                               Body=gzip.compress(raw))
    with pytest.raises(StorageError, match=rf"{url}/callpacks/{'e' * 32}.jsonl.gz: checksum mismatch"):
        on(tmp_path / "b", monkeypatch, url)
    (b,) = (tmp_path / "b" / "stores").iterdir()
    assert all(r["text"] != "Bonn" for r in _cached(b).values())  # nothing of the damaged pack
    imported = b / ".remote" / "callpacks.json"
    assert not imported.exists() or f"{'e' * 32}.jsonl.gz" not in imported.read_text()


def test_a_long_lived_worker_remembers_the_mirrors_of_its_latest_runs_only(bucket, tmp_path, monkeypatch):
    """A worker opens the store's mirror once per run (`mirror_for_run`) and keeps the latest RUN_MIRRORS_KEPT runs'
    entries, not one for every run it ever served."""
    from tracking.store import remote

    url = bucket.url("runs")
    questions_store(on(tmp_path / "w", monkeypatch, url, creating=True))  # a store: a record in the bucket
    monkeypatch.setattr(remote, "_run_mirrors", type(remote._run_mirrors)())
    monkeypatch.setattr(remote, "RUN_MIRRORS_KEPT", 3)  # each new run's entry opens the mirror: a listing
    mirrors = {remote.mirror_for_run(url, f"run-{i}") for i in range(5)}
    assert remote.mirror_for_run(url, "run-4") in mirrors and len(mirrors) == 1  # one mirror, whichever run asks
    assert list(remote._run_mirrors) == [(url, "run-2"), (url, "run-3"), (url, "run-4")]
