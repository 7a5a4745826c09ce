"""MLflow logging keeps to the URI it was given: one run's store never becomes a later run's default."""

from __future__ import annotations

import os


def test_logger_does_not_change_the_process_default_tracking_uri(tmp_path, monkeypatch):
    from tracking.mlflow_log import MlflowLogger, resolve_tracking_uri

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
