"""The named pipe a corpus is converted into while Anserini indexes it (strategies/retrievers/lucene.py `PipeFeed`):
what the reader gets, and what happens when the reader or the conversion stops early (no hang, a named error)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from core.datasets import DatasetError, PassageBatch
from strategies.retrievers.corpus import CorpusError, JsonBatch
from strategies.retrievers.lucene import PipeFeed, anserini_lines

CHUNKS = [bytes([65 + i % 26]) * 100_000 for i in range(20)]  # 2 MB: many times a pipe's buffer


def write_all(chunks) -> object:
    """A producer writing the chunks, returning how many it wrote."""
    def produce(write) -> int:
        n = 0
        for chunk in chunks:
            write(chunk)
            n += 1
        return n

    return produce


def reader(path: Path, limit: int | None = None) -> tuple[threading.Thread, bytearray]:
    """A thread reading the pipe as Anserini would (to its end, or `limit` bytes and then closing it)."""
    got = bytearray()

    def read() -> None:
        with path.open("rb") as fh:
            got.extend(fh.read() if limit is None else fh.read(limit))

    thread = threading.Thread(target=read)
    thread.start()
    return thread, got


def test_the_reader_gets_every_chunk_in_order(tmp_path):
    path = tmp_path / "corpus.jsonl"
    with PipeFeed(path, write_all(CHUNKS)) as feed:
        thread, got = reader(path)
        thread.join()
    assert bytes(got) == b"".join(CHUNKS) and feed.result == len(CHUNKS)


def test_a_reader_that_never_opens_the_pipe_fails_the_build_without_hanging(tmp_path):
    feed = PipeFeed(tmp_path / "corpus.jsonl", write_all(CHUNKS))
    with pytest.raises(CorpusError, match=r"stopped before reading every passage from .*corpus.jsonl"), feed:
        pass


def test_a_reader_that_stops_half_way_fails_the_build(tmp_path):
    path = tmp_path / "corpus.jsonl"
    with pytest.raises(CorpusError, match="stopped before reading every passage"), PipeFeed(path, write_all(CHUNKS)):
        thread, got = reader(path, limit=150_000)
        thread.join()
    assert bytes(got) == b"".join(CHUNKS)[:150_000]


def test_a_failed_conversion_ends_the_pipe_and_is_raised(tmp_path):
    def chunks():
        yield CHUNKS[0]
        raise DatasetError("psgs.tsv: row 7: expected 3 tab-separated fields (id, text, title), got 2")

    path = tmp_path / "corpus.jsonl"
    with pytest.raises(DatasetError, match="row 7"), PipeFeed(path, write_all(chunks())):
        thread, got = reader(path)
        thread.join()  # the reader sees the end of the pipe after what was converted
    assert bytes(got) == CHUNKS[0]


def test_an_error_of_the_reader_is_raised_as_it_is(tmp_path):
    with pytest.raises(RuntimeError, match="the indexer failed"), PipeFeed(tmp_path / "corpus.jsonl", write_all(CHUNKS)):
        raise RuntimeError("the indexer failed")


def test_lines_are_what_json_dumps_writes():
    """Anserini's input lines, built from a batch's encoded columns, are json.dumps' own (UTF-8, not ASCII escapes:
    Anserini stores each document as Jackson writes it again, tests/test_corpus_sources.py checks the stored bytes),
    whether a batch is encoded whole (no control character in it) or value by value (a title's line break)."""
    import json

    passages = [("1", "Aaron", 'Ahärôn "the" priest\\ok 😀'), ("2", "Two\nlines", "text\twith a tab"), ("3", "", "x")]
    for batch in (passages, [passages[0], passages[2]]):
        pids, titles, texts = (list(column) for column in zip(*batch, strict=True))
        lines = anserini_lines(JsonBatch(PassageBatch(1, pids, titles, texts))).decode("utf-8").split("\n")
        assert lines == [json.dumps({"id": p, "contents": f"{t.replace(chr(10), ' ')}\n{x}"}, ensure_ascii=False)
                         for p, t, x in batch] + [""]
