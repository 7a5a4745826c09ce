"""Questions across experiments from the command line (ragledger/cli_history.py) over stores written by real runs:
two executions of one experiment (the second with other answers, run after the first was compacted), another
experiment, and `ragledger history`, `leaderboard`, `diff`, `store compact` on them; bad input is one error line."""

from __future__ import annotations

import contextlib
import io
import json

import pandas as pd
import pytest

from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import TOPICS, cli, make_data, reader, write_spec
from tracking.store.catalog import catalog_path


def wrong_on_odd(system: str, prompt: str, body: dict) -> str:
    """The reader's answer, except for the odd questions' topics: a later model got those wrong."""
    answer = reader(system, prompt, body)
    return "unknown" if answer in TOPICS[1::2] else answer


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    ws = tmp_path_factory.mktemp("lab")
    make_data(ws, 8)
    with ScriptedServer(answer=reader) as first:
        assert cli(ws, "run", str(write_spec(ws, first.base_url, name="exp"))).returncode == 0
        assert cli(ws, "run", str(write_spec(ws, first.base_url, name="other"))).returncode == 0
    assert catalog_path(ws / ".ragledger" / "store", "exp").exists()  # the run compacted its experiment
    with ScriptedServer(answer=wrong_on_odd) as second:  # another max_tokens: other calls, a second execution
        proc = cli(ws, "run", str(write_spec(ws, second.base_url, name="exp", max_tokens=40)))
        assert proc.returncode == 0, proc.stderr[-3000:]
    return ws


def executions(ws) -> list[pd.DataFrame]:
    """exp's two executions' outcomes, read from their manifests' segments (pandas, not the CLI's SQL)."""
    from tracking.store.ledger import Ledger

    store = ws / ".ragledger" / "store"
    out = []
    with contextlib.chdir(ws):  # the manifests name segments relative to where the run ran
        for path in Ledger(store).manifests("exp"):
            out.append(Ledger(store).outcomes("exp", json.loads(path.read_text())).set_index(["cell", "qid"])["em"])
    assert len(out) == 2
    return out


def test_a_question_s_history_covers_every_execution_and_experiment(lab):
    proc = cli(lab, "history", "q1", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_json(io.StringIO(proc.stdout))
    assert sorted(rows["experiment"].value_counts().items()) == [("exp", 4), ("other", 2)]  # 2 cells x executions
    assert rows["created_at"].is_monotonic_increasing and set(rows["dataset"]) == {"jsonl"}
    first, second = executions(lab)
    exp = rows[rows["experiment"] == "exp"]
    assert list(exp["em"]) == [first[(c, "q1")] for c in exp["cell"][:2]] + [second[(c, "q1")] for c in exp["cell"][2:]]
    only = cli(lab, "history", "q1", "-e", "oth*", "--format", "json")
    assert set(pd.read_json(io.StringIO(only.stdout))["experiment"]) == {"other"}


def test_the_leaderboard_counts_each_experiment_s_latest_outcomes(lab):
    proc = cli(lab, "leaderboard", "--format", "json", "--top", "0")
    assert proc.returncode == 0, proc.stderr
    board = pd.read_json(io.StringIO(proc.stdout)).set_index(["experiment", "cell"])
    assert len(board) == 4 and set(board["questions"]) == {8}
    _, latest = executions(lab)
    for cell, em in latest.groupby(level="cell").mean().items():
        assert board.loc[("exp", cell), "em"] == pytest.approx(100 * em)  # the second execution's, not both
    assert (board["em_lo"] <= board["em"]).all() and (board["em"] <= board["em_hi"]).all()
    assert list(board["rank"]) == [1, 2, 3, 4] and board["em"].is_monotonic_decreasing


def test_diff_names_what_changed_between_the_two_executions(lab):
    proc = cli(lab, "diff", "exp")
    assert proc.returncode == 0, proc.stderr
    first, second = executions(lab)
    changed = (first >= 1) != (second >= 1)
    assert changed.any()  # the second model got some questions wrong
    flips = pd.read_json(io.StringIO(cli(lab, "diff", "exp", "--format", "json").stdout))
    assert sorted(zip(flips["cell"], flips["qid"], strict=True)) == sorted(changed[changed].index)
    broken = {k for k in changed[changed].index if first[k] >= 1}
    assert {(c, q) for c, q, ch in zip(flips["cell"], flips["qid"], flips["change"], strict=True) if ch == "broken"} == broken
    assert f"{len(broken)}" in proc.stdout


def test_store_compact_then_the_same_answers(lab):
    before = [cli(lab, *args).stdout for args in (("history", "q3"), ("leaderboard",), ("diff", "exp"))]
    proc = cli(lab, "store", "compact")
    assert proc.returncode == 0 and "record files" in proc.stdout, proc.stdout + proc.stderr
    assert [cli(lab, *args).stdout for args in (("history", "q3"), ("leaderboard",), ("diff", "exp"))] == before
    assert cli(lab, "store", "verify").returncode == 0


@pytest.mark.parametrize("args, says", [
    (("history", "nope"), "question 'nope': no outcome in 2 experiment(s)"),
    (("history", "q1", "-e", "zzz*"), "no experiment with outcomes"),
    (("leaderboard", "--store", "missing"), "--store missing: no such directory"),
    (("leaderboard", "--metric", "bleu"), "--metric must be em or f1"),
    (("diff", "other"), "experiment 'other' has 1 execution(s)"),
    (("diff", "exp", "--before", "1999"), "no execution(s) of 'exp' match '1999'"),
    (("store", "compact", "--experiment", "nope"), "--experiment nope: no such experiment"),
])
def test_bad_input_is_one_error_line(lab, args, says):
    proc = cli(lab, *args)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stdout + proc.stderr
    assert says in lines[0], lines[0]
