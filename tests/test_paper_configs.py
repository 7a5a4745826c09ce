"""Every config under configs/papers/ loads and validates as shipped, names its paper table or figure and the
paper's headline in its header, and still validates with the embedded-model overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schemas.overrides import with_overrides
from schemas.spec import SweepSpec, load_spec

PAPERS = Path(__file__).resolve().parents[1] / "configs" / "papers"
CONFIGS = sorted(PAPERS.glob("*.yaml"))


def test_the_paper_configs_are_present():
    """The configs each paper section of docs/papers.md names; configs/papers/README.md (tests/test_paper_index.py)
    indexes every table and figure, with its config or the reason there is none."""
    names = {p.stem for p in CONFIGS}
    assert {"001_table1_gold", "001_table2", "001_fig1_topk", "001_fig5_self_consistency", "001_fig6_gold_position",
            "002_fig_mrlr", "002_table_eor", "003_table2_zero_shot", "003_table4_ablation", "003_fig4_recall",
            "004_table1", "004_table3"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_paper_config_validates_and_names_its_table_and_headline(path: Path):
    spec = load_spec(path)
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    seed = path.stem[:3]
    assert re.search(rf"Seed {seed} \(", header), "the header names the paper"
    # 002's extracted text lost its figure and table numbers: those headers say so
    assert re.search(r"(Table|Figure) \d|(figure|table) \(its number is lost", header), "the header names the table or figure"
    assert "headline" in header, "the header gives the paper's headline number (or says it is not legible)"
    assert f"configs/papers/{path.name}" in header, "the header shows the command that runs it"
    assert spec.model.backend == "openai", "as shipped it runs against a vLLM endpoint"
    small = with_overrides(spec, limit=3, embedded=True, source=str(path))
    experiments = small.expand()
    assert all(e.dataset.limit == 3 and e.model.backend == "embedded" and e.model.concurrency == 1 for e in experiments)
    assert small.model.temperature == spec.model.temperature and small.model.max_tokens == spec.model.max_tokens
    assert isinstance(small, SweepSpec) == isinstance(spec, SweepSpec)


def test_overrides_reject_a_non_positive_limit_by_name():
    from schemas.spec import SpecError

    with pytest.raises(SpecError, match="--limit must be a positive integer"):
        with_overrides(load_spec(CONFIGS[0]), limit=0, source="x.yaml")


def test_seed_004_configs_hold_table1_settings_and_table3_rows():
    from strategies.retrievers import parse_retriever
    from strategies.retrievers.closed_book import ClosedBook

    t1 = load_spec(PAPERS / "004_table1.yaml")
    retrievers = {name: parse_retriever(name) for name in t1.retrievers}
    assert retrievers["bm25@10"].k == 10  # Table 1: "N = 10 most relevant passages are retrieved using BM25"
    assert isinstance(retrievers["none"], ClosedBook)  # "except no retrieval": Listing 5 with N = 0
    assert {"sure", "sure_base"} <= {e.name for e in t1.reader_entries()}
    header1 = (PAPERS / "004_table1.yaml").read_text()
    assert "SuRe 33.5 / 42.3" in header1 and "No retrieval 27.6 / 39.0" in header1  # Table 1, NQ
    t3 = load_spec(PAPERS / "004_table3.yaml")
    assert t3.retrievers == ["bm25@10"]
    # Table 3's rows in its order: Base, Conditional summarizations, + Pair-wise ranking, + Instance-wise validity
    # (SuRe), MCQ prompt, Sum-and-pred (Gen)
    assert [e.name for e in t3.reader_entries()] == ["sure_base", "sure_summaries", "sure_ranking", "sure", "sure_mcq",
                                                     "sure_generic"]
    header3 = (PAPERS / "004_table3.yaml").read_text()
    assert "Conditional summarizations 30.4 / 40.9" in header3 and "+ Pair-wise ranking 30.6 / 41.2" in header3


@pytest.mark.parametrize("name", ["readers.yaml", "retrievers.yaml"])
def test_gpu_configs_are_the_cpu_configs_except_for_size_and_model(name: str):
    """configs/X.yaml is sized for the embedded model on 2 cores; configs/gpu/X.yaml is the same experiment for a
    vLLM server: only the number of questions, the shard size and the model block differ."""
    import yaml

    root = PAPERS.parent
    cpu, gpu = (yaml.safe_load((root / d / name).read_text()) for d in (".", "gpu"))
    load_spec(root / name), load_spec(root / "gpu" / name)  # both validate
    assert cpu["model"]["backend"] == "embedded" and gpu["model"]["backend"] == "openai"
    datasets = [(d["name"], d["path"], d.get("seed")) for d in (cpu["dataset"] if isinstance(cpu["dataset"], list)
                                                                  else [cpu["dataset"]])]
    gpu_datasets = [(d["name"], d["path"], d.get("seed")) for d in (gpu["dataset"] if isinstance(gpu["dataset"], list)
                                                                     else [gpu["dataset"]])]
    assert datasets == gpu_datasets
    for key in ("model", "dataset", "execution"):
        cpu.pop(key), gpu.pop(key)
    assert cpu == gpu


OPEN_DOMAIN = {"nq-open", "triviaqa", "webquestions", "dpr-topics"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_paper_config_names_its_papers_corpus_and_says_what_to_give_when_it_is_absent(path: Path):
    """NQ, TriviaQA and WebQuestions configs retrieve from DPR's Wikipedia, as the papers do; SQuAD ones from the SQuAD
    paragraphs. Where the corpus is absent (here) a run stops before writing anything with one error that says what to
    give and how; the header's embedded command names the SQuAD substitution."""
    from core.datasets import DatasetError
    from flows.launch import preflight

    spec = load_spec(path)
    names = {e.dataset.name for e in spec.expand()}
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    if not names & OPEN_DOMAIN:
        assert spec.corpus.name == "squad-paragraphs"
        return
    assert (spec.corpus.name, spec.corpus.paths) == ("dpr-tsv", ["wikipedia/psgs_w100.tsv.gz"])
    assert re.search(r"--embedded --limit \d+ --corpus squad-paragraphs", header)
    with pytest.raises(DatasetError) as failed:
        preflight(with_overrides(spec, limit=3, embedded=True, source=str(path)))
    message = str(failed.value)
    assert "psgs_w100.tsv.gz: file not found" in message and "--corpus prebuilt:wikipedia-dpr-100w" in message
    assert "--corpus squad-paragraphs" in message and "\n" not in message
    preflight(with_overrides(spec, limit=3, embedded=True, corpus="squad-paragraphs", source=str(path)))


# what each question file is, in the words of ../shared/data/README.md (NQ-open.dev.jsonl is the standard open-domain
# NQ test set; DPR's NQ dev topics are NQ's development set; val.json is a held-out part of WebQuestions' train split)
SPLITS = {
    "squad/dev-v1.1.json.gz": "SQuAD dev",
    "nq-open/NQ-open.dev.jsonl": "NQ test",
    "dpr-topics/topics.dpr.nq.dev.txt.gz": "NQ dev",
    "triviaqa/dev.jsonl.gz": "TriviaQA dev",
    "triviaqa/test.jsonl.gz": "TriviaQA test",
    "webquestions/test.json": "WebQuestions test",
    "webquestions/val.json": "WebQuestions val",
}
_NAMED = re.compile(r"([A-Za-z]+ (?:dev|test|val)) \(([\w./-]+)\)")


def header_statement(header: str, key: str) -> str:
    """The header's `# <key>: ...` statement, with its continuation lines (up to the next `# Word:` line)."""
    out: list[str] = []
    for line in header.splitlines():
        body = line.lstrip("#").strip()
        if out and re.match(r"[A-Z][\w ]*:", body):
            break
        if out or body.startswith(f"{key}:"):
            out.append(body)
    return " ".join(out)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_paper_configs_header_names_its_own_questions_and_corpus(path: Path):
    """The header's `Questions:` line lists exactly the config's question files, each with its split as the data
    README names it; its `Corpus:` line names the config's corpus; neither it nor the description names a split
    the config does not use."""
    spec = load_spec(path)
    datasets = [e.dataset for e in spec.expand()]
    header = "".join(line for line in path.read_text().splitlines(keepends=True) if line.startswith("#"))
    named = dict((p, s) for s, p in _NAMED.findall(header_statement(header, "Questions")))
    assert named == {d.path: SPLITS[d.path] for d in datasets}
    corpus = header_statement(header, "Corpus")
    if spec.corpus.name == "dpr-tsv":
        assert corpus.startswith("Corpus: DPR's Wikipedia (psgs_w100.tsv") and "SQuAD paragraphs (the default" not in corpus
        assert all(p in header for p in spec.corpus.paths)
    else:
        assert spec.corpus.name == "squad-paragraphs" and corpus.startswith("Corpus: the 20,963 SQuAD paragraphs")
        assert "psgs_w100" not in header
    described = header + spec.description
    assert "NQ-open dev" not in described  # the data README calls that file NQ's test set
    for file, split in SPLITS.items():
        if file not in {d.path for d in datasets}:
            assert f"{split} (" not in described, f"{split} is named but {file} is not among the config's datasets"


def test_header_statement_reads_continuation_lines_up_to_the_next_statement():
    header = "# Questions: NQ dev (a/b.gz),\n# TriviaQA test (c.gz)\n# Corpus: x\n# y\n# Run: z\n"
    assert header_statement(header, "Questions") == "Questions: NQ dev (a/b.gz), TriviaQA test (c.gz)"
    assert header_statement(header, "Corpus") == "Corpus: x y"
    assert dict((p, s) for s, p in _NAMED.findall(header_statement(header, "Questions"))) == {
        "a/b.gz": "NQ dev", "c.gz": "TriviaQA test"}
