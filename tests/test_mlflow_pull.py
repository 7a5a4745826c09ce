"""MLflow as the system of record (tracking/mlflow/pull.py, ragledger/cli_share.py): an experiment run on store A is
rebuilt from its MLflow runs into an empty store B (every record checked on the way in), a rerun on B makes no model
call, a second pull downloads nothing, an interrupted pull resumes, a damaged or missing artifact is one error
naming it with nothing half-written kept, and records of two schema versions are never mixed. The parent run
carries provenance; each cell run its per-example outcome table and the questions as its dataset input."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli, make_data, reader, write_spec
from tracking.mlflow.pull import PullError, ensure_local, pull
from tracking.store.events import EventStore
from tracking.store.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = "share"
KEY = ["cell", "qid", "prediction", "em", "f1", "error_type"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One experiment (6 questions, bm25@2 x concatenation/post_fusion) run on store A against a scripted server that
    stays up for the module (the call cache keys name its URL), logged to an embedded MLflow."""
    ws = tmp_path_factory.mktemp("share")
    make_data(ws, 6)
    uri = f"sqlite:///{ws / '.ragledger' / 'mlflow.db'}"
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(ws, model.base_url, name=EXPERIMENT)
        proc = cli(ws, "run", str(spec), "--store", str(ws / "A"), "--json", str(ws / "a.json"),
                   env={"MLFLOW_TRACKING_URI": uri})
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield {"ws": ws, "uri": uri, "spec": spec, "model": model, "summary": json.loads((ws / "a.json").read_text())}


def outcomes(store: Path) -> pd.DataFrame:
    df = Ledger(store).outcomes(EXPERIMENT, Ledger(store).latest_execution(EXPERIMENT))
    return df[KEY].sort_values(["cell", "qid"]).reset_index(drop=True)


def share_app() -> typer.Typer:
    from ragledger.cli_share import register

    app = typer.Typer()
    register(app)
    return app


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


def test_pull_rebuilds_the_store_and_a_second_pull_downloads_nothing(shared, tmp_path):
    b = tmp_path / "B"
    r = pull(EXPERIMENT, b, shared["uri"])
    assert len(r.pulled) == 1 and r.downloaded > 0 and r.calls_added > 0
    pd.testing.assert_frame_equal(outcomes(b), outcomes(shared["ws"] / "A"))
    checked, problems = EventStore(b).verify()
    assert checked > 0 and not problems, problems
    for kind in ("questions", "retrievals", "generations", "votes", "outcomes"):  # every record kind, same events
        assert (set(EventStore(b).read(kind, EXPERIMENT)["event_id"])
                == set(EventStore(shared["ws"] / "A").read(kind, EXPERIMENT)["event_id"])), kind
    execution = Ledger(b).latest_execution(EXPERIMENT)
    a_summary = shared["summary"]
    assert Path(execution["manifest_path"]).name == Path(a_summary["manifest"]).name  # the same execution
    assert execution["summary"]["mlflow_parent_run_id"] == a_summary["mlflow_parent_run_id"]  # analyses log there
    assert execution["summary"]["mlflow_cell_run_ids"] == a_summary["mlflow_cell_run_ids"]
    assert execution["spec"]["name"] == EXPERIMENT
    assert all(Path(p).is_file() for segs in execution["segments"].values() for files in segs.values() for p in files)
    assert not (b / ".pull" / EXPERIMENT).exists()  # nothing staged is left

    again = CliRunner().invoke(share_app(), ["pull", EXPERIMENT, "--mlflow-uri", shared["uri"], "--store", str(b)])
    assert again.exit_code == 0, again.output
    assert "nothing new to pull" in again.output and "(0 downloaded)" in again.output
    gone = EventStore(b).segments("votes", EXPERIMENT)[0]
    gone.unlink()  # a segment deleted since: only it is downloaded again
    repaired = pull(EXPERIMENT, b, shared["uri"])
    assert repaired.pulled and repaired.downloaded == 2 and gone.is_file()  # the segment and the call pack
    assert repaired.calls_added == 0
    assert not EventStore(b).verify()[1]


def test_rerun_from_a_pulled_store_makes_no_model_call(shared, tmp_path):
    """Store B + an empty call cache, filled only by pull: rerunning the spec on B calls the model 0 times."""
    b = tmp_path / "B"
    assert not (b / "llm_cache.sqlite").exists()
    r = pull(EXPERIMENT, b, shared["uri"])
    assert r.calls_added == shared["summary"]["llm_calls"]  # every call of the run travelled in the call pack
    model = shared["model"]
    before = model.calls
    other_mlflow = f"sqlite:///{tmp_path / 'mlflow-b' / 'mlflow.db'}"
    (tmp_path / "mlflow-b").mkdir()
    proc = cli(shared["ws"], "run", str(shared["spec"]), "--store", str(b), "--json", str(tmp_path / "b.json"),
               env={"MLFLOW_TRACKING_URI": other_mlflow})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "b.json").read_text())
    assert model.calls - before == 0, f"{model.calls - before} model calls on the rerun"
    assert summary["llm_calls"] == 0 and summary["cache_hits"] > 0
    assert {c: m["em"] for c, m in summary["cells"].items()} == {c: m["em"] for c, m in shared["summary"]["cells"].items()}


def test_parent_run_carries_provenance_and_cells_carry_outcome_tables_and_dataset(shared):
    from mlflow import MlflowClient

    import ragledger
    from schemas.records import SCHEMA_VERSION

    client = MlflowClient(tracking_uri=shared["uri"])
    parent = client.get_run(shared["summary"]["mlflow_parent_run_id"])
    tags = parent.data.tags
    assert tags["ragledger.version"] == ragledger.__version__
    assert tags["ragledger.schema_version"] == str(SCHEMA_VERSION)
    assert tags["ragledger.spec_hash"] == shared["summary"]["spec_hash"]
    assert tags["ragledger.model_identity"] == "openai-compatible:scripted"  # the served model, not its URL
    assert len(tags["ragledger.dataset_hash"]) == 16 and len(tags["ragledger.corpus_hash"]) >= 16
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert tags["mlflow.source.git.commit"] == head
    assert tags["ragledger.git_dirty"] in ("true", "false")
    root = {f.path for f in client.list_artifacts(parent.info.run_id)}
    assert {"spec.yaml", "ragledger", "callpack"} <= root
    for cell, run_id in shared["summary"]["mlflow_cell_run_ids"].items():
        run = client.get_run(run_id)
        assert run.data.tags["mlflow.source.git.commit"] == head
        (ds,) = run.inputs.dataset_inputs
        assert ds.dataset.digest == tags["ragledger.dataset_hash"] and ds.dataset.name.startswith("jsonl:")
        table = json.loads(Path(client.download_artifacts(run_id, "outcomes_table.json")).read_text())
        assert table["columns"] == ["qid", "question", "gold", "prediction", "em", "f1", "error_type"]
        assert len(table["data"]) == 6
        assert sum(row[4] for row in table["data"]) / 6 * 100 == pytest.approx(shared["summary"]["cells"][cell]["em"], abs=0.01)


def test_an_interrupted_pull_resumes_and_downloads_only_what_is_missing(shared, tmp_path, monkeypatch):
    import tracking.mlflow.pull as mp

    checked = mp.segment_problem
    count = {"n": 0}

    def killed_after_three(path, kind, experiment):
        count["n"] += 1
        if count["n"] > 3:
            raise KeyboardInterrupt  # the user's Ctrl-C (or a kill) in the middle of the downloads
        return checked(path, kind, experiment)

    b = tmp_path / "B"
    monkeypatch.setattr(mp, "segment_problem", killed_after_three)
    with pytest.raises(KeyboardInterrupt):
        pull(EXPERIMENT, b, shared["uri"])
    assert Ledger(b).latest_execution(EXPERIMENT) is None  # no manifest: the execution is not in the store yet
    assert not any(EventStore(b).segments(k, EXPERIMENT) for k in ("questions", "outcomes", "generations"))
    assert not list((b / ".pull").rglob(".partial-*"))  # no half-downloaded file kept
    monkeypatch.setattr(mp, "segment_problem", checked)
    r = pull(EXPERIMENT, b, shared["uri"])
    assert r.reused == 3 and r.pulled
    full = pull(EXPERIMENT, tmp_path / "C", shared["uri"])
    assert r.downloaded == full.downloaded - 3
    pd.testing.assert_frame_equal(outcomes(b), outcomes(shared["ws"] / "A"))


def _cell_artifact(shared, kind: str) -> Path:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=shared["uri"])
    run_id = next(iter(shared["summary"]["mlflow_cell_run_ids"].values()))
    art = client.get_run(run_id).info.artifact_uri.removeprefix("file://")
    return sorted((Path(art) / "records" / kind).glob("seg-*.parquet"))[0]


@pytest.mark.parametrize("damage", ["altered", "truncated", "missing"])
def test_a_damaged_or_missing_artifact_is_one_error_line_and_nothing_is_kept(shared, tmp_path, damage):
    seg = _cell_artifact(shared, "outcomes")
    backup = tmp_path / "backup.parquet"
    shutil.copy2(seg, backup)
    try:
        if damage == "altered":  # a value changed, the file rewritten with its old checksum
            table = pq.read_table(seg)
            df = table.to_pandas()
            df.loc[0, "prediction"] = "altered"
            pq.write_table(pd.DataFrame(df).pipe(lambda d: __import__("pyarrow").Table.from_pandas(d, preserve_index=False))
                           .replace_schema_metadata(table.schema.metadata), seg)
        elif damage == "truncated":
            seg.write_bytes(backup.read_bytes()[: backup.stat().st_size // 2])
        else:
            seg.unlink()
        b = tmp_path / "B"
        result = CliRunner().invoke(share_app(), ["pull", EXPERIMENT, "--mlflow-uri", shared["uri"], "--store", str(b)])
        assert result.exit_code == 2, result.output
        line = one_error_line(result.output)
        assert f"records/outcomes/{seg.name}" in line and seg.parent.parent.parent.parent.name in line  # artifact, run
        assert {"altered": "checksum mismatch", "truncated": "unreadable Parquet", "missing": "missing"}[damage] in line
        assert Ledger(b).latest_execution(EXPERIMENT) is None
        for kind in ("questions", "retrievals", "generations", "votes", "outcomes"):
            assert not EventStore(b).segments(kind, EXPERIMENT), kind
        assert not (b / "llm_cache.sqlite").exists()
        assert not list((b / ".pull").rglob(".partial-*"))
    finally:
        shutil.copy2(backup, seg)


def test_records_of_another_schema_version_are_not_mixed_in(shared, tmp_path):
    from tracking.store.events import new_events

    b = tmp_path / "B"
    store = EventStore(b)
    rows = [{"event_id": "x" * 32, "cell": "", "qid": "q-new", "dataset": "jsonl", "question": "Which?",
             "answers": ["Paris"], "gold_pids": []}]
    df = new_events("questions", EXPERIMENT, rows)
    df["schema_version"] = 2  # records a later ragledger wrote
    store.write("questions", df)
    with pytest.raises(PullError) as exc:
        pull(EXPERIMENT, b, shared["uri"])
    msg = str(exc.value)
    assert "refusing to mix records of different schema versions" in msg
    assert "schema version 1: run " in msg and "schema version 2: " in msg and "questions" in msg
    assert Ledger(b).latest_execution(EXPERIMENT) is None and len(store.segments("questions", EXPERIMENT)) == 1


def test_ensure_local_pulls_only_when_the_store_lacks_the_experiment(shared, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    b = tmp_path / "B"
    assert ensure_local(EXPERIMENT, b, None) is None  # no MLflow named: the command's own "not found" error
    assert ensure_local(EXPERIMENT, b, shared["uri"]).pulled
    assert ensure_local(EXPERIMENT, b, "http://127.0.0.1:9") is None  # present: MLflow is not even asked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", shared["uri"])
    assert ensure_local(EXPERIMENT, tmp_path / "C").pulled  # MLFLOW_TRACKING_URI when no URI is given
    with pytest.raises(PullError, match="no run of experiment 'nope'"):
        ensure_local("nope", tmp_path / "D", shared["uri"])


def test_pull_errors_are_one_line(shared, tmp_path):
    runner, app = CliRunner(), share_app()
    cases = {
        "no such experiment": (["pull", "nope", "--mlflow-uri", shared["uri"]], "has no run of experiment 'nope'"),
        "no database": (["pull", EXPERIMENT, "--mlflow-uri", f"sqlite:///{tmp_path / 'none.db'}"], "no such database"),
        "server down": (["pull", EXPERIMENT, "--mlflow-uri", "http://127.0.0.1:9"], "no answer"),
        "credentials": (["pull", EXPERIMENT, "--mlflow-uri", "http://bob:hunter22@127.0.0.1:9"], "carries credentials"),
    }
    empty = tmp_path / "empty"
    empty.mkdir()
    for what, (args, expected) in cases.items():
        result = runner.invoke(app, [*args, "--store", str(tmp_path / "B")])
        assert result.exit_code == 2, (what, result.output)
        line = one_error_line(result.output)
        assert expected in line, (what, line)
        assert "hunter22" not in result.output
        assert not (tmp_path / "B").exists(), what  # nothing kept: the store folder the pull made is gone
        result = runner.invoke(app, [*args, "--store", str(empty)])
        assert result.exit_code == 2 and expected in one_error_line(result.output), (what, result.output)
        assert empty.is_dir() and not any(empty.iterdir()), what  # a folder given empty stays, and empty


def test_pull_from_the_mlflow_server_on_postgresql(tmp_path, mlflow_postgres):
    """The lab's setup: a run logs through the MLflow server (PostgreSQL backend, proxied artifacts); another store
    pulls it over HTTP and has the same outcomes; a second pull downloads nothing."""
    url, _ = mlflow_postgres
    ws = tmp_path / "ws"
    ws.mkdir()
    make_data(ws, 6)
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(ws, model.base_url, name=EXPERIMENT)
        proc = cli(ws, "run", str(spec), "--store", str(ws / "A"), env={"MLFLOW_TRACKING_URI": url})
        assert proc.returncode == 0, proc.stderr[-3000:]
    r = pull(EXPERIMENT, tmp_path / "B", url)
    assert len(r.pulled) == 1 and r.downloaded > 0 and r.calls_added > 0
    pd.testing.assert_frame_equal(outcomes(tmp_path / "B"), outcomes(ws / "A"))
    assert Ledger(tmp_path / "B").latest_execution(EXPERIMENT)["summary"]["tracking_uri"] == url
    again = pull(EXPERIMENT, tmp_path / "B", url)
    assert again.nothing_new and again.downloaded == 0


def test_the_analysis_commands_pull_what_the_store_lacks(shared, tmp_path, monkeypatch):
    """`ragledger query/errors/hardest/trace --mlflow-uri` on an empty store: the experiment is pulled from MLflow
    first (reported on stderr, so CSV on stdout stays clean); once present, MLflow is not asked again; an experiment
    MLflow does not have is one error line."""
    from ragledger.cli import app

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runner, b = CliRunner(), tmp_path / "B"
    got = runner.invoke(app, ["errors", EXPERIMENT, "--store", str(b), "--include-correct", "--format", "csv",
                              "--mlflow-uri", shared["uri"]])
    assert got.exit_code == 0, got.output
    assert "pulled share from MLflow" in got.stderr
    rows = pd.read_csv(io.StringIO(got.stdout))
    expected = outcomes(shared["ws"] / "A")
    assert sorted(zip(rows["cell"], rows["qid"], strict=True)) == sorted(zip(expected["cell"], expected["qid"], strict=True))
    again = runner.invoke(app, ["query", "SELECT count(*) AS n FROM outcomes", "--experiment", EXPERIMENT,
                                "--store", str(b), "--format", "csv"], env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert again.exit_code == 0 and again.stderr == "", again.output  # present: MLflow not asked
    assert again.stdout.splitlines()[1] == str(len(outcomes(shared["ws"] / "A")))
    qid = outcomes(shared["ws"] / "A")["qid"].iloc[0]
    for args in (["hardest", EXPERIMENT], ["trace", EXPERIMENT, qid]):
        c = tmp_path / f"C-{args[0]}"
        out = runner.invoke(app, [*args, "--store", str(c), "--mlflow-uri", shared["uri"]])
        assert out.exit_code == 0 and "pulled share from MLflow" in out.stderr, (args, out.output)
    missing = runner.invoke(app, ["errors", "nope", "--store", str(b)], env={"MLFLOW_TRACKING_URI": shared["uri"]})
    assert missing.exit_code == 2 and one_error_line(missing.stderr).endswith("has no run of experiment 'nope'")


def test_a_view_that_cannot_be_made_is_left_out_and_the_execution_still_logged(shared, tmp_path, monkeypatch):
    """A manifest whose store lacks its segments and call cache (synced from elsewhere), and a defect building a
    view: the parent and cell runs are still logged and FINISHED, without those views; nothing stays pending."""
    from mlflow import MlflowClient

    import tracking.mlflow.views as ml
    from tracking.mlflow.runs import log_execution

    record = json.loads(Path(shared["summary"]["manifest"]).read_text())
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    gone = json.loads(json.dumps(record).replace(str(shared["ws"] / "A"), str(tmp_path / "nowhere")))
    first = log_execution(uri, "no-store", gone, tmp_path / "nowhere")

    def broken(*args, **kwargs):
        raise KeyError("prediction")

    monkeypatch.setattr(ml, "outcomes_table", broken)
    second = log_execution(uri, "broken-view", record, shared["ws"] / "A")
    client = MlflowClient(tracking_uri=uri)
    for logged, has_pack in ((first, False), (second, True)):
        parent = client.get_run(logged["parent"])
        assert parent.info.status == "FINISHED"
        assert ("callpack" in {f.path for f in client.list_artifacts(logged["parent"])}) == has_pack
        for run_id in logged["cells"].values():
            assert client.get_run(run_id).info.status == "FINISHED"
            assert "outcomes_table.json" not in {f.path for f in client.list_artifacts(run_id)}


def test_a_run_logged_before_the_manifest_artifact_is_pulled_from_its_cell_runs(shared, tmp_path):
    """Runs logged by an earlier ragledger have no ragledger/manifest.json, call pack or execution tag: the manifest
    is rebuilt from the cell runs' record artifacts, spec.yaml and analysis/summary.json."""
    from mlflow import MlflowClient

    from tracking.mlflow.log import EXECUTION_TAG

    client = MlflowClient(tracking_uri=shared["uri"])
    parent = client.get_run(shared["summary"]["mlflow_parent_run_id"])
    art = Path(parent.info.artifact_uri.removeprefix("file://"))
    aside = tmp_path / "aside"
    aside.mkdir()
    execution = parent.data.tags[EXECUTION_TAG]
    try:
        for d in ("ragledger", "callpack"):
            shutil.move(art / d, aside / d)
        client.delete_tag(parent.info.run_id, EXECUTION_TAG)
        b = tmp_path / "B"
        r = pull(EXPERIMENT, b, shared["uri"])
        assert r.pulled == [f"{r.pulled[0][:15]}-mlflow-{parent.info.run_id[:8]}"] and r.calls_added == 0
        pd.testing.assert_frame_equal(outcomes(b), outcomes(shared["ws"] / "A"))
        manifest = Ledger(b).latest_execution(EXPERIMENT)
        assert manifest["rebuilt_from_runs"] and set(manifest["summary"]["cells"]) == set(shared["summary"]["cells"])
        assert manifest["summary"]["mlflow_parent_run_id"] == parent.info.run_id
        assert not EventStore(b).verify()[1]
        assert pull(EXPERIMENT, b, shared["uri"]).nothing_new
    finally:
        client.set_tag(parent.info.run_id, EXECUTION_TAG, execution)
        for d in ("ragledger", "callpack"):
            if (aside / d).exists():
                shutil.move(aside / d, art / d)


def test_runs_tagged_with_another_schema_version_are_refused_before_any_download(shared, tmp_path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=shared["uri"])
    run_id = shared["summary"]["mlflow_parent_run_id"]
    try:
        client.set_tag(run_id, "ragledger.schema_version", "9")
        with pytest.raises(PullError, match=f"run {run_id} holds records of schema version 9; this ragledger reads"):
            pull(EXPERIMENT, tmp_path / "B", shared["uri"])
        assert not (tmp_path / "B" / ".pull" / EXPERIMENT).exists() or not any((tmp_path / "B" / ".pull" / EXPERIMENT).iterdir())
    finally:
        client.set_tag(run_id, "ragledger.schema_version", "1")
