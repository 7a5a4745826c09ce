from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("RAGLEDGER_DATA", str((REPO / ".." / "shared" / "data").resolve()))
DATA = Path(os.environ["RAGLEDGER_DATA"])


@pytest.fixture
def data_dir() -> Path:
    if not (DATA / "squad" / "dev-v1.1.json.gz").exists():
        pytest.fail(f"real data not found under {DATA} (set RAGLEDGER_DATA)")
    return DATA


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One temporary Prefect API (SQLite) for the whole pytest run, with task results persisted under tmp."""
    home = tmp_path_factory.mktemp("prefect")
    os.environ["PREFECT_HOME"] = str(home)
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(home / "storage")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(autouse=True)
def _no_leaked_mlflow_uri():
    """mlflow.set_tracking_uri (used by tests to read runs back) also sets MLFLOW_TRACKING_URI in os.environ;
    without this, a later test's CLI subprocesses would log to an earlier test's MLflow store."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before
