"""Prefect settings for the embedded default. Must run before `prefect` is imported."""

from __future__ import annotations

import os
from pathlib import Path


def default_prefect_home(workdir: Path) -> Path:
    """Where a command run in `workdir` keeps Prefect's home unless PREFECT_HOME says otherwise."""
    return workdir / ".ragledger" / "prefect"


def configure_prefect_home(workdir: Path) -> None:
    """Keep Prefect's database and persisted task results beside the store (not in the user's home)
    unless PREFECT_HOME / PREFECT_API_URL say otherwise; telemetry off (this machine has no network);
    quiet logs, since the CLI shows its own progress; Prefect's logging config is ragledger's
    (ragledger/prefect_logging.yaml: no tracebacks on the terminal, warnings and errors to the run log) unless
    the user chose one."""
    home = default_prefect_home(workdir).resolve()
    os.environ.setdefault("PREFECT_HOME", str(home))
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(Path(os.environ["PREFECT_HOME"]) / "storage"))
    Path(os.environ["PREFECT_LOCAL_STORAGE_PATH"]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # a LocalCluster's start: ~30 INFO lines otherwise
    os.environ.setdefault("PREFECT_LOGGING_SETTINGS_PATH", str(Path(__file__).with_name("prefect_logging.yaml")))
