"""Every corpus source at a tiny size, read through ragledger as a run reads it (strategies/retrievers/corpus.py,
strategies/retrievers/lucene.py): a JSON-lines file, DPR's passage TSV, a Lucene index built by Pyserini's own indexer,
and a Pyserini prebuilt index found in Pyserini's cache (placed there: no download here). Each gives the same hits
over the same passages; a bad corpus is one `error:` line naming what is wrong, and nothing is written."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from core.datasets import DatasetError, iter_corpus_batches
from core.hashing import stable_hash
from strategies.retrievers import parse_retriever
from strategies.retrievers.base import Query, reader_text
from strategies.retrievers.corpus import Corpus, CorpusError
from strategies.retrievers.lucene import PassageStore
from tests.corpora import pyserini_index

PASSAGES = [  # DPR's rows look like this: an integer id, a 100-word text, the article title
    ("1", 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses.', "Aaron"),
    ("2", "Paris is the capital and most populous city of France, on the Seine.", "Paris"),
    ("3", "The Nile is a major north-flowing river in northeastern Africa.", "Nile"),
    ("4", "Mount Everest is Earth's highest mountain above sea level.", "Mount Everest"),
]
QUERIES = [Query("q1", "Which river flows north in Africa?"), Query("q2", "capital of France"),
           Query("q3", "brother of Moses")]
PREBUILT = "wikipedia-dpr-100w"
PREBUILT_FOLDER = "lucene-index.wikipedia-dpr-100w.20210120.d1b9e6.7b58c08da992b2ea7e96667f0b176651"


def dpr_tsv(path: Path) -> Path:
    """DPR's psgs_w100.tsv format: header, then id, text (CSV-quoted, inner quotes doubled), title."""
    def quote(s: str) -> str:
        return '"' + s.replace('"', '""') + '"' if '"' in s else s

    lines = ["id\ttext\ttitle", *(f"{pid}\t{quote(text)}\t{title}" for pid, text, title in PASSAGES)]
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def pyserini_json(folder: Path) -> Path:
    """The passages as Pyserini's DPR Wikipedia indexes hold them: {id, contents} with the title in double quotes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.jsonl").write_text("".join(json.dumps({"id": pid, "contents": f'"{title}"\n{text}'}) + "\n"
                                               for pid, text, title in PASSAGES), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def pyserini_built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pyserini")
    pyserini_index(pyserini_json(root / "docs"), root / "index")
    return root / "index"


def hits_of(corpus: Corpus, index_root: Path) -> dict[str, list[tuple[str, str]]]:
    bm25 = parse_retriever("bm25@2")
    bm25.prepare(corpus, index_root, log=lambda *_: None)
    return {qid: [(h.pid, h.text) for h in hits] for qid, hits in bm25.retrieve(QUERIES).items()}


def test_a_dpr_tsv_streams_hashes_as_its_content_and_is_searched(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    corpus = Corpus.load("dpr-tsv", (str(dpr_tsv(tmp_path / "psgs_w100.tsv.gz")),))
    assert corpus.passages == 4 and corpus.built_here
    assert corpus.corpus_hash == stable_hash("corpus", [p for p, _, _ in PASSAGES], [t for _, _, t in PASSAGES],
                                             [x for _, x, _ in PASSAGES])
    assert next(iter(corpus.stream())) == ("1", "Aaron", PASSAGES[0][1])  # the quoted text read back exactly
    hits = hits_of(corpus, tmp_path / "indexes")
    assert hits["q1"][0] == ("3", reader_text("Nile", PASSAGES[2][1])) and hits["q2"][0][0] == "2"
    assert hits["q3"][0] == ("1", reader_text("Aaron", PASSAGES[0][1]))


def test_jsonl_in_either_shape_is_the_same_corpus_as_the_tsv(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    tsv = Corpus.load("dpr-tsv", (str(dpr_tsv(tmp_path / "psgs.tsv.gz")),))
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"id": p, "title": t, "text": x}) + "\n" for p, x, t in PASSAGES))
    contents = tmp_path / "contents.jsonl"  # Pyserini's JsonCollection shape: the first line is the title
    contents.write_text("".join(json.dumps({"id": p, "contents": f"{t}\n{x}"}) + "\n" for p, x, t in PASSAGES))
    as_plain, as_contents = Corpus.load("jsonl", (str(plain),)), Corpus.load("jsonl", (str(contents),))
    assert as_plain.corpus_hash == as_contents.corpus_hash == tsv.corpus_hash
    # Anserini's own input shape is indexed in place (not rewritten); the hits are the same passages either way
    assert as_contents.anserini_ready and not as_plain.anserini_ready and not tsv.anserini_ready
    expected = hits_of(tsv, tmp_path / "indexes-tsv")
    assert hits_of(as_plain, tmp_path / "indexes-plain") == expected == hits_of(as_contents, tmp_path / "indexes-contents")


QUOTED = [  # DPR's layout with every text and title in double quotes, inner quotes doubled; titles that need them
    ("10", 'Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses.', 'Aaron "the priest"'),
    ("11", "Paris is the capital and most populous city of France, on the Seine.", "Paris"),
    ("12", "The Nile is a major north-flowing river in northeastern Africa; Moses was found on its banks.", "Nile"),
    ("13", "Le Mans hosts a 24-hour race; the river Sarthe runs through it.", "Le Mans, \"France\""),
]


def stored_documents(index_dir: Path) -> list[tuple[str, str]]:
    """(id, raw stored document) of every document of an index, in Lucene's order."""
    from strategies.retrievers.lucene import searcher

    found = searcher(index_dir)
    return [(found.doc(i).get("id"), found.doc(i).get("raw")) for i in range(int(found.get_total_num_docs()))]


def quoted_tsv(path: Path) -> Path:
    quote = lambda s: '"' + s.replace('"', '""') + '"'  # noqa: E731
    path.write_text("id\ttext\ttitle\n" + "".join(f"{p}\t{quote(x)}\t{quote(t)}\n" for p, x, t in QUOTED), encoding="utf-8")
    return path


def test_a_dpr_tsv_is_indexed_as_the_same_passages_as_jsonl_read_in_place(tmp_path, monkeypatch):
    """A DPR TSV is converted while Anserini indexes it, through a pipe: by the one read that names a new file
    (`load_with_index`, as `ragledger index` does), or by a read of its own for a file named already. Either way the
    index holds exactly what Anserini builds from the same passages as a JSON-lines file it reads in place: the same
    documents in the same order, stored byte for byte alike, and the same hits with the same scores."""
    import strategies.retrievers.corpus as corpus_module
    from strategies.retrievers.lucene import load_with_index, lucene_index

    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    reads = []
    monkeypatch.setattr(corpus_module, "iter_corpus_batches", lambda *a: reads.append(a[0]) or iter_corpus_batches(*a))
    jsonl = tmp_path / "contents.jsonl"
    jsonl.write_text("".join(json.dumps({"id": p, "contents": f"{t}\n{x}"}) + "\n" for p, x, t in QUOTED))
    from_jsonl = Corpus.load("jsonl", (str(jsonl),))
    tsv = quoted_tsv(tmp_path / "psgs_w100.tsv")
    in_one_read = load_with_index("dpr-tsv", (str(tsv),), None, tmp_path / "indexes-one-read", log=lambda *_: None)
    assert reads == ["jsonl", "dpr-tsv"] and Corpus.named("dpr-tsv", (str(tsv),))  # named and indexed: one read
    built = lucene_index(in_one_read, tmp_path / "indexes-one-read", log=lambda *_: None)
    assert reads == ["jsonl", "dpr-tsv"]  # the index was there: not read again
    from_tsv = Corpus.load("dpr-tsv", (str(tsv),))  # named now: its index is built by a read of its own
    assert from_jsonl.anserini_ready and not from_tsv.anserini_ready
    assert from_tsv.passages_hash == from_jsonl.passages_hash == in_one_read.passages_hash
    assert next(iter(from_tsv.stream())) == ("10", 'Aaron "the priest"', QUOTED[0][1])  # the quotes taken off
    read_in_place = lucene_index(from_jsonl, tmp_path / "indexes-jsonl", log=lambda *_: None)
    assert stored_documents(built) == stored_documents(read_in_place)
    assert stored_documents(lucene_index(from_tsv, tmp_path / "indexes-tsv", log=lambda *_: None)) == \
           stored_documents(read_in_place)
    assert [doc_id for doc_id, _ in stored_documents(built)] == [p for p, _, _ in QUOTED]
    queries = [*QUERIES, Query("q4", "race on the Sarthe"), Query("q5", "Ahärôn priest")]

    def hits(corpus: Corpus, root: Path) -> dict:
        bm25 = parse_retriever("bm25@4")
        bm25.prepare(corpus, root, log=lambda *_: None)
        return {qid: [(h.pid, h.score, h.title, h.text) for h in found] for qid, found in bm25.retrieve(queries).items()}

    expected = hits(from_jsonl, tmp_path / "indexes-jsonl")
    assert hits(in_one_read, tmp_path / "indexes-one-read") == expected == hits(from_tsv, tmp_path / "indexes-tsv")
    assert expected["q4"][0][0] == "13" and expected["q4"][0][2] == 'Le Mans, "France"'


def test_a_corpus_that_fails_while_it_is_indexed_publishes_no_index(tmp_path, monkeypatch):
    """The passages are read while Lucene indexes them. A file changed since it was named, with a malformed row
    half-way, fails the build with that row's error; a new file whose ids repeat, found at the end of the read that
    names it, too. Neither an index nor its build folder is left, and nothing is kept for the failed file."""
    from strategies.retrievers.lucene import load_with_index, lucene_index

    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    path = dpr_tsv(tmp_path / "psgs.tsv.gz")
    corpus = Corpus.load("dpr-tsv", (str(path),))
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("id\ttext\ttitle\n1\tfirst passage\tA\n2\tsecond passage\tB\n3\tonly two fields\n4\tfourth\tD\n")
    with pytest.raises(DatasetError, match=r"psgs.tsv.gz: row 4: expected 3 tab-separated fields"):
        lucene_index(corpus, tmp_path / "indexes", log=lambda *_: None)
    assert list((tmp_path / "indexes").iterdir()) == []
    twice = tmp_path / "twice.tsv"
    twice.write_text("id\ttext\ttitle\n1\tfirst passage\tA\n2\tsecond passage\tB\n1\tthird passage\tC\n")
    with pytest.raises(DatasetError, match=r"twice.tsv: row 4: field 'id': duplicate id '1' \(first at row 2\)"):
        load_with_index("dpr-tsv", (str(twice),), None, tmp_path / "indexes", log=lambda *_: None)
    assert list((tmp_path / "indexes").iterdir()) == [] and not Corpus.named("dpr-tsv", (str(twice),))


def test_a_lucene_index_built_by_pyserini_is_searched_and_read_in_place(tmp_path, monkeypatch, pyserini_built):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    corpus = Corpus.load("lucene", (str(pyserini_built),))
    assert not corpus.built_here and corpus.index_dir == pyserini_built and corpus.passages is None
    hits = hits_of(corpus, tmp_path / "indexes")
    assert not (tmp_path / "indexes").exists()  # nothing built: the given index is the corpus
    # the title comes out of Pyserini's quotes; the same passages as the same corpus given as a TSV
    assert hits == hits_of(Corpus.load("dpr-tsv", (str(dpr_tsv(tmp_path / "p.tsv.gz")),)), tmp_path / "built")
    store = PassageStore.of(corpus, tmp_path / "indexes")
    assert store.passage("4") == ("Mount Everest", reader_text("Mount Everest", PASSAGES[3][1]))
    assert store.passage("no-such-id") is None and store.size() == 4
    assert Corpus.load("lucene", (str(pyserini_built),)).corpus_hash == corpus.corpus_hash  # the index's identity


def test_a_pyserini_prebuilt_index_is_found_in_pyserinis_cache(tmp_path, monkeypatch, pyserini_built):
    """`corpus: {name: prebuilt, paths: [wikipedia-dpr-100w]}` resolves to the folder Pyserini itself downloads and
    unpacks that index to ($PYSERINI_CACHE/indexes/<file>.<md5>); placed there, it is used with no download."""
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYSERINI_CACHE", str(tmp_path / "pyserini-cache"))
    shutil.copytree(pyserini_built, tmp_path / "pyserini-cache" / "indexes" / PREBUILT_FOLDER)
    corpus = Corpus.load("prebuilt", (PREBUILT,))
    assert corpus.index_dir == tmp_path / "pyserini-cache" / "indexes" / PREBUILT_FOLDER
    assert hits_of(corpus, tmp_path / "indexes") == hits_of(Corpus.load("lucene", (str(pyserini_built),)), tmp_path / "i")


# ---- bad corpora: one clear error each, nothing written ---------------------------------------------------

def test_bad_corpora_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    with pytest.raises(CorpusError, match=r"corpus.paths: .*missing.tsv: file not found"):
        Corpus.load("dpr-tsv", (str(tmp_path / "missing.tsv"),))
    wrong = tmp_path / "wrong.tsv"
    wrong.write_text("pid\tpassage\ttitle\n1\tsome text\tT\n")
    with pytest.raises(DatasetError, match=r"wrong.tsv: row 1: the header must be 'id\\ttext\\ttitle'"):
        Corpus.load("dpr-tsv", (str(wrong),))
    short = tmp_path / "short.tsv"
    short.write_text("id\ttext\ttitle\n1\tonly text\n")
    with pytest.raises(DatasetError, match=r"short.tsv: row 2: expected 3 tab-separated fields"):
        Corpus.load("dpr-tsv", (str(short),))
    twice = tmp_path / "twice.jsonl"
    twice.write_text('{"id": "a", "text": "x"}\n{"id": "b", "text": "y"}\n{"id": "a", "text": "z"}\n')
    with pytest.raises(DatasetError, match=r"twice.jsonl: row 3: field 'id': duplicate id 'a' \(first at row 1\)"):
        Corpus.load("jsonl", (str(twice),))
    with pytest.raises(CorpusError, match="no such index folder"):
        Corpus.load("lucene", (str(tmp_path / "nothing-here"),))
    (tmp_path / "not-an-index").mkdir()
    with pytest.raises(CorpusError, match="not a Lucene index"):
        Corpus.load("lucene", (str(tmp_path / "not-an-index"),))
    assert not list((tmp_path / "home" / "corpora").glob("*.json"))  # nothing kept for a corpus that failed


def test_an_index_without_stored_documents_is_refused(tmp_path):
    bare = tmp_path / "bare"
    pyserini_index(pyserini_json(tmp_path / "docs"), bare, store_raw=False)
    corpus = Corpus.load("lucene", (str(bare),))
    with pytest.raises(CorpusError, match=r"the Lucene index stores no documents .*--storeRaw"):
        PassageStore.of(corpus, tmp_path / "indexes")


def test_a_run_on_a_bad_corpus_is_one_error_line_and_writes_nothing(tmp_path):
    from tests.test_reliability import cli, make_data, write_spec

    make_data(tmp_path, 4)
    spec = write_spec(tmp_path, "http://127.0.0.1:9/v1")
    wrong = tmp_path / "wrong.tsv"
    wrong.write_text("pid\tpassage\ttitle\n1\tsome text\tT\n")
    for corpus, needle in ((f"dpr-tsv:{wrong}", "row 1: the header must be"),
                           (f"lucene:{tmp_path}", "not a Lucene index (no segments_N file)"),
                           ("jsonl", "give the jsonl corpus's location as --corpus jsonl:PATH")):
        proc = cli(tmp_path, "run", str(spec), "--corpus", corpus)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and not (tmp_path / ".ragledger").exists()


def faiss_directory(folder: Path, pids: list[str], texts: list[str]) -> Path:
    """A FAISS index directory in Pyserini's layout (`index`, `docid`), its vectors the bundled encoder's."""
    import faiss

    from engines.onnx_encoder import encode

    folder.mkdir(parents=True)
    vectors = encode(texts)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(folder / "index"))
    (folder / "docid").write_text("".join(f"{pid}\n" for pid in pids))
    return folder


def test_a_faiss_directory_in_pyserinis_layout_serves_dense_retrieval(tmp_path, monkeypatch, pyserini_built):
    """`corpus: {name: lucene, paths: [INDEX], faiss: DIR}`: dense@k searches the given FAISS directory (no dense index
    is built) and reads its hits' passages from the Lucene index; the same hits as the dense index ragledger builds
    over the same passages. The FAISS directory enters the corpus hash (the retrieve keys) but not the passages'."""
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    folder = faiss_directory(tmp_path / "faiss", [p for p, _, _ in PASSAGES], [reader_text(t, x) for _, x, t in PASSAGES])
    given = Corpus.load("lucene", (str(pyserini_built),), str(folder))
    plain = Corpus.load("lucene", (str(pyserini_built),))
    assert given.passages_hash == plain.passages_hash and given.corpus_hash != plain.corpus_hash
    dense = parse_retriever("dense@2")
    dense.prepare(given, tmp_path / "indexes", log=lambda *_: None)
    assert not (tmp_path / "indexes").exists()  # searched in place: nothing encoded, nothing built
    ours = parse_retriever("dense@2")
    ours.prepare(Corpus.load("dpr-tsv", (str(dpr_tsv(tmp_path / "p.tsv.gz")),)), tmp_path / "built", log=lambda *_: None)
    theirs, built = dense.retrieve(QUERIES), ours.retrieve(QUERIES)
    assert {q: [(h.pid, h.text) for h in hits] for q, hits in theirs.items()} == \
           {q: [(h.pid, h.text) for h in hits] for q, hits in built.items()}
    assert theirs["q1"][0].pid == "3"
    (folder / "docid").unlink()
    with pytest.raises(CorpusError, match=r"corpus.faiss: .*faiss: no 'docid' file \(Pyserini's FAISS layout"):
        Corpus.load("lucene", (str(pyserini_built),), str(folder))


def test_a_run_on_a_pyserini_index_gives_the_outcomes_of_a_run_on_its_passage_file(tmp_path):
    """The whole flow (head start, retrieve, generate, evaluate) with `--corpus lucene:INDEX` over an index Pyserini built
    of the workspace's passages: the same outcomes as the run on the passage file itself."""
    from tests.fakes.openai_server import ScriptedServer
    from tests.test_reliability import cli, make_data, outcome_table, reader, write_spec

    by_file, by_index = tmp_path / "file", tmp_path / "index"
    for ws in (by_file, by_index):
        ws.mkdir()
        make_data(ws, 8)
    rows = [json.loads(line) for line in (by_index / "corpus.jsonl").read_text().splitlines()]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "docs.jsonl").write_text("".join(json.dumps({"id": r["id"], "contents": f"{r['title']}\n{r['text']}"})
                                                         + "\n" for r in rows))
    pyserini_index(tmp_path / "docs", tmp_path / "lucene")
    with ScriptedServer(answer=reader) as server:
        for ws, extra in ((by_file, []), (by_index, ["--corpus", f"lucene:{tmp_path / 'lucene'}"])):
            proc = cli(ws, "run", str(write_spec(ws, server.base_url)), *extra)
            assert proc.returncode == 0, proc.stderr[-3000:]
    assert outcome_table(by_index) == outcome_table(by_file) and len(outcome_table(by_file)) == 2 * 8


def test_a_flat_faiss_index_is_memory_mapped_not_copied(tmp_path):
    """strategies/retrievers/dense.py `read_faiss`: a flat index's vectors stay file pages (the process's anonymous
    memory does not grow by their size), and the search is the same as over the index read whole."""
    import faiss
    import numpy as np

    from strategies.retrievers.dense import read_faiss

    vectors = np.random.default_rng(0).random((20_000, 384), dtype=np.float32)  # 29 MiB
    whole = faiss.IndexFlatIP(384)
    whole.add(vectors)
    faiss.write_index(whole, str(tmp_path / "index"))

    def anonymous_kib() -> int:
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon"))

    before = anonymous_kib()
    mapped = read_faiss(tmp_path / "index")
    scores, rows = mapped.search(vectors[:5], 10)
    assert anonymous_kib() - before < 10 * 1024  # not the 29 MiB of vectors
    expected_scores, expected_rows = whole.search(vectors[:5], 10)
    assert np.array_equal(rows, expected_rows) and np.allclose(scores, expected_scores)

