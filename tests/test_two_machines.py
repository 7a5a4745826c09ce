"""Two machines, one MLflow server on PostgreSQL: an experiment run on machine A (its own working directory, store,
call cache and Prefect home) is pulled by machine B, which starts empty. B gets the same outcomes (byte for byte),
the same `ragledger analyze` tables and the same `ragledger trace`; B's rerun with one more reader calls the model
only for that reader, and A sees B's new parent run in MLflow. A pull that meets a damaged artifact is one
`error:` line naming it and leaves B's store as it was."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.test_reliability import cli, make_data, reader, write_spec
from tracking.store.events import EventStore

EXPERIMENT = "twomachines"
NEW_READER = {"name": "concatenation", "samples": 2}


def outcome_digest(store: Path) -> str:
    """sha256 of the outcome rows sorted by event id, every column but created_at (the one per-write field)."""
    df = EventStore(store).read("outcomes", EXPERIMENT).drop(columns=["created_at"])
    df = df.sort_values("event_id").reset_index(drop=True)[sorted(c for c in df.columns if c != "created_at")]
    return hashlib.sha256(df.to_json(orient="split", date_format="iso").encode()).hexdigest()


def analysis_tables(store: Path) -> dict[str, pd.DataFrame]:
    """The parquet tables `ragledger analyze` wrote, without columns that hold times or this machine's paths."""
    tables = {}
    root = store / "analysis" / EXPERIMENT
    for f in sorted(root.rglob("*.parquet")):
        df = pd.read_parquet(f)
        drop = [c for c in df.columns if any(w in c.lower() for w in ("time", "created", "_at", "path", "file"))]
        df = df.drop(columns=drop).replace({str(store): "<store>"}, regex=True)
        tables[str(f.relative_to(root))] = df.reset_index(drop=True)
    return tables


def listing(root: Path) -> dict[str, str]:
    """Every file under `root` with its sha256, the pull's own staging area (`.pull/`) left out."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".pull" not in p.relative_to(root).parts}


def request_key(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def test_a_run_on_machine_a_is_pulled_analysed_traced_and_extended_on_machine_b(tmp_path, mlflow_postgres):
    from mlflow import MlflowClient

    url, server_dir = mlflow_postgres
    data, a, b = tmp_path / "data", tmp_path / "A", tmp_path / "B"
    for d in (data, a, b):
        d.mkdir()
    make_data(data, 6)  # the shared dataset both machines name in their spec (as a shared data directory would be)
    env = {"MLFLOW_TRACKING_URI": url}
    store_a, store_b = a / "store", b / "store"
    with ScriptedServer(answer=reader) as model:
        spec = write_spec(data, model.base_url, name=EXPERIMENT)
        shutil.copy2(spec, a / spec.name)
        proc = cli(a, "run", str(a / spec.name), "--store", str(store_a), "--json", str(a / "a.json"), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary_a = json.loads((a / "a.json").read_text())
        a_requests = {request_key(r) for r in model.requests}
        assert summary_a["llm_calls"] == model.calls > 0

        # a damaged artifact on the server: one error line naming it, B's store as it was
        store_b.mkdir()  # a new, empty store (a folder holding other files is refused before the pull: test_store_identity)
        before = listing(store_b)
        cell_run = next(iter(summary_a["mlflow_cell_run_ids"].values()))
        seg = sorted(p for p in (server_dir / "artifacts").rglob("seg-*.parquet")
                     if cell_run in p.parts and "outcomes" in p.parts)[0]
        good = seg.read_bytes()
        seg.write_bytes(good[: len(good) // 2])
        try:
            bad = cli(b, "pull", EXPERIMENT, "--mlflow-uri", url, "--store", str(store_b))
        finally:
            seg.write_bytes(good)
        assert bad.returncode == 2, bad.stdout + bad.stderr
        lines = [line for line in (bad.stdout + bad.stderr).splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), lines
        assert f"records/outcomes/{seg.name}" in lines[0] and cell_run in lines[0], lines[0]
        assert "unreadable Parquet" in lines[0], lines[0]
        # nothing entered the store; the segments checked before the damaged one stay staged under .pull/ (by
        # design: the pull after a fix downloads only the rest), never a half-downloaded file
        assert listing(store_b) == before
        assert not list((store_b / ".pull").rglob(".partial-*"))
        staged = list((store_b / ".pull").rglob("seg-*.parquet"))

        # B pulls the run: the same outcomes, byte for byte
        pulled = cli(b, "pull", EXPERIMENT, "--mlflow-uri", url, "--store", str(store_b))
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        said = " ".join(pulled.stdout.split())
        assert "pulled 1 execution(s)" in said and f"{len(staged)} segment(s) already there" in said, said
        assert outcome_digest(store_b) == outcome_digest(store_a)

        # the same analysis tables and the same trace
        for ws, store in ((a, store_a), (b, store_b)):
            proc = cli(ws, "analyze", EXPERIMENT, "--store", str(store))
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        tables_a, tables_b = analysis_tables(store_a), analysis_tables(store_b)
        assert tables_a and tables_a.keys() == tables_b.keys()
        for name in tables_a:
            pd.testing.assert_frame_equal(tables_a[name], tables_b[name], obj=name)
        qid = EventStore(store_a).read("outcomes", EXPERIMENT)["qid"].sort_values().iloc[0]
        traces = []
        for ws, store in ((a, store_a), (b, store_b)):
            proc = cli(ws, "trace", EXPERIMENT, qid, "--store", str(store))
            assert proc.returncode == 0, proc.stderr[-3000:]
            traces.append(proc.stdout.replace(str(store), "<store>"))
        assert traces[0] == traces[1] and qid in traces[0]

        # B reruns the spec with one more reader: the model is called only for that reader
        extended = yaml.safe_load((a / spec.name).read_text())
        extended["readers"].append(NEW_READER)
        (b / spec.name).write_text(yaml.safe_dump(extended))
        before_calls = model.calls
        proc = cli(b, "run", str(b / spec.name), "--store", str(store_b), "--json", str(b / "b.json"), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        summary_b = json.loads((b / "b.json").read_text())
        new = [request_key(r) for r in model.requests[before_calls:]]
        assert new and summary_b["llm_calls"] == len(new)
        assert not a_requests & set(new), "B repeated model calls A had made"
        old_cells = set(summary_a["cells"])
        assert old_cells < set(summary_b["cells"])
        assert {c: summary_b["cells"][c]["em"] for c in old_cells} == {c: m["em"] for c, m in summary_a["cells"].items()}

    # A sees B's new parent run in MLflow, and can pull it
    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name(EXPERIMENT)
    parents = client.search_runs([exp.experiment_id], "tags.\"ragledger.level\" = 'experiment'")
    ids = {r.info.run_id for r in parents}
    assert {summary_a["mlflow_parent_run_id"], summary_b["mlflow_parent_run_id"]} <= ids
    assert summary_b["mlflow_parent_run_id"] != summary_a["mlflow_parent_run_id"]
    back = cli(a, "pull", EXPERIMENT, "--mlflow-uri", url, "--store", str(store_a))
    assert back.returncode == 0 and "pulled 1 execution(s)" in back.stdout, back.stdout + back.stderr
