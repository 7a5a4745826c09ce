"""DPR's passage TSV read in blocks (core/datasets.py `_dpr_tsv_batches`): the rows are what csv.reader reads from the
file's lines, whether a block is split with bytes operations or read by csv.reader itself; the corpus hash of a file
stays what it was (indexes built before are still the corpus's); a bad row is named by its row number either way."""

from __future__ import annotations

import csv
import gzip
import json
import random

import pytest

import core.datasets as datasets
from core.datasets import DatasetError, PassageBatch, iter_corpus
from core.hashing import stable_hash
from strategies.retrievers.corpus import JsonBatch, stream_hash
from strategies.retrievers.lucene import anserini_lines

# quoted fields with doubled quotes, a tab and a line break inside quotes (csv.reader, given the lines without their
# line ends, joins the two lines without one), text after a closing quote, a quote inside an unquoted field, non-ASCII,
# U+2028, a control character, a CRLF line end, an empty title, a last line without a line end
PINNED = (b'id\ttext\ttitle\n'
          b'1\t"Aaron ""the"" priest, brother of Moses"\t"Aaron"\n'
          b'2\tplain text with a 5\'2" height and back\\slash\tPlain title\n'
          b'3\t"a tab\tinside and a line\nbreak inside quotes"\t"Title ""quoted"""\n'
          b'4\t"closed"then more\t"x"y\n'
          b'5\t"\xc3\xa9t\xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80 \x01 control"\t\xc3\x89t\xc3\xa9\r\n'
          b'6\t"empty title next"\t\n'
          b'7\tlast row, no line end\t""')
PINNED_HASH = "0cb4bdd0812513406eb3c511249a8005"  # computed by the row-by-row csv.reader before the block reader
PINNED_ROWS = [(2, "1", "Aaron", 'Aaron "the" priest, brother of Moses'),
               (3, "2", "Plain title", "plain text with a 5'2\" height and back\\slash"),
               (4, "3", 'Title "quoted"', "a tab\tinside and a linebreak inside quotes"),
               (5, "4", "xy", "closedthen more"),
               (6, "5", "Été", "été \u2028 😀 \x01 control"),
               (7, "6", "", "empty title next"),
               (8, "7", "", "last row, no line end")]


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_dpr_tsv_keeps_its_content_hash(tmp_path, monkeypatch, gzipped):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    path = tmp_path / ("psgs.tsv.gz" if gzipped else "psgs.tsv")
    path.write_bytes(gzip.compress(PINNED) if gzipped else PINNED)
    assert list(iter_corpus("dpr-tsv", [str(path)])) == PINNED_ROWS
    assert stream_hash("dpr-tsv", (str(path),)) == (PINNED_HASH, 7)
    _, pids, titles, texts = zip(*PINNED_ROWS, strict=True)
    assert stable_hash("corpus", list(pids), list(titles), list(texts)) == PINNED_HASH


def reference_rows(data: bytes) -> list[list[str]]:
    """What the row-by-row reader read: csv.reader over the lines split on \\n, line ends taken off."""
    lines = data.decode("utf-8").split("\n")
    lines = [line.rstrip("\r") for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    return list(csv.reader(lines, delimiter="\t"))[1:]


def random_tsv(rng: random.Random, rows: int, quoting: float = 0.7) -> bytes:
    words = ["Aaron", "the", 'say "hi"', "ö", "😀", "back\\slash", "tab\there", "a\u2028b", "", " ", '"', '""', "x"]

    def field(quoted: bool) -> str:
        value = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6))).strip() or "w"
        if quoted:
            return '"' + value.replace('"', '""') + '"'
        value = value.replace("\t", " ")  # unquoted: no tab; a quote inside (not first) is a character
        return value.replace('"', "'") if rng.random() < 0.9 else "w" + value

    out = ["id\ttext\ttitle"]
    for i in range(rows):
        text, title = field(rng.random() < quoting), field(rng.random() < quoting / 2)
        if quoting and rng.random() < 0.02:  # a quoted field running over a line break
            text = '"first line\nsecond line"'
        if quoting and rng.random() < 0.02:  # text after the closing quote
            title = '"closed"after'
        out.append(f"{i}\t{text}\t{title}" + ("\r" if rng.random() < 0.01 else ""))
    return ("\n".join(out) + "\n").encode("utf-8")


@pytest.mark.parametrize("block", [64, 1000, 1 << 22])
def test_rows_are_what_csv_reader_reads_from_the_lines(tmp_path, monkeypatch, block):
    """Blocks of every size: a row running past a block's end, blocks split plainly and blocks read by csv.reader,
    mixed; the hash is the JSON of the three columns, and Anserini's lines are json.dumps' of each passage."""
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(datasets, "TSV_BLOCK", block)
    rng = random.Random(block)
    for n, data in enumerate([random_tsv(rng, 3000), random_tsv(rng, 500, quoting=0), random_tsv(rng, 500, quoting=1)]):
        path = tmp_path / f"p{n}.tsv.gz"
        path.write_bytes(gzip.compress(data))
        expected = reference_rows(data)
        got = list(iter_corpus("dpr-tsv", [str(path)]))
        assert [[pid, text, title] for _, pid, title, text in got] == expected
        assert [row for row, *_ in got] == list(range(2, len(expected) + 2))
        pids, texts, titles = (list(column) for column in zip(*expected, strict=True))
        assert stream_hash("dpr-tsv", (str(path),)) == (stable_hash("corpus", pids, titles, texts), len(expected))
        lines = b"".join(anserini_lines(JsonBatch(batch)) for batch in datasets.iter_corpus_batches("dpr-tsv", [str(path)]))
        assert lines.decode("utf-8").split("\n") == [  # split on \n only: U+2028 is a character of a JSON string
            json.dumps({"id": p, "contents": f"{t}\n{x}"}, ensure_ascii=False) for p, x, t in expected] + [""]


def test_a_plain_block_decodes_once_for_the_hash_and_the_index(tmp_path):
    """A block split plainly hands its UTF-8 columns on (`PassageBatch.utf8`): they are not encoded again."""
    path = tmp_path / "p.tsv"
    path.write_text("id\ttext\ttitle\n1\t\"a \"\"b\"\"\"\tT\n2\tc\t\"U\"\n", encoding="utf-8")
    (batch,) = datasets.iter_corpus_batches("dpr-tsv", [str(path)])
    assert batch.utf8 == (b"1\n2", b"T\nU", b'a "b"\nc')
    assert (batch.pids, batch.titles, batch.texts) == (["1", "2"], ["T", "U"], ['a "b"', "c"])
    assert JsonBatch(PassageBatch(1, batch.pids, batch.titles, batch.texts)).texts == JsonBatch(batch).texts


@pytest.mark.parametrize(("bad", "message"), [
    (b"2999\tonly two fields\n", "row 3000: expected 3 tab-separated fields (id, text, title), got 2"),
    (b"\t\"no id\"\tT\n", "row 3000: field 'id' missing"),
    (b"2999\t\"  \"\tT\n", "row 3000: field 'text' is empty"),
    ("2999\t\u00a0\u3000\tT\n".encode(), "row 3000: field 'text' is empty"),  # blank to str.strip, not to bytes.strip
    (b"\n", "row 3000: expected 3 tab-separated fields (id, text, title), got 0"),
    (b"2999\tcaf\xe9\tT\n", "not valid UTF-8 (byte offset "),
])
def test_a_bad_row_in_a_plain_block_is_named(tmp_path, monkeypatch, bad, message):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    good = "".join(f'{i}\t"passage ""{i}"""\tTitle {i}\n' for i in range(1, 2999)).encode()
    data = b"id\ttext\ttitle\n" + good + bad + b"3000\tafter\tT\n"
    path = tmp_path / "bad.tsv.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(DatasetError, match=r"bad.tsv.gz: " + message.replace("(", r"\(").replace(")", r"\)")):
        stream_hash("dpr-tsv", (str(path),))
    if b"\xe9" in bad:  # the offset is the bad byte's own in the decompressed file
        with pytest.raises(DatasetError, match=f"byte offset {data.index(bytes([0xe9]))}\\)"):
            list(iter_corpus("dpr-tsv", [str(path)]))


def test_a_cut_off_gzip_file_is_named(tmp_path):
    path = tmp_path / "cut.tsv.gz"
    path.write_bytes(gzip.compress(b"id\ttext\ttitle\n" + b"1\tsome text\tT\n" * 1000)[:-40])
    with pytest.raises(DatasetError, match=r"cut.tsv.gz: the gzip file ends before its end marker"):
        list(iter_corpus("dpr-tsv", [str(path)]))
    two = tmp_path / "two.tsv.gz"  # two gzip members, as `cat a.gz b.gz` makes: read as one file
    two.write_bytes(gzip.compress(b"id\ttext\ttitle\n1\tone\tA\n") + gzip.compress(b"2\ttwo\tB\n") + b"\0\0")
    assert [pid for _, pid, _, _ in iter_corpus("dpr-tsv", [str(two)])] == ["1", "2"]
