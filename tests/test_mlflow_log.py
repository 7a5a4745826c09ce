"""MLflow logging keeps to the URI it was given: one run's store never becomes a later run's default."""

from __future__ import annotations

import os


def test_logger_does_not_change_the_process_default_tracking_uri(tmp_path, monkeypatch):
    from tracking.mlflow.log import MlflowLogger, resolve_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    first = f"sqlite:///{tmp_path / 'first' / 'mlflow.db'}"
    (tmp_path / "first").mkdir()
    logger = MlflowLogger(first, "exp-a")
    run = logger.start_run("parent", {"ragledger.level": "experiment"})
    logger.log(run, metrics={"em": 50.0})
    # a long-lived process (ragledger schedule) resolving the next run's default must not get the first store
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert resolve_tracking_uri(None) == f"sqlite:///{(tmp_path / '.ragledger' / 'mlflow.db').resolve()}"
    assert logger.client.get_run(run).data.metrics["em"] == 50.0


def test_four_processes_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path):
    """MLflow migrates a new SQLite store on first open; without the init lock, concurrent first opens
    raced through the migrations and most processes failed (measured: 10 of 12 in three rounds of four)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = "import sys; from tracking.mlflow.log import MlflowLogger; MlflowLogger(sys.argv[1], sys.argv[2])"
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, f"exp{i}"], cwd=repo, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], "\n".join(e[-1500:] for e in errors)

    from mlflow import MlflowClient

    names = {e.name for e in MlflowClient(tracking_uri=uri).search_experiments()}
    assert {f"exp{i}" for i in range(4)} <= names


def test_git_provenance_names_the_commit_and_never_a_remote_credential(tmp_path):
    import subprocess

    from tracking.mlflow.views import git_provenance

    assert git_provenance(tmp_path) == {}  # not a checkout: no source tags
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "f.txt").write_text("x")
    subprocess.run([*git, "add", "f.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    subprocess.run([*git, "remote", "add", "origin", "https://bob:s3cret-token@example.org/lab/code.git"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    tags = git_provenance(repo)
    assert tags["mlflow.source.git.commit"] == head and tags["mlflow.source.git.branch"] == "main"
    assert tags["mlflow.source.git.repoURL"] == "https://***@example.org/lab/code.git"
    assert tags["ragledger.git_dirty"] == "false"
    (repo / "f.txt").write_text("changed")
    assert git_provenance(repo)["ragledger.git_dirty"] == "true"
    assert "s3cret" not in str(git_provenance(repo))


def test_outcomes_table_rows_and_questions_digest():
    import pandas as pd

    from tracking.mlflow.views import outcomes_table, questions_digest

    q = pd.DataFrame({"qid": ["q2", "q1"], "question": ["Two?", "One?"], "answers": [["b", "B"], ["a"]]})
    o = pd.DataFrame({"qid": ["q1", "q2"], "prediction": ["a", "x"], "em": [1.0, 0.0], "f1": [1.0, 0.0],
                      "error_type": ["correct", "hallucination_error"]})
    t = outcomes_table(o, q)
    assert list(t) == ["qid", "question", "gold", "prediction", "em", "f1", "error_type"]
    assert t["gold"] == ["a", "b | B"] and t["question"] == ["One?", "Two?"]
    assert questions_digest(q) == questions_digest(q.iloc[::-1]) != questions_digest(q.iloc[:1])  # order-free
