"""The analyses `ragledger analyze` runs, each an entry of one registry: seed 002's (tracking/analysis/seed002.py) and
every one registered with `@analysis`. The analysis flow (flows/analyze.py) is a loop over it: each entry's files
are written (and logged under `analysis/` on the experiment's MLflow parent run), its sections are the report's and
the command's output, its metrics are logged on that run. An `@analysis` computes a table from the records: it is
written as `<name>.parquet`, shown under its title, and its `metrics`, when given, logged as
`analysis.<name>.<key>`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from tracking.analysis import seed002
from tracking.analysis.inconsistency import AnalysisResult, Outputs, Section


@dataclass(frozen=True)
class AnalysisInput:
    """What every registered analysis reads: records only, never a model."""

    experiment: str
    outcomes: pd.DataFrame  # the latest execution's outcome records, on the questions every cell answered
    cells: list[str]  # the analysis's cell order (grouped by reader and model, by accuracy within a group)
    metric: str  # the correctness the run of `ragledger analyze` asked for (em, or semantic)


@dataclass(frozen=True)
class Analysis:
    name: str  # an `@analysis`'s file stem (`<name>.parquet`) and its key in the flow's result
    title: str  # an `@analysis`'s heading in the report and the command's output
    table: Callable[[AnalysisInput], pd.DataFrame] | None = None  # an `@analysis`'s table, from the records
    metrics: Callable[[pd.DataFrame], dict[str, float]] | None = None  # from its table, for the MLflow parent run
    # seed 002's: what it writes, shows and logs from the tables every analysis shares (tables.py `compute`)
    shared: Callable[[AnalysisResult], Outputs] | None = None

    def outputs(self, res: AnalysisResult) -> Outputs:
        if self.shared is not None:
            return self.shared(res)
        t = res.tables[self.name]
        shown = t.map(lambda v: f"{v:.4g}" if isinstance(v, float) else str(v))
        metrics = {f"analysis.{self.name}.{k}": float(v) for k, v in (self.metrics(t) if self.metrics else {}).items()}
        return Outputs({f"{self.name}.parquet": t}, [Section(self.title, table=shown)], metrics)


ANALYSES: dict[str, Analysis] = {
    "mrlr": Analysis("mrlr", "RWR / MRWR / MRLR per (reader, model) group", shared=seed002.mrlr),
    "decomposition": Analysis("decomposition", "error decomposition", shared=seed002.decomposition),
    "paired": Analysis("paired", "paired comparisons", shared=seed002.paired),
    "eor": Analysis("eor", "Ensemble of Retrievers", shared=seed002.eor),
}


def analysis(name: str, title: str, metrics: Callable[[pd.DataFrame], dict[str, float]] | None = None):
    """Register `fn(AnalysisInput) -> DataFrame` as the analysis `name`."""

    def register(fn: Callable[[AnalysisInput], pd.DataFrame]) -> Callable[[AnalysisInput], pd.DataFrame]:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"analysis name {name!r}: letters, digits and _ only (it names a file and MLflow metrics)")
        if name in ANALYSES and ANALYSES[name].shared is not None:
            raise ValueError(f"analysis name {name!r} is seed 002's; pick another")
        ANALYSES[name] = Analysis(name, title, fn, metrics)
        return fn

    return register


def run_analyses(given: AnalysisInput) -> dict[str, pd.DataFrame]:
    """Every `@analysis`'s table, by name, in registration order."""
    return {a.name: a.table(given).reset_index(drop=True) for a in ANALYSES.values() if a.table is not None}


def outputs(res: AnalysisResult) -> dict[str, Outputs]:
    """What every analysis of the registry adds to `res`, by name, in registration order (an `@analysis` whose table
    `res` lacks, registered after it was computed, is passed over)."""
    return {a.name: a.outputs(res) for a in ANALYSES.values() if a.shared is not None or a.name in res.tables}
