"""The Python API (ragledger/api.py) against the command line on the same store: the same numbers from
`ragledger query`/`errors`/`flips`/`hardest` and from `ragledger.open_store(...)`; a bad input raises RagledgerError
whose message is the command's `error:` line, and nothing is written. The store is tests/test_analysis_cli.py's (two
cells, four questions, records written through EventStore); a store made by a run is read in tests/test_notebook.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import ragledger
from ragledger.cli import app
from tests.test_analysis_cli import EXP, build_store, cell

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path) -> Path:
    build_store(tmp_path / "store")
    return tmp_path / "store"


def cli(*args) -> tuple[int, str]:
    r = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "300"})
    return r.exit_code, r.output


def cli_json(*args) -> pd.DataFrame:
    code, out = cli(*args, "--format", "json")
    assert code == 0, out
    return pd.DataFrame(json.loads(out[out.index("[{" if "[{" in out else "[]"):].splitlines()[0]))


def error_line(*args) -> str:
    code, out = cli(*args)
    assert code == 2, out
    (line,) = [x for x in out.splitlines() if x.startswith("error: ")]
    return line.removeprefix("error: ")


def test_query_gives_the_commands_rows(root):
    sql = "SELECT cell, count(*) AS n, avg(em) AS em, avg(f1) AS f1 FROM outcomes GROUP BY cell ORDER BY cell"
    api = ragledger.open_store(root).query(sql)
    pd.testing.assert_frame_equal(api, cli_json("query", sql, "--store", root), check_dtype=False)
    assert api["em"].tolist() == [0.5, 0.25]
    table = ragledger.open_store(root).query(sql, arrow=True)
    assert table.num_rows == 2 and table.column("n").to_pylist() == [4, 4]


def test_records_are_the_views_rows_filtered_by_cell_and_question(root):
    store = ragledger.open_store(str(root))
    outcomes = store.outcomes(EXP)
    assert len(outcomes) == 8 and list(outcomes.columns[:3]) == ["event_id", "schema_version", "experiment"]
    via_sql = store.query("SELECT * FROM outcomes ORDER BY cell, qid")
    assert outcomes["event_id"].tolist() == via_sql["event_id"].tolist()
    one = store.outcomes(EXP, cell="bm25@1", qid=["q1", "q3"])  # words naming one cell, as the commands take them
    assert list(zip(one["cell"], one["qid"], one["em"], strict=True)) == [(cell("bm25@1"), "q1", 1.0),
                                                                          (cell("bm25@1"), "q3", 0.0)]
    retrieved = store.retrievals(EXP, cell="bm25@1", qid="q2")  # retrievals are the cell's retriever's
    assert retrieved[["qid", "pid", "rank"]].values.tolist() == [["q2", "pq2", 1]]
    assert store.retrievals(EXP, cell="none").empty
    assert len(store.generations(EXP, cell="none")) == 4 and len(store.votes(qid="q4")) == 2
    assert store.questions(EXP).set_index("qid").at["q3", "answers"].tolist() == ["Mount Everest", "Everest"]
    table = store.outcomes(EXP, cell="none", arrow=True)
    assert table.num_rows == 4 and table.schema.names == list(outcomes.columns)


def test_errors_hardest_and_flips_are_the_commands(root):
    store = ragledger.open_store(root)
    for args, kwargs in (((), {}), (("--cell", "none"), {"cell": "none"}),
                         (("--error-type", "retrieval_failure"), {"error_type": "retrieval_failure"}),
                         (("--include-correct",), {"include_correct": True})):
        expected = cli_json("errors", EXP, "--store", root, *args)
        got = store.errors(EXP, **kwargs)
        pd.testing.assert_frame_equal(got.astype({"gold_in_context": bool}), expected, check_dtype=False)
    pd.testing.assert_frame_equal(store.hardest(EXP), cli_json("hardest", EXP, "--store", root))
    flips = store.flips("bm25@1", "none")
    expected = cli_json("flips", "bm25@1", "none", "--store", root)
    pd.testing.assert_frame_equal(flips.questions, expected)
    code, out = cli("flips", "bm25@1", "none", "--store", root)
    assert code == 0, out
    c = flips.comparison
    assert (flips.experiment, flips.cell_a, flips.cell_b) == (EXP, cell("bm25@1"), cell("none"))
    assert flips.table.loc["A right"].tolist() == [c["both_right"], c["won"]] == [0, 2]
    assert flips.table.loc["A wrong"].tolist() == [c["lost"], c["both_wrong"]] == [1, 1]
    assert f"EM A {100 * c['em_a']:.1f}  EM B {100 * c['em_b']:.1f}  ΔEM {100 * c['diff']:+.1f}" in out
    assert f"exact McNemar p = {c['mcnemar_p']:.4g}" in out


def test_the_analysis_and_the_readers_table_without_a_manifest(root):
    store = ragledger.open_store(root)
    a = store.analysis(EXP)
    mrlr = a.mrlr.set_index("retriever")
    # bm25 fails q2, q3; none answers q2: RWR(bm25 -> none) = 1/2. none fails q1, q3, q4; bm25 answers q1, q4: 2/3
    assert mrlr.at["bm25@1", "MRLR"] == pytest.approx(0.5) and mrlr.at["none", "MRLR"] == pytest.approx(2 / 3)
    assert mrlr.at["bm25@1", "accuracy"] == 0.5 and a.questions == 4 and a.dropped_questions == 0
    shares = a.error_shares.set_index(["cell", "error_type"])["share"]
    assert shares[(cell("none"), "retrieval_failure")] == 0.5 and shares[(cell("none"), "lucky_guess")] == 0.25
    assert set(a.rwr["i"]) == {cell("bm25@1"), cell("none")} and a.identity["holds"].all()
    table = store.readers_table(EXP)  # no run manifest: the table from the outcomes alone
    assert table.set_index("retriever")["em"].to_dict() == {"bm25@1": 50.0, "none": 25.0}
    lineage = store.lineage(EXP, "q3", cell="bm25@1")
    assert lineage.answers == ["Mount Everest", "Everest"] and lineage.outcomes["prediction"].tolist() == ["K2"]
    assert lineage.passages[["pid", "has_gold"]].values.tolist() == [["pq3", True]]
    assert lineage.generations["output"].tolist() == ["Answer: K2"] and lineage.votes["chosen"].tolist() == ["K2"]


def files_of(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_a_bad_input_raises_the_commands_error_line_and_writes_nothing(root, tmp_path):
    store = ragledger.open_store(root)
    cases = [  # (the API's call, the command given the same input)
        (lambda: store.errors("nope"), ("errors", "nope", "--store", root)),
        (lambda: store.outcomes("nope"), ("errors", "nope", "--store", root)),
        (lambda: store.flips("bm25@1", "none", experiment="nope"), ("flips", "bm25@1", "none", "--experiment", "nope",
                                                                     "--store", root)),
        (lambda: store.errors(EXP, cell="dense"), ("errors", EXP, "--store", root, "--cell", "dense")),
        (lambda: store.outcomes(EXP, cell="dense"), ("errors", EXP, "--store", root, "--cell", "dense")),
        (lambda: store.errors(EXP, error_type="bad"), ("errors", EXP, "--store", root, "--error-type", "bad")),
        (lambda: store.flips("bm25@1", "bm25"), ("flips", "bm25@1", "bm25", "--store", root)),
        (lambda: store.lineage(EXP, "q9"), ("trace", EXP, "q9", "--store", root)),
        (lambda: store.query("SELEKT 1"), ("query", "SELEKT 1", "--store", root)),
        (lambda: store.query("COPY outcomes TO 'x.csv'"), ("query", "COPY outcomes TO 'x.csv'", "--store", root)),
        (lambda: ragledger.open_store(tmp_path / "missing"), ("query", "SELECT 1", "--store", tmp_path / "missing")),
        (lambda: ragledger.open_store(tmp_path / "notes"), ("query", "SELECT 1", "--store", tmp_path / "notes")),
    ]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("not a store")
    store.outcomes(EXP)  # a read takes the store's readers' lock, made by the first read (tracking/store/catalog.py)
    before = files_of(root)
    for call, args in cases:
        with pytest.raises(ragledger.RagledgerError) as caught:
            call()
        assert str(caught.value) == error_line(*args), args
    assert files_of(root) == before
    assert not (tmp_path / "missing").exists() and sorted(p.name for p in (tmp_path / "notes").iterdir()) == ["todo.txt"]


def test_an_execution_is_read_from_its_manifests_segments(root):
    store = ragledger.open_store(root)
    with pytest.raises(ragledger.RagledgerError, match="name its experiment too"):
        store.outcomes(execution="latest")
    with pytest.raises(ragledger.RagledgerError, match="has no execution"):
        store.outcomes(EXP, execution="latest")
    assert store.executions(EXP).empty and store.experiments()["experiment"].tolist() == [EXP]


def test_a_store_location_is_a_path_or_a_url(root):
    assert ragledger.open_store(f"file://{root}").root == root
    assert ragledger.open_store(root).root == root
    with pytest.raises(ragledger.RagledgerError, match=r"gs:// stores are not supported"):
        ragledger.open_store("gs://bucket/store")
    # an s3:// URL opens its store through a mirror (tests/test_store_s3.py); one without a bucket is refused first
    with pytest.raises(ragledger.RagledgerError, match=r"^--store s3://: no bucket \(s3://BUCKET/PREFIX\)$"):
        ragledger.open_store("s3://")


def test_importing_ragledger_loads_no_data_stack():
    """`import ragledger` and `ragledger.__version__` stay as cheap as `ragledger --help`: the API's names are
    imported on first use (ragledger/__init__.py)."""
    code = ("import sys, ragledger; ragledger.__version__; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'pyarrow', 'duckdb', 'pandera', 'prefect', "
            "'mlflow', 'numpy'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "[]"
    assert ragledger.__version__ == __import__("core").__version__
    assert {"open_store", "run", "Store", "RunResult", "RagledgerError"} <= set(dir(ragledger))
    with pytest.raises(AttributeError):
        ragledger.no_such_name  # noqa: B018
