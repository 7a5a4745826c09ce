"""The retriever pool: the name grammar, dense retrieval (real model, offline), hybrid, rerank, word budget."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strategies.retrievers import parse_retriever
from strategies.retrievers.base import Hit, Query, Retriever
from strategies.retrievers.bm25 import BM25
from strategies.retrievers.compress import Compress
from strategies.retrievers.corpus import Corpus
from strategies.retrievers.dense import Dense
from strategies.retrievers.hybrid import Hybrid, merge_dedup
from strategies.retrievers.parametric import Parametric
from strategies.retrievers.rerank import RERANK_CANDIDATES, Rerank
from strategies.retrievers.truncate import Truncate, truncate_hits
from tests.corpora import jsonl_corpus

PASSAGES = [
    {"pid": "p1", "title": "Broncos", "text": "The Denver Broncos won Super Bowl 50 in Santa Clara, California."},
    {"pid": "p2", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"pid": "p3", "title": "Everest", "text": "Mount Everest is Earth's highest mountain above sea level."},
    {"pid": "p4", "title": "Nile", "text": "The Nile is a major north-flowing river in northeastern Africa."},
    {"pid": "p5", "title": "Lyon", "text": "Lyon is a city in France, known for its cuisine; it is not the capital."},
    {"pid": "p6", "title": "Photosynthesis", "text": "Plants convert light energy into chemical energy by photosynthesis."},
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    return jsonl_corpus(tmp_path_factory.mktemp("corpus"), PASSAGES)


# ---- grammar -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "inner"),
    [
        ("bm25@10", BM25, None),
        ("dense@10", Dense, None),
        ("bm25@rr@10", Rerank, BM25),
        ("dense@rr@3", Rerank, Dense),
        ("hybrid(bm25@5,dense@5)", Hybrid, None),
        ("hybrid(bm25@5, dense@5, parametric)", Hybrid, None),
        ("compress(bm25@10)", Compress, BM25),
        ("compress(hybrid(bm25@5,dense@5))", Compress, Hybrid),
        ("hybrid(bm25@25,dense@25)@rr@10", Rerank, Hybrid),
        ("trunc(parametric,100)", Truncate, Parametric),
        ("parametric", Parametric, None),
        ("  bm25@5  ", BM25, None),
    ],
)
def test_good_names_parse(name, kind, inner):
    r = parse_retriever(name)
    assert isinstance(r, kind) and r.name == name.strip()
    if inner is not None:
        assert isinstance(r.inner, inner)


def test_composites_carry_depth_flags_and_versions():
    rr = parse_retriever("bm25@rr@10")
    assert rr.k == 10 and rr.inner.k == RERANK_CANDIDATES and rr.inner.name == "bm25@50"
    h = parse_retriever("hybrid(bm25@5,dense@7)")
    assert [p.name for p in h.parts] == ["bm25@5", "dense@7"] and [p.k for p in h.parts] == [5, 7]
    assert parse_retriever("compress(bm25@10)").needs_llm and parse_retriever("compress(bm25@10)").needs_corpus
    assert parse_retriever("parametric").needs_llm and not parse_retriever("parametric").needs_corpus
    assert not parse_retriever("none").needs_corpus and not parse_retriever("hybrid(bm25@2,dense@2)").needs_llm
    # a composite's version names its parts, so changing a part's code re-runs the composite
    assert "bm25" in parse_retriever("compress(bm25@10)").code_version


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bm25@0", "k must be a positive integer, got 0"),
        ("dense@-3", "k must be a positive integer, got -3"),
        ("bm25@ten", "k must be a positive integer, got 'ten'"),
        ("bm25@rr@0", "k must be a positive integer, got 0"),
        ("sparse@5", "unknown retriever 'sparse'"),
        ("bm25", "needs a depth"),
        ("none@5", "'none' takes no '@k'"),
        ("hybrid(bm25@5)", "needs at least two retrievers"),
        ("hybrid(bm25@5,dense@5", "unbalanced parentheses"),
        ("hybrid(bm25@5,dense@5))", "unbalanced parentheses"),
        ("hybrid(bm25@5,)", "empty argument"),
        ("compress(bm25@5,dense@5)", "takes exactly one retriever"),
        ("compress(bm25@0)", "k must be a positive integer, got 0"),
        ("rerank(bm25@5)", "unknown wrapper rerank(...)"),
        ("trunc(bm25@5)", "takes a retriever and a word budget"),
        ("trunc(bm25@5,0)", "word budget must be positive"),
        ("", "empty retriever name"),
        ("BM25@5", "cannot parse"),
    ],
)
def test_bad_names_raise_clear_errors(name, message):
    with pytest.raises(ValueError, match="retriever ") as info:
        parse_retriever(name)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_spec_validation_reports_bad_retriever_name():
    from schemas.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match=r"field 'retrievers'.*hybrid\(bm25@5\).*at least two"):
        parse_spec({"name": "x", "retrievers": ["hybrid(bm25@5)"], "readers": ["concatenation"]}, "spec.yaml")


# ---- pure composition ----------------------------------------------------------------------------


def _hits(*pids: str) -> list[Hit]:
    return [Hit(p, 1.0, p, f"text of {p}") for p in pids]


def test_merge_dedup_keeps_first_occurrence_in_order():
    merged = merge_dedup([_hits("a", "b", "c"), _hits("c", "d", "a", "e")])
    assert [h.pid for h in merged] == ["a", "b", "c", "d", "e"]


def test_truncate_hits_word_budget():
    hits = [Hit("a", 1.0, "", "one two three four"), Hit("b", 1.0, "", "five six seven"), Hit("c", 1.0, "", "eight")]
    out = truncate_hits(hits, 6)
    assert [h.pid for h in out] == ["a", "b"] and out[1].text == "five six"
    assert sum(len(h.text.split()) for h in out) == 6
    assert truncate_hits(hits, 100) == hits


# ---- real retrieval over a tiny corpus (real model, real Lucene, offline) ----------------------


def test_dense_retrieves_offline_and_caches_the_index(corpus, tmp_path):
    r = parse_retriever("dense@2")
    r.prepare(corpus, tmp_path, log=lambda *_: None)
    out = r.retrieve([Query("q1", "What is the capital city of France?"), Query("q2", "Which is the tallest mountain on Earth?")])
    assert out["q1"][0].pid == "p2" and out["q2"][0].pid == "p3"
    assert len(out["q1"]) == 2 and out["q1"][0].score >= out["q1"][1].score
    assert out["q1"][0].text == "Paris: Paris is the capital and largest city of France."
    folders = sorted(p.name for p in tmp_path.iterdir())
    # the vectors, and the Lucene index the hits' passages are read from; no temp build folder left behind
    assert folders == [f"bm25-{corpus.corpus_hash}", f"dense-minilm-l6-v2-1-{corpus.corpus_hash}"]
    folders = folders[1:]
    meta = json.loads((tmp_path / folders[0] / "ragledger-complete").read_text())
    assert meta["passages"] == len(PASSAGES) and meta["corpus_hash"] == corpus.corpus_hash
    stamp = (tmp_path / folders[0] / "vectors.npy").stat().st_mtime_ns
    again = parse_retriever("dense@2")
    again.prepare(corpus, tmp_path, log=lambda *_: pytest.fail("index rebuilt"))
    assert (tmp_path / folders[0] / "vectors.npy").stat().st_mtime_ns == stamp


def test_the_onnx_encoder_gives_sentence_transformers_vectors(data_dir, tmp_path, monkeypatch):
    """Every embedding goes through ONNX Runtime with the model's own tokenizer: the same vectors as
    sentence-transformers' (cosine > 0.99999) on real SQuAD paragraphs of very different lengths and on short
    answers, in the order given."""
    import gzip
    import json

    from engines import onnx_encoder

    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path))  # exports the graph afresh
    onnx_encoder._session.cache_clear()
    with gzip.open(data_dir / "squad" / "dev-v1.1.json.gz", "rt") as f:
        paragraphs = [p["context"] for a in json.load(f)["data"][:2] for p in a["paragraphs"]]
    texts = [*paragraphs[:40], "Paris", "a b c", "Denver Broncos", "1,000 km²", "Saint Bernadette Soubirous", ""]
    ours = onnx_encoder.encode(texts)
    theirs = onnx_encoder.sentence_transformer().encode(texts, normalize_embeddings=True)
    assert ours.shape == theirs.shape and (ours * theirs).sum(axis=1).min() > 0.99999
    assert (tmp_path / "models" / f"{onnx_encoder.ONNX_VERSION}.onnx").is_file()
    onnx_encoder._session.cache_clear()


PYSERINI_SEARCH = """
import json, sys
from engines.java import ensure_jvm
ensure_jvm()
from pyserini.search.lucene import LuceneSearcher
index, k1, b, queries = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
searcher = LuceneSearcher(index)
searcher.set_bm25(k1, b)
hits = searcher.batch_search([q for _, q in queries], [i for i, _ in queries], k=4, threads=1)
print(json.dumps({i: [[h.docid, h.score] for h in hits[i]] for i, _ in queries}))
"""


def test_bm25_hits_are_pyserinis_own(corpus, tmp_path):
    """Our declared SimpleSearcher (strategies/retrievers/bm25.py) against pyserini's LuceneSearcher, in a process of its
    own (pyserini.search.lucene imports torch), on the same index, k1 and b: the same passages in the same order
    with the same scores."""
    import os
    import subprocess
    import sys

    from strategies.retrievers.bm25 import BM25_B, BM25_K1

    bm25 = parse_retriever("bm25@4")
    bm25.prepare(corpus, tmp_path, log=lambda *_: None)
    queries = [Query("q1", "What is the capital of France?"), Query("q2", "Who won Super Bowl 50?"),
               Query("q3", "river in Africa")]
    ours = bm25.retrieve(queries)
    env = os.environ | {"OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY") or "unused-placeholder"}  # its import
    done = subprocess.run([sys.executable, "-c", PYSERINI_SEARCH, str(bm25.store.index_dir), str(BM25_K1), str(BM25_B),
                           json.dumps([[q.qid, q.text] for q in queries])], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for q in queries:
        assert [[h.pid, h.score] for h in ours[q.qid]] == theirs[q.qid], q.qid
    assert ours["q1"][0].pid in {"p2", "p5"} and ours["q2"][0].pid == "p1"


def test_hybrid_dedups_bm25_and_dense(corpus, tmp_path):
    h = parse_retriever("hybrid(bm25@3,dense@3)")
    h.prepare(corpus, tmp_path, log=lambda *_: None)
    q = [Query("q1", "What is the capital of France?")]
    bm25, dense = (p.retrieve(q)["q1"] for p in h.parts)
    got = h.retrieve(q)["q1"]
    pids = [x.pid for x in got]
    assert len(pids) == len(set(pids))
    assert pids[: len(bm25)] == [x.pid for x in bm25]  # X's hits first, in X's order
    assert set(pids) == {x.pid for x in bm25} | {x.pid for x in dense}
    assert len(pids) < len(bm25) + len(dense)  # both found Paris and Lyon: duplicates were dropped


def test_rerank_orders_by_cosine_to_the_question(corpus, tmp_path):
    from engines.semantic import embed

    rr = parse_retriever("bm25@rr@3")
    rr.prepare(corpus, tmp_path, log=lambda *_: None)
    q = Query("q1", "Which French city is the capital?")
    candidates = rr.inner.retrieve([q])["q1"]
    got = rr.retrieve([q])["q1"]
    assert len(got) == min(3, len(candidates))
    expected = embed([h.text for h in candidates]) @ embed([q.text])[0]
    order = np.argsort(-expected, kind="stable")[:3]
    assert [h.pid for h in got] == [candidates[i].pid for i in order]
    assert [round(h.score, 4) for h in got] == [round(float(expected[i]), 4) for i in order]
    assert got[0].pid == "p2"


def test_llm_retrievers_refuse_to_run_without_a_model():
    with pytest.raises(ValueError, match="calls the model"):
        parse_retriever("parametric").retrieve([Query("q", "x?")])


# ---- gold(X,position): seed 001's gold-passage setting ---------------------------------------------

class _Fixed(Retriever):
    """A stand-in inner retriever with fixed hits per question."""

    code_version = "fixed-1"

    def __init__(self, hits: dict[str, list[Hit]]):
        super().__init__("fixed")
        self.hits = hits

    def retrieve(self, queries, llm=None):
        return {q.qid: self.hits.get(q.qid, []) for q in queries}


def test_insert_gold_positions():
    from strategies.retrievers.gold import insert_gold

    gold = Hit("g", None, "G", "G: gold")
    hits = _hits("a", "b", "c")
    placed = insert_gold(hits, gold, "random", "q1")
    assert len(placed) == 3 and "g" in [h.pid for h in placed] and "c" not in [h.pid for h in placed]
    assert placed == insert_gold(hits, gold, "random", "q1")  # seeded by the question id
    positions = {[h.pid for h in insert_gold(hits, gold, "random", f"q{i}")].index("g") for i in range(40)}
    assert positions == {0, 1, 2}
    with_gold = [*_hits("a"), Hit("g", 3.0, "G", "G: gold"), *_hits("c")]
    assert insert_gold(with_gold, gold, "random", "q1") == with_gold  # already retrieved: left as it is
    assert [h.pid for h in insert_gold(hits, gold, "first", "q")] == ["g", "a", "b"]
    assert [h.pid for h in insert_gold(hits, gold, "last", "q")] == ["a", "b", "g"]
    moved = insert_gold(with_gold, gold, "last", "q")
    assert [h.pid for h in moved] == ["a", "c", "g"] and moved[-1].score == 3.0  # moved, keeping its score
    assert [h.pid for h in insert_gold([], gold, "random", "q")] == ["g"]


def test_gold_wrapper_parses_and_inserts_from_the_corpus(corpus, tmp_path):
    from strategies.retrievers.gold import GoldInsert

    r = parse_retriever("gold(bm25@2,first)")
    assert isinstance(r, GoldInsert) and r.position == "first" and r.inner.k == 2 and r.needs_corpus
    assert parse_retriever("gold(bm25@2)").position == "random"
    assert "gold-2:last(" in parse_retriever("gold(bm25@2,last)").code_version
    for bad, message in (("gold(bm25@2,middle)", "position must be one of random, first, last"),
                         ("gold(bm25@2,random,3)", "trigger must be one of answer, id"),
                         ("gold(bm25@2,first,id)", "a trigger applies to position random only"),
                         ("gold(bm25@2,random,id,x)", "takes a retriever, an optional position")):
        with pytest.raises(ValueError, match=message):
            parse_retriever(bad)
    g = GoldInsert("gold(fixed,last)", _Fixed({"q": _hits("p1", "p2"), "f": _hits("p1")}), "last")
    g.prepare(corpus, tmp_path)
    out = g.retrieve([Query("q", "x", ("p6",)), Query("f", "feedback query")])
    assert [h.pid for h in out["q"]] == ["p1", "p6"] and out["q"][1].text.startswith("Photosynthesis: Plants")
    assert out["q"][1].score is None and [h.pid for h in out["f"]] == ["p1"]  # no gold ids: unchanged
    with pytest.raises(ValueError, match="gold paragraph 'nope' of question 'q' is not in the corpus"):
        g.retrieve([Query("q", "x", ("nope",))])


GOLD_CORPUS = [
    {"pid": "sb_gold", "title": "Super Bowl 50", "text": "The Denver Broncos defeated the Carolina Panthers 24-10."},
    {"pid": "sb_other", "title": "Super Bowl 50", "text": "Super Bowl 50 was won by the Denver Broncos in Santa Clara."},
    {"pid": "sb_none", "title": "Super Bowl 50", "text": "Super Bowl 50 was an NFL game played in Santa Clara."},
    {"pid": "paris", "title": "Paris", "text": "Paris is the capital of France."},
]


def test_gold_trigger_answer_string_or_gold_id(tmp_path):
    """Seed 001 §4.2 inserts the gold passage when the top-k does not contain the answer (`answer`, the default);
    `id` inserts whenever the gold paragraph id is missing, even when another paragraph holds the answer."""
    from strategies.retrievers.base import reader_text
    from strategies.retrievers.gold import GOLD_VERSION, GoldInsert, gold_missing

    corpus = jsonl_corpus(tmp_path / "gold-corpus", GOLD_CORPUS)
    hits = {p["pid"]: Hit(p["pid"], 1.0, p["title"], reader_text(p["title"], p["text"])) for p in GOLD_CORPUS}
    answer_elsewhere = [hits["sb_other"], hits["paris"]]  # lacks the gold id, holds "Denver Broncos"
    neither = [hits["sb_none"], hits["paris"]]  # lacks both
    q = Query("q1", "Which NFL team won Super Bowl 50?", ("sb_gold",), ("Denver Broncos", "Broncos"))

    # the trigger alone, on the hand-made lists
    assert not gold_missing(answer_elsewhere, "sb_gold", "answer", q.answers)
    assert gold_missing(answer_elsewhere, "sb_gold", "id", q.answers)
    assert gold_missing(neither, "sb_gold", "answer", q.answers) and gold_missing(neither, "sb_gold", "id", q.answers)
    # normalized as Recall@k does (core/answers.py): case, punctuation and articles do not matter
    assert not gold_missing(neither, "sb_gold", "answer", ("santa  CLARA!",))
    # the gold paragraph already there: left as retrieved under both triggers (no duplicate)
    assert not gold_missing([hits["sb_gold"]], "sb_gold", "answer", ("not in it",))

    def run(name: str, lists: list[Hit]) -> list[str]:
        r = parse_retriever(name)
        assert isinstance(r, GoldInsert)
        r.inner = _Fixed({"q1": lists})
        r.prepare(corpus, tmp_path)
        return [h.pid for h in r.retrieve([q])["q1"]]

    # answer present, gold id absent: the paper's trigger inserts nothing, the id trigger inserts
    assert run("gold(bm25@2,random)", answer_elsewhere) == ["sb_other", "paris"]
    assert run("gold(bm25@2)", answer_elsewhere) == ["sb_other", "paris"]
    with_id = run("gold(bm25@2,random,id)", answer_elsewhere)
    assert sorted(with_id) == ["sb_gold", "sb_other"]  # the gold paragraph took the lowest-ranked hit's place
    # neither the answer nor the gold id: both insert, at the same seeded position
    assert run("gold(bm25@2,random)", neither) == run("gold(bm25@2,random,id)", neither)
    assert sorted(run("gold(bm25@2,random)", neither)) == ["sb_gold", "sb_none"]
    # first/last place the gold paragraph whatever the trigger would say
    assert run("gold(bm25@2,last)", answer_elsewhere) == ["sb_other", "sb_gold"]

    # a new trigger, a new code version: gold-1 retrievals (id trigger) are not reused for the answer trigger
    versions = {n: parse_retriever(n).code_version for n in ("gold(bm25@5,random)", "gold(bm25@5,random,id)")}
    assert versions["gold(bm25@5,random)"].startswith(f"{GOLD_VERSION}:random,answer(") and GOLD_VERSION != "gold-1"
    assert versions["gold(bm25@5,random,id)"].startswith(f"{GOLD_VERSION}:random,id(")
    assert parse_retriever("gold(bm25@5)").code_version == versions["gold(bm25@5,random)"]


def test_gold_needs_a_dataset_with_gold_paragraphs():
    from schemas.spec import SpecError, parse_spec

    with pytest.raises(SpecError, match="only the 'squad' dataset knows"):
        parse_spec({"name": "x", "dataset": {"name": "nq-open", "path": "nq.jsonl"}, "retrievers": ["trunc(gold(bm25@5),100)"],
                    "readers": ["concatenation"]})
    parse_spec({"name": "x", "retrievers": ["gold(bm25@5,random)", "bm25@5"], "readers": ["concatenation"]})


def test_only_lexical_retrievers_may_be_retrieved_in_parts():
    """`Retriever.per_query` (flows/head_start.py retrieves a first shard in parts only where it holds): an encoder's
    batch padding moves its scores, so dense, rerank and hybrid retrieval are not; wrappers take their inner one's."""
    from strategies.retrievers import parse_retriever

    per_query = {name: parse_retriever(name).per_query
                 for name in ("bm25@5", "none", "dense@5", "bm25@rr@5", "hybrid(bm25@5,dense@5)", "hybrid(bm25@5,none)",
                              "trunc(bm25@5,100)", "gold(bm25@5,random)", "trunc(dense@5,100)")}
    assert per_query == {"bm25@5": True, "none": True, "dense@5": False, "bm25@rr@5": False,
                         "hybrid(bm25@5,dense@5)": False, "hybrid(bm25@5,none)": True, "trunc(bm25@5,100)": True,
                         "gold(bm25@5,random)": True, "trunc(dense@5,100)": False}


def test_start_engine_reaches_the_bm25_inside_every_wrapper(monkeypatch):
    """Retriever.start_engine (a run's head start starts the JVM with it, flows/head_start.py): hybrid, trunc and gold pass it
    to the retrievers they wrap; one without an engine does nothing."""
    from strategies.retrievers import parse_retriever
    from strategies.retrievers.bm25 import BM25

    started: list[str] = []
    monkeypatch.setattr(BM25, "start_engine", lambda self: started.append(self.name))
    parse_retriever("trunc(gold(hybrid(bm25@3,none),last),50)").start_engine()
    assert started == ["bm25@3"]
    parse_retriever("none").start_engine()
    assert started == ["bm25@3"]
