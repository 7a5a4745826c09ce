import gzip
import json

import pytest

from core.datasets import DatasetError, check_questions, iter_corpus, load_questions, load_sample, sample_questions


@pytest.mark.parametrize(
    ("name", "path", "count"),
    [
        ("squad", "squad/dev-v1.1.json.gz", 10570),
        ("squad", "squad/train-v1.0.json.gz", 87636),
        ("nq-open", "nq-open/NQ-open.dev.jsonl", 3610),
        ("nq-open", "nq-open/NQ-open.efficientqa.dev.1.1.jsonl", 1800),
        ("triviaqa", "triviaqa/dev.jsonl.gz", 8837),
        ("triviaqa", "triviaqa/test.jsonl.gz", 11313),
        ("webquestions", "webquestions/test.json", 2032),
        ("webquestions", "webquestions/val.json", 755),
        ("dpr-topics", "dpr-topics/topics.dpr.nq.test.txt.gz", 3610),
        ("dpr-topics", "dpr-topics/topics.dpr.trivia.test.txt.gz", 11313),
        ("dpr-topics", "dpr-topics/topics.dpr.squad.test.txt.gz", 10570),
        ("dpr-topics", "dpr-topics/topics.dpr.wq.test.txt.gz", 2032),
    ],
)
def test_real_files_load_completely_with_unique_ids(data_dir, name, path, count):
    qs = load_questions(name, path)
    assert len(qs) == count
    assert len({q.qid for q in qs}) == count
    assert all(q.question and q.answers for q in qs)


def test_squad_knows_gold_paragraph_and_corpus_has_it(data_dir):
    qs = load_questions("squad", "squad/dev-v1.1.json.gz")
    pids = {pid for _, pid, _, _ in iter_corpus("squad-paragraphs", ["squad/dev-v1.1.json.gz", "squad/train-v1.0.json.gz"])}
    assert len(pids) == 20963
    assert all(q.gold_pids and q.gold_pids[0] in pids for q in qs[:500])


def test_sampling_is_seeded_and_stable(data_dir):
    qs = load_questions("squad", "squad/dev-v1.1.json.gz")
    a = [q.qid for q in sample_questions(qs, 20, seed=1)]
    assert a == [q.qid for q in sample_questions(list(reversed(qs)), 20, seed=1)]
    assert a != [q.qid for q in sample_questions(qs, 20, seed=2)]


def test_a_sample_is_the_seeded_sample_of_the_loaded_file_and_the_callers_own(data_dir):
    a = load_sample("squad", "squad/dev-v1.1.json.gz", 20, 1)
    assert [q.qid for q in a] == [q.qid for q in sample_questions(load_questions("squad", "squad/dev-v1.1.json.gz"), 20, 1)]
    a[0].qid = "changed"
    assert load_sample("squad", "squad/dev-v1.1.json.gz", 20, 1)[0].qid != "changed"


def test_checking_a_dataset_raises_what_loading_it_raises(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q?", "answers": []}\n')
    with pytest.raises(DatasetError, match="row 1: field 'answers' has no answers"):
        check_questions("nq-open", str(bad))
    with pytest.raises(DatasetError, match="file not found"):
        check_questions("nq-open", str(tmp_path / "missing.jsonl"))


def write_jsonl(path, rows, raw_lines=()):
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
        for line in raw_lines:
            fh.write(line + "\n")


@pytest.mark.parametrize(
    ("rows", "raw", "needle"),
    [
        ([{"question": "q?", "answers": []}], (), "row 1: field 'answers' has no answers"),
        ([{"question": "", "answers": ["a"]}], (), "row 1: field 'question' is empty"),
        ([{"question": "q?", "answers": ["a"]}], ("{not json",), "row 2: malformed JSON"),
        ([{"id": "x", "question": "q?", "answers": ["a"]}, {"id": "x", "question": "r?", "answers": ["b"]}], (),
         "row 2: field 'id': duplicate id 'x'"),
        ([{"question": "q?", "answers": [1, 2]}], (), "row 1: field 'answers' must be a list of strings"),
    ],
)
def test_malformed_user_jsonl(tmp_path, rows, raw, needle):
    p = tmp_path / "mine.jsonl"
    write_jsonl(p, rows, raw)
    with pytest.raises(DatasetError) as exc:
        load_questions("jsonl", str(p))
    assert str(p) in str(exc.value) and needle in str(exc.value)


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(DatasetError, match="file not found"):
        load_questions("jsonl", str(tmp_path / "nope.jsonl"))
    p = tmp_path / "latin1.jsonl.gz"
    with gzip.open(p, "wb") as fh:
        fh.write('{"question": "caf\xe9?", "answers": ["x"]}\n'.encode("latin-1"))
    with pytest.raises(DatasetError, match="not valid UTF-8"):
        load_questions("jsonl", str(p))


def test_squad_without_data_field(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"version": "1.1"}))
    with pytest.raises(DatasetError, match="field 'data' missing"):
        load_questions("squad", str(p))


def test_user_corpus_jsonl(tmp_path):
    p = tmp_path / "c.jsonl"
    write_jsonl(p, [{"id": 1, "title": "T", "text": "hello"}, {"id": "2", "text": "world"}])
    rows = list(iter_corpus("jsonl", [str(p)]))
    assert [(pid, title) for _, pid, title, _ in rows] == [("1", "T"), ("2", "")]
    write_jsonl(p, [{"id": 1, "text": ""}])
    with pytest.raises(DatasetError, match="row 1: field 'text' is empty"):
        list(iter_corpus("jsonl", [str(p)]))


def test_a_parsed_dataset_is_kept_for_the_next_process_until_its_file_changes(tmp_path, monkeypatch):
    """core/datasets.py keeps a file's parsed questions in the cache home, named by the file's identity: another
    process (here: this one with its in-process copies dropped) reads them without parsing; a changed file is parsed."""
    import os

    import core.datasets as datasets

    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    p = tmp_path / "mine.jsonl"
    write_jsonl(p, [{"id": "a", "question": "q?", "answers": ["x"]}, {"id": "b", "question": "r?", "answers": ["y"]}])
    parses: list[str] = []
    real = datasets._parse_questions
    monkeypatch.setattr(datasets, "_parse_questions", lambda name, path: parses.append(name) or real(name, path))
    first = load_questions("jsonl", str(p))
    monkeypatch.setattr(datasets, "_loaded", {})  # a new process
    again = load_questions("jsonl", str(p))
    assert parses == ["jsonl"] and again == first and [q.qid for q in again] == ["a", "b"]

    write_jsonl(p, [{"id": "c", "question": "s?", "answers": ["z"]}])
    os.utime(p, ns=(1, 1))
    monkeypatch.setattr(datasets, "_loaded", {})
    assert [q.qid for q in load_questions("jsonl", str(p))] == ["c"] and parses == ["jsonl", "jsonl"]
