"""The analyses `ragledger analyze` runs beside its seed 002 tables, each registered once with `@analysis`: from the
registration on, the analysis flow (flows/analyze.py) computes its table, writes it as `<name>.parquet` (logged under
`analysis/` on the experiment's MLflow parent run with the other files), the report gives it a section, the command
prints it, and its `metrics`, when given, are logged as `analysis.<name>.<key>`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class AnalysisInput:
    """What every registered analysis reads: records only, never a model."""

    experiment: str
    outcomes: pd.DataFrame  # the latest execution's outcome records, on the questions every cell answered
    cells: list[str]  # the analysis's cell order (grouped by reader and model, by accuracy within a group)
    metric: str  # the correctness the run of `ragledger analyze` asked for (em, or semantic)


@dataclass(frozen=True)
class Analysis:
    name: str  # its file stem (`<name>.parquet`) and its key in the flow's result
    title: str  # its heading in the report and the command's output
    table: Callable[[AnalysisInput], pd.DataFrame]
    metrics: Callable[[pd.DataFrame], dict[str, float]] | None = None  # from its table, for the MLflow parent run


ANALYSES: dict[str, Analysis] = {}


def analysis(name: str, title: str, metrics: Callable[[pd.DataFrame], dict[str, float]] | None = None):
    """Register `fn(AnalysisInput) -> DataFrame` as the analysis `name`."""

    def register(fn: Callable[[AnalysisInput], pd.DataFrame]) -> Callable[[AnalysisInput], pd.DataFrame]:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"analysis name {name!r}: letters, digits and _ only (it names a file and MLflow metrics)")
        ANALYSES[name] = Analysis(name, title, fn, metrics)
        return fn

    return register


def run_analyses(given: AnalysisInput) -> dict[str, pd.DataFrame]:
    """Every registered analysis's table, by name, in registration order."""
    return {a.name: a.table(given).reset_index(drop=True) for a in ANALYSES.values()}


def analysis_metrics(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """The registered analyses' metrics, as `analysis.<name>.<key>`."""
    out = {}
    for name, table in tables.items():
        a = ANALYSES.get(name)
        if a is not None and a.metrics is not None:
            out.update({f"analysis.{name}.{k}": float(v) for k, v in a.metrics(table).items()})
    return out
