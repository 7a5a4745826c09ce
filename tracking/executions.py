"""An experiment's executions: run manifests (`<store>/runs/<experiment>/*.json`, written by the
experiment flow: summary with the MLflow parent run id, segments per cell, spec) and the outcomes of
the latest one. Kept free of Prefect imports so the query commands start fast."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tracking.analysis import AnalysisError
from tracking.events import EventStore


def manifests(store_root: str | Path, experiment: str) -> list[Path]:
    """Run manifests of an experiment, oldest first (names start with a UTC timestamp; mtime breaks ties)."""
    d = Path(store_root) / "runs" / experiment
    files = list(d.glob("*.json")) if d.is_dir() else []
    return sorted(files, key=lambda p: (p.name[:15], p.stat().st_mtime, p.name))


def latest_execution(store_root: str | Path, experiment: str) -> dict | None:
    files = manifests(store_root, experiment)
    if not files:
        return None
    try:
        return {**json.loads(files[-1].read_text()), "manifest_path": str(files[-1])}
    except (OSError, json.JSONDecodeError) as exc:
        raise AnalysisError(f"{files[-1]}: unreadable run manifest: {exc}") from None


def load_outcomes(store_root: str | Path, experiment: str, execution: dict | None = None) -> pd.DataFrame:
    """Outcomes of the execution's segments (the latest execution's, if it has a manifest), else every
    outcome of the experiment. Restricting to one execution keeps an earlier run with another question
    sample or prompt version from being mixed into the analysis."""
    store = EventStore(store_root)
    if execution is not None:
        paths = sorted({p for segs in execution.get("segments", {}).values() for p in segs.get("outcomes", [])})
        existing = [Path(p) for p in paths if Path(p).exists()]
        if paths and len(existing) < len(paths):
            missing = next(p for p in paths if not Path(p).exists())
            raise AnalysisError(f"{execution.get('manifest_path')}: outcome segment {missing} is missing from the store")
        if existing:
            return store.read("outcomes", paths=existing)
    df = store.read("outcomes", experiment)
    if df.empty:
        where = Path(store_root) / "outcomes" / experiment
        raise AnalysisError(f"experiment {experiment!r}: no outcome records under {where}")
    return df
