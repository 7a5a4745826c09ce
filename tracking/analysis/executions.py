"""An experiment's executions: run manifests (`<store>/runs/<experiment>/*.json`, written by the
experiment flow: summary with the MLflow parent run id, segments per cell, spec) and the outcomes of
the latest one. Kept free of Prefect imports so the query commands start fast."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from core.cell import Cell, is_ensemble_retriever
from core.paths import StoreLayout
from tracking.analysis.inconsistency import AnalysisError
from tracking.store.catalog import segment_exists
from tracking.store.events import EventStore


def manifests(store_root: str | Path, experiment: str) -> list[Path]:
    """Run manifests of an experiment, oldest first (core/paths.py `StoreLayout.manifests`)."""
    return StoreLayout.of(store_root).manifests(experiment)


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
    existing: list[Path] = []
    if execution is not None:
        paths = sorted({p for segs in execution.get("segments", {}).values() for p in segs.get("outcomes", [])})
        existing = [Path(p) for p in paths if segment_exists(p)]
        if paths and len(existing) < len(paths):
            missing = next(p for p in paths if not segment_exists(p))
            raise AnalysisError(f"{execution.get('manifest_path')}: outcome segment {missing} is missing from the store")
    df = store.read("outcomes", paths=existing) if existing else store.read("outcomes", experiment)
    if df.empty and not existing:
        where = Path(store_root) / "outcomes" / experiment
        raise AnalysisError(f"experiment {experiment!r}: no outcome records under {where}")
    # in (cell, question) order: the files' own order differs between a pack and the segments it replaced
    return df.sort_values(["cell", "qid"], kind="stable").reset_index(drop=True)


def experiment_outcomes(store_root: str | Path, experiment: str) -> pd.DataFrame:
    """The latest execution's outcomes plus the experiment's stored EoR cells (each (cell, qid) once)."""
    df = load_outcomes(store_root, experiment, latest_execution(store_root, experiment))
    every = EventStore(store_root).read("outcomes", experiment)
    eor = every[ensemble_rows(every)] if not every.empty else every
    df = pd.concat([df[~ensemble_rows(df)], eor], ignore_index=True)
    # a total order: the rows' order in the files differs between a pack and the segments it replaced (a pulled copy)
    df = df.sort_values(["created_at", "cell", "qid"], kind="stable")
    return df.drop_duplicates(["cell", "qid"], keep="last").reset_index(drop=True)


def ensemble_rows(outcomes: pd.DataFrame) -> pd.Series:
    """Which records belong to an EoR cell (core/cell.py: an `eor(...)` retriever)."""
    return outcomes["retriever"].astype(str).map(is_ensemble_retriever).astype(bool)


def resolve_cell(name: str, cells: list[str]) -> str:
    """A cell by exact name, or by words that pick exactly one cell ("bm25@5 post_fusion"): first words that each
    equal one part of the name, then words that each occur in it. ValueError naming the candidates otherwise."""
    if name in cells:
        return name
    words = [w for w in re.split(r"[\s·/]+", name.lower()) if w]
    hits = [c for c in cells if all(any(w == p.lower() for p in _parts(c)) for w in words)]
    if not hits:
        hits = [c for c in cells if all(w in c.lower() for w in words)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ValueError(f"no cell matches {name!r}; cells: {', '.join(cells)}")
    raise ValueError(f"{name!r} matches {len(hits)} cells: {', '.join(hits)}")


def _parts(cell: str) -> tuple[str, ...]:
    """retriever, reader and model of a cell name; an ad-hoc name is one part."""
    try:
        c = Cell.parse(cell)
    except ValueError:
        return (cell.strip(),)
    return (c.retriever, c.reader, c.model)
