"""CLI query / errors / flips / hardest / trace and the analysis run, on a small store built by writing
records through EventStore (no model), with a run manifest and an MLflow parent run like the flow's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ragledger.cli import app
from tracking.store.events import EventStore, event_id, new_events

EXP = "tiny"
QUESTIONS = {
    "q1": ("Who won Super Bowl 50?", ["Denver Broncos"]),
    "q2": ("What is the capital of France?", ["Paris"]),
    "q3": ("What is Earth's highest mountain?", ["Mount Everest", "Everest"]),
    "q4": ("Which river flows north in Africa?", ["Nile"]),
}
PASSAGE = {"q1": "The Denver Broncos won Super Bowl 50.", "q2": "Lyon is a city in France.",
           "q3": "Mount Everest is Earth's highest mountain.", "q4": "The Nile flows north."}
# (prediction, em, gold_in_context, error_type) per cell and question
CELLS = {
    "bm25@1": {"q1": ("Denver Broncos", 1, True, "correct"), "q2": ("Lyon", 0, False, "retrieval_failure"),
               "q3": ("K2", 0, True, "hallucination_error"), "q4": ("Nile", 1, True, "correct")},
    "none": {"q1": ("unknown", 0, False, "abstention"), "q2": ("Paris", 1, False, "lucky_guess"),
             "q3": ("Alps", 0, False, "retrieval_failure"), "q4": ("Congo", 0, False, "retrieval_failure")},
}


def cell(r):
    return f"{r} · concatenation · m"


def build_store(root):
    store = EventStore(root)
    q = [{"event_id": event_id("questions", EXP, k), "cell": "", "qid": k, "dataset": "jsonl", "question": v[0],
          "answers": v[1], "gold_pids": []} for k, v in QUESTIONS.items()]
    segs = {"questions": [str(store.write("questions", new_events("questions", EXP, q)))]}
    ret = [{"event_id": event_id("retrievals", EXP, k), "cell": "", "qid": k, "retriever": "bm25@1", "rank": 1, "pid": f"p{k}",
            "score": 1.5, "title": "T", "text": t, "text_hash": "h" * 16} for k, t in PASSAGE.items()]
    gens, votes, outs = [], [], []
    for r, answers in CELLS.items():
        for k, (pred, em, gic, et) in answers.items():
            common = {"cell": cell(r), "qid": k, "retriever": r, "reader": "concatenation"}
            gens.append({**common, "event_id": event_id("generations", EXP, r, k), "round": 1, "role": "answer",
                         "call_index": 0, "sample_index": 0, "call_id": "c" * 16, "prompt_version": "v1", "prompt_hash": "p" * 16,
                         "system_prompt": "say unknown if unsure", "prompt": f"Context: {PASSAGE[k] if r != 'none' else ''}\n"
                         f"Question: {QUESTIONS[k][0]}\nAnswer:", "passage_ids": [f"p{k}"] if r != "none" else [],
                         "output": f"Answer: {pred}", "parsed_answer": pred, "parse_status": "ok", "logprob": None,
                         "tokens_in": 20, "tokens_out": 3, "latency_ms": 5.0, "model": "m", "from_cache": False, "retries": 0})
            votes.append({**common, "event_id": event_id("votes", EXP, r, k), "method": "single", "candidates": [pred],
                          "scores": [1.0], "chosen": pred})
            outs.append({**common, "event_id": event_id("outcomes", EXP, r, k), "model": "m", "prediction": pred,
                         "em": float(em), "f1": float(em), "semantic_match": None, "is_unknown": pred == "unknown",
                         "gold_in_context": gic, "pool_has_correct": None, "error_type": et, "tokens_in": 20, "tokens_out": 3,
                         "llm_calls": 1})
    for kind, rows in (("retrievals", ret), ("generations", gens), ("votes", votes), ("outcomes", outs)):
        segs[kind] = [str(store.write(kind, new_events(kind, EXP, rows)))]
    return segs


@pytest.fixture
def store(tmp_path):
    segs = build_store(tmp_path / "store")
    return tmp_path / "store", segs


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result


def test_query_formats(store, tmp_path):
    root, _ = store
    r = cli("query", "SELECT cell, avg(em) AS em FROM outcomes GROUP BY cell ORDER BY cell", "--store", root, "--format", "csv")
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["cell,em", "bm25@1 · concatenation · m,0.5", "none · concatenation · m,0.25"]
    r = cli("query", "SELECT qid FROM outcomes WHERE error_type = 'lucky_guess'", "--store", root, "--format", "json")
    assert json.loads(r.output) == [{"qid": "q2"}]
    out = tmp_path / "o.parquet"
    r = cli("query", "SELECT * FROM outcomes", "--store", root, "--format", "parquet", "--output", out)
    assert r.exit_code == 0 and len(pd.read_parquet(out)) == 8
    r = cli("query", "SELECT count(*) AS n FROM outcomes", "--store", root)
    assert r.exit_code == 0 and "8" in r.output
    r = cli("query", "SELEKT 1", "--store", root)
    assert r.exit_code == 2 and "SQL" in r.output
    r = cli("query", "SELECT 1", "--store", root, "--format", "parquet")
    assert r.exit_code == 2 and "--output" in r.output


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "parquet"])
def test_an_output_that_cannot_be_written_is_one_error_line_before_any_work(store, tmp_path, fmt):
    """--output in a folder that does not exist, or naming a folder: one error line naming it, exit 2, asked before
    the store is read (an unknown experiment is not even looked up) and with nothing created."""
    root, _ = store
    target = tmp_path / "nodir" / f"x.{fmt}"
    missing = f"error: --output: cannot create {target}: folder {target.parent} does not exist"
    r = cli("query", "SELECT cell FROM outcomes", "--store", root, "--format", fmt, "-o", target)
    assert r.exit_code == 2 and one_error_line(r.output) == missing
    assert not target.parent.exists()
    r = cli("errors", "nope", "--store", root, "--format", fmt, "--output", tmp_path)
    assert r.exit_code == 2 and one_error_line(r.output) == f"error: --output: {tmp_path} is a directory, not a file"
    r = cli("leaderboard", "--store", root, "--format", fmt, "-o", target)
    assert r.exit_code == 2 and one_error_line(r.output) == missing


def test_errors_filters(store):
    root, _ = store
    r = cli("errors", EXP, "--store", root, "--format", "json")
    rows = json.loads(r.output)
    assert {(x["qid"], x["error_type"]) for x in rows if x["cell"] == cell("none")} == \
        {("q1", "abstention"), ("q2", "lucky_guess"), ("q3", "retrieval_failure"), ("q4", "retrieval_failure")}
    assert all(x["error_type"] != "correct" for x in rows)
    r = cli("errors", EXP, "--store", root, "--cell", "bm25@1", "--error-type", "hallucination_error", "--format", "json")
    rows = json.loads(r.output)
    assert [(x["qid"], x["prediction"], x["gold"]) for x in rows] == [("q3", "K2", "Mount Everest | Everest")]
    assert cli("errors", EXP, "--store", root, "--error-type", "bad").exit_code == 2
    r = cli("errors", EXP, "--store", root, "--cell", "dense")
    assert r.exit_code == 2 and "no cell matches" in r.output
    r = cli("errors", "nope", "--store", root)
    assert r.exit_code == 2 and "no outcome records" in r.output


def test_flips_and_hardest(store):
    root, _ = store
    r = cli("flips", "bm25@1", "none", "--store", root, "--format", "json")
    assert r.exit_code == 0, r.output
    # bm25 right & none wrong: q1, q4; none right & bm25 wrong: q2; both wrong: q3
    assert "A right │          0 │ 2 (A won)" in r.output and "1 (A lost)" in r.output
    assert "exact McNemar p = 1" in r.output  # 2 vs 1 discordant pairs
    flips = json.loads(r.output[r.output.index("[{"):].splitlines()[0])
    assert [(f["qid"], f["winner"]) for f in flips] == [("q1", "A"), ("q4", "A"), ("q2", "B")]
    r = cli("flips", "concatenation", "none", "--store", root)  # words naming both cells: said, not 'no experiment'
    assert r.exit_code == 2 and f"(in {EXP}: 'concatenation' matches 2 cells: " in " ".join(r.output.split())
    r = cli("hardest", EXP, "--store", root, "--format", "json")
    assert [(x["qid"], x["error_types"]) for x in json.loads(r.output)] == \
        [("q3", "hallucination_error×1, retrieval_failure×1")]


def test_trace_shows_lineage(store):
    root, _ = store
    r = CliRunner().invoke(app, ["trace", EXP, "q3", "--store", str(root)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    out = r.output
    for needed in ("What is Earth's highest mountain?", "Mount Everest | Everest", "passage 1", "(gold answer)",
                   "role answer", "prompt:", "raw output: Answer: K2", "vote single", "hallucination_error",
                   "retrieval_failure", "no passages (closed book)", "say unknown if unsure"):
        assert needed in out, needed
    assert out.index(cell("bm25@1")) < out.index(cell("none"))
    r = cli("trace", EXP, "q9", "--store", root)
    assert r.exit_code == 2 and "no question with id 'q9'" in r.output
    r = cli("trace", EXP, "q3", "--store", root, "--cell", "[dense]")  # one error line, the brackets shown as typed
    assert r.exit_code == 2 and "error: no cell matches '[dense]'" in r.output


def test_analysis_writes_tables_plots_report_to_the_parent_run(store, tmp_path):
    root, segs = store
    from flows.analyze import run_analysis
    from tracking.mlflow.log import MlflowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MlflowLogger(uri, EXP)
    parent = logger.start_run(EXP, {"ragledger.level": "experiment"})
    logger.end(parent)
    manifest = root / "runs" / EXP / "20260101T000000-abcdef12.json"
    manifest.parent.mkdir(parents=True)
    cells = {cell(r): {k: v for k, v in segs.items()} for r in CELLS}
    manifest.write_text(json.dumps({"summary": {"mlflow_parent_run_id": parent, "tracking_uri": uri}, "segments": cells,
                                    "spec": {"name": EXP, "tracking": {}}}))
    res = run_analysis(root, EXP, eor=False)
    t = res.inconsistency.set_index("cell")
    assert t.loc[cell("bm25@1"), "accuracy"] == 0.5 and t.loc[cell("none"), "accuracy"] == 0.25
    # RWR(bm25 -> none) = 1/2 (q2 of {q2, q3}); RWR(none -> bm25) = 2/3 (q1, q4 of {q1, q3, q4})
    (group,) = res.groups  # one reader, one model: one inconsistency table
    assert group.label == "reader concatenation · model m"
    assert group.rwr.loc[cell("bm25@1"), cell("none")] == 0.5
    assert group.rwr.loc[cell("none"), cell("bm25@1")] == pytest.approx(2 / 3)
    assert res.identity["holds"].all()
    names = {f.name for f in res.files}
    assert {"inconsistency.parquet", "rwr.parquet", "per_error_rwr.parquet", "error_shares.parquet", "paired.parquet",
            "rwr_heatmap.png", "error_shares.png", "report.html"} <= names
    html = (root / "analysis" / EXP / "report.html").read_text()
    assert "data:image/png;base64," in html and "What is Earth" in html and "holds" in html
    # the drill-down's chain (its rendering is checked in Chromium by tests/test_report_browser.py)
    assert '<details class="q" id="q-q3"' in html and '<mark class="gold">Mount Everest</mark>' in html
    assert '<pre class="raw">Answer: K2</pre>' in html and "vote <b>single</b>" in html
    script = f"""
import json
from mlflow import MlflowClient
c = MlflowClient({uri!r})
print(json.dumps({{"arts": [a.path for a in c.list_artifacts({parent!r}, "analysis")],
                  "metrics": c.get_run({parent!r}).data.metrics}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"analysis/report.html", "analysis/rwr_heatmap.png", "analysis/inconsistency.parquet"} <= set(got["arts"])
    assert got["metrics"]["analysis.identity_max_abs_residual"] == 0.0
    assert got["metrics"]["analysis.questions"] == 4


def test_analyze_command_runs_the_flow_and_prints_tables(store, prefect_harness):
    root, _ = store
    r = CliRunner().invoke(app, ["analyze", EXP, "--store", str(root), "--no-eor", "--no-mlflow"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    out = r.output
    assert "tiny — 4 questions" in out and "MRLR" in out and "accuracy; em" in out and "error shares" in out
    assert "identity P(fail) = P(RE) − P(LG) + P(EE) + P(HE): holds" in out
    assert (root / "analysis" / EXP / "report.html").exists()
    r = CliRunner().invoke(app, ["analyze", "missing", "--store", str(root), "--no-mlflow"])
    assert r.exit_code == 2 and "no outcome records" in r.output
    kept = root.parent / "afile.txt"  # --out naming a file: one line before anything is computed or written
    kept.write_text("keep")
    (root / "analysis" / EXP / "report.html").unlink()
    r = CliRunner().invoke(app, ["analyze", EXP, "--store", str(root), "--out", str(kept), "--no-eor", "--no-mlflow"])
    assert r.exit_code == 2 and one_error_line(r.output) == f"error: --out: {kept} is a file, not a directory"
    assert kept.read_text() == "keep" and not (root / "analysis" / EXP / "report.html").exists()


def test_resolve_cell_by_words():
    from core.cell import resolve_cell

    cells = ["bm25@5 · concatenation · m", "bm25@5 · post_fusion · m", "none · post_fusion · m"]
    assert resolve_cell("bm25@5 · post_fusion · m", cells) == cells[1]
    assert resolve_cell("bm25@5 post_fusion", cells) == cells[1]
    assert resolve_cell("concatenation", cells) == cells[0]
    with pytest.raises(ValueError, match="matches 2 cells"):
        resolve_cell("post_fusion", cells)
    with pytest.raises(ValueError, match="no cell matches"):
        resolve_cell("dense@5", cells)


def test_query_can_be_limited_to_one_experiment(store):
    root, _ = store
    other = [{"event_id": event_id("questions", "other", "x"), "cell": "", "qid": "x1", "dataset": "jsonl", "question": "Q?",
              "answers": ["A"], "gold_pids": []}]
    EventStore(root).write("questions", new_events("questions", "other", other))
    r = cli("query", "SELECT count(*) AS n FROM questions", "--store", root, "--format", "csv")
    assert r.output.splitlines()[1] == "5"
    r = cli("query", "SELECT count(*) AS n FROM questions", "--store", root, "--format", "csv", "--experiment", "other")
    assert r.output.splitlines()[1] == "1"
    r = cli("query", "SELECT * FROM outcomes", "--store", root, "--experiment", "othr")  # no such experiment
    assert r.exit_code == 2
    assert one_error_line(r.output) == f"error: experiment 'othr': no outcome records under {root / 'outcomes' / 'othr'}"


def build_outcome_store(root, experiment, correct: dict[tuple[str, str], list[int]]) -> None:
    """Outcome records only (plus the questions), EM per question q1..qN for each (retriever, reader)."""
    store = EventStore(root)
    n = len(next(iter(correct.values())))
    q = [{"event_id": event_id("questions", experiment, f"q{k}"), "cell": "", "qid": f"q{k}", "dataset": "jsonl",
          "question": f"Question {k}?", "answers": [f"gold {k}"], "gold_pids": []} for k in range(1, n + 1)]
    store.write("questions", new_events("questions", experiment, q))
    outs = []
    for (retriever, reader), ems in correct.items():
        for k, em in enumerate(ems, start=1):
            pred = f"gold {k}" if em else "wrong"
            outs.append({"event_id": event_id("outcomes", experiment, retriever, reader, k),
                         "cell": f"{retriever} · {reader} · m", "qid": f"q{k}", "retriever": retriever,
                         "reader": reader, "model": "m", "prediction": pred,
                         "em": float(em), "f1": float(em), "semantic_match": None, "is_unknown": False,
                         "gold_in_context": True, "pool_has_correct": None,
                         "error_type": "correct" if em else "extraction_error", "tokens_in": 20, "tokens_out": 3,
                         "llm_calls": 1})
    store.write("outcomes", new_events("outcomes", experiment, outs))


def _mrlr_column(out: str, heading: str) -> dict[str, str]:
    """retriever → MRLR % cell of the table printed after `heading` (up to the next blank line)."""
    block = out[out.index(heading):].split("\n\n")[0]
    rows = {}
    for line in block.splitlines():
        parts = [p.strip() for p in line.split("│")]
        if len(parts) == 10 and parts[1] not in ("", "retriever"):
            rows[parts[1]] = parts[5]
    return rows


def test_analyze_prints_one_mrlr_table_per_reader(tmp_path, prefect_harness):
    """2 readers × 3 retrievers: one MRLR table per reader, each with the values of
    tests/test_analysis.py::test_inconsistency_is_computed_per_reader_and_model_group (hand-computed there)."""
    from tests.test_analysis import TWO_READERS

    root = tmp_path / "store"
    build_outcome_store(root, "two", TWO_READERS)
    r = CliRunner().invoke(app, ["analyze", "two", "--store", str(root), "--no-eor", "--no-mlflow"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    out = r.output
    assert out.count("MRLR table, ") == 2
    h1, h2 = "MRLR table, reader r1 · model m: 3 retrievers", "MRLR table, reader r2 · model m: 3 retrievers"
    assert out.index(h1) < out.index(h2)
    assert f"{h1}, mean MRLR 22.2 %" in out and f"{h2}, mean MRLR 44.4 %" in out  # (0+1/3+1/3)/3, (1/3+1/2+1/2)/3
    assert _mrlr_column(out, h1) == {"a": "0.0", "b": "33.3", "c": "33.3"}
    assert _mrlr_column(out, h2) == {"a": "33.3", "b": "50.0", "c": "50.0"}
    base = root / "analysis" / "two"
    rwr = pd.read_parquet(base / "rwr.parquet")
    assert set(rwr["reader"]) == {"r1", "r2"} and len(rwr) == 18  # two 3×3 matrices, no cross-reader pair
    assert pd.read_parquet(base / "inconsistency.parquet")["reader"].tolist() == ["r1"] * 3 + ["r2"] * 3
    html = (base / "report.html").read_text()
    assert html.count('<table class="inconsistency"') == 2 and "reader r2 · model m: 3 retrievers" in html

    # reader r2 with a single retriever: said so, no table for it
    build_outcome_store(root, "lone", {k: v for k, v in TWO_READERS.items() if k[1] == "r1" or k[0] == "a"})
    r = CliRunner().invoke(app, ["analyze", "lone", "--store", str(root), "--no-eor", "--no-mlflow"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    assert r.output.count("MRLR table, ") == 1 and "MRLR table, reader r1 · model m" in r.output
    assert "reader r2 · model m: one retriever only (a: acc 40.0 %" in r.output
    assert "no inconsistency table" in r.output


def test_a_cell_has_one_em_ci_in_the_readers_table_the_cli_and_the_report(tmp_path, prefect_harness):
    """The EM 95% CI of a cell is the same in the readers table `ragledger run` prints, in `ragledger analyze`'s
    table and in report.html: all three come from tracking.analysis.metrics.bootstrap_ci, whatever order each reads the
    questions in (the analysis sorts them by qid: q1, q10, q11, ...)."""
    from tracking.analysis.metrics import cell_metrics
    from tracking.analysis.readers_table import readers_table
    from tracking.report.readers_table import display_rows

    rng = np.random.default_rng(4)  # cell a: EM 50.0 [35.0, 65.0]; resampling indices in qid order gave [35.0, 67.5]
    ems = {(r, "concatenation"): [int(x) for x in rng.random(40) < p] for r, p in (("a", 0.55), ("b", 0.3))}
    root = tmp_path / "store"
    build_outcome_store(root, "ci", ems)
    outcomes = EventStore(root).read("outcomes", "ci")
    name = "a · concatenation · m"
    metrics = cell_metrics(outcomes[outcomes["cell"] == name])
    (row,) = display_rows(readers_table({name: metrics}))
    table_ci = row[3]  # retriever, reader, EM, EM 95% CI, ...
    assert table_ci == "[35.0, 65.0]"
    r = CliRunner().invoke(app, ["analyze", "ci", "--store", str(root), "--no-eor", "--no-mlflow"], env={"COLUMNS": "220"})
    assert r.exit_code == 0, r.output
    cli_row = next(line for line in r.output.splitlines() if line.strip("│ ").startswith("a "))
    assert table_ci in cli_row, (table_ci, cli_row)
    html = (root / "analysis" / "ci" / "report.html").read_text()
    assert f'<tr title="{name}"><td class=l>a</td><td>{row[2]}</td><td>{table_ci}</td>' in html


def test_the_cli_module_imports_no_data_stack():
    """`ragledger --help` stays instant: the commands import pandas, pyarrow, DuckDB and the store when they run."""
    code = "import sys, ragledger.cli; print(sorted(m for m in ('pandas', 'pyarrow', 'duckdb', 'pandera') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_across_sorts_cells_by_the_first_experiments_accuracy(tmp_path):
    """Seed 002's corpus-level figure: each cell's accuracy in each experiment, sorted by the first. Hand-computed:
    in "nq" a is right on 3 of 4 questions (75 %), b on 1 (25 %), c on 2 (50 %); in "webq" a 0 %, b 100 %, c 50 %, and
    "webq" has a cell d (25 %) that "nq" lacks, listed last."""
    root = tmp_path / "store"
    build_outcome_store(root, "nq", {("a", "r"): [1, 1, 1, 0], ("b", "r"): [0, 0, 1, 0], ("c", "r"): [1, 0, 1, 0]})
    build_outcome_store(root, "webq", {("a", "r"): [0, 0, 0, 0], ("b", "r"): [1, 1, 1, 1], ("c", "r"): [0, 1, 0, 1],
                                       ("d", "r"): [0, 0, 0, 1]})
    png = tmp_path / "curve.png"
    r = CliRunner().invoke(app, ["across", "nq", "webq", "--store", str(root), "--plot", str(png), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(x["cell"], x["nq"], x["webq"]) for x in rows] == [
        ("a · r · m", 75.0, 0.0), ("c · r · m", 50.0, 50.0), ("b · r · m", 25.0, 100.0), ("d · r · m", None, 25.0)]
    assert rows[0]["questions:nq"] == 4 and rows[3]["questions:nq"] is None
    assert png.read_bytes().startswith(b"\x89PNG")
    # bad input: one error line naming what is wrong, and no figure written
    missing = CliRunner().invoke(app, ["across", "nq", "nope", "--store", str(root), "--plot", str(tmp_path / "x.png")])
    assert missing.exit_code != 0 and "error:" in missing.output and "'nope'" in missing.output
    assert not (tmp_path / "x.png").exists()
    bad_dir = CliRunner().invoke(app, ["across", "nq", "--store", str(root), "--plot", str(tmp_path / "no" / "x.png")])
    assert bad_dir.exit_code != 0 and "no such directory" in bad_dir.output


def test_analyze_across_puts_the_corpus_level_figure_in_the_report(tmp_path, prefect_harness):
    """`ragledger analyze nq --across webq`: the analysis of nq also writes seed 002's corpus-level figure over both
    experiments (nq first), as a table, a PNG and a plot of report.html."""
    root = tmp_path / "store"
    build_outcome_store(root, "nq", {("a", "r"): [1, 1, 1, 0], ("b", "r"): [0, 0, 1, 0]})
    build_outcome_store(root, "webq", {("a", "r"): [0, 0, 0, 0], ("b", "r"): [1, 1, 1, 1]})
    r = CliRunner().invoke(app, ["analyze", "nq", "--store", str(root), "--no-eor", "--no-mlflow", "--across", "webq"])
    assert r.exit_code == 0, r.output
    base = root / "analysis" / "nq"
    table = pd.read_parquet(base / "accuracy_across.parquet")
    assert table[["cell", "nq", "webq"]].values.tolist() == [["a · r · m", 75.0, 0.0], ["b · r · m", 25.0, 100.0]]
    assert (base / "accuracy_across.png").read_bytes().startswith(b"\x89PNG")
    assert "accuracy_across.png" in (base / "report.html").read_text()
    bad = CliRunner().invoke(app, ["analyze", "nq", "--store", str(root), "--no-eor", "--no-mlflow", "--across", "nope"])
    assert bad.exit_code != 0 and "'nope'" in bad.output
