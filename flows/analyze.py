"""The analysis flow: seed 002's projections over an experiment's stored outcomes, written as
parquet tables + PNG plots + an HTML report to the MLflow parent run of the experiment's latest
execution. It reads records only (event store + run manifests); it never calls a model.

`run_analysis` is the pure-ish function (files + optional MLflow logging); `analyze_flow` is its
thin Prefect wrapper.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow

from core.paths import StoreLayout
from tracking.analysis.inconsistency import AnalysisResult
from tracking.analysis.registry import outputs
from tracking.analysis.tables import compute
from tracking.mlflow.analysis import log_analysis, parent_run
from tracking.mlflow.sync import logged_now
from tracking.store.ledger import Ledger, ensemble_rows

# analysis-2: RWR / MRWR / MRLR and per-error RWR per (reader, model) group (tracking/analysis/inconsistency.py), not pooled
ANALYSIS_VERSION = "analysis-2"


def write_outputs(res: AnalysisResult, out_dir: Path, store_root: str | Path | None = None, report: bool = True) -> list[Path]:
    """Every analysis of the registry's files (tracking/analysis/registry.py), their figures
    (tracking/report/figures.py) and the HTML report, under out_dir; returns the files. The figures are kept in
    `res.pngs` for the report."""
    from tracking.report.figures import figures  # matplotlib: loaded when an analysis is written, not at start-up

    out_dir.mkdir(parents=True, exist_ok=True)
    res.outputs = outputs(res)
    files: list[Path] = []
    for out in res.outputs.values():
        for name, data in out.files.items():
            p = out_dir / name
            if isinstance(data, pd.DataFrame):
                data.to_parquet(p, index=False)
            elif isinstance(data, bytes):
                p.write_bytes(data)
                res.pngs[name] = data
            else:
                p.write_text(data, encoding="utf-8")
            files.append(p)
    for name, png in figures(res).items():
        (out_dir / name).write_bytes(png)
        res.pngs[name] = png
        files.append(out_dir / name)
    if report:
        files.append(_put_report(res, out_dir, store_root))
    return files


def _put_report(res: AnalysisResult, out_dir: Path, store_root: str | Path | None) -> Path:
    from tracking.report.report import html_report

    p = out_dir / "report.html"
    p.write_text(html_report(res, store_root), encoding="utf-8")
    return p


def run_analysis(store_root: str | Path, experiment: str, out_dir: str | Path | None = None, metric: str = "em",
                 eor: bool = True, log_mlflow: bool = True, n_resamples: int = 1000, seed: int = 0,
                 eor_train: str | None = None, eor_pooling: str = "mean", across: tuple[str, ...] = ()) -> AnalysisResult:
    """Analyse the latest execution of `experiment` and write (and log) the results.

    The main analysis covers the execution's cells on every question they share. EoR (fitted on the
    training split) is analysed like any other cell, beside its member cells, on the held-out questions
    only, so no in-sample answer is ever reported; those tables go under `eor/`. `eor_pooling`: mean (seed 002's),
    max, majority, plurality, or search (the best on training accuracy); see tracking/analysis/eor.py. `across`: more
    experiments (a sweep's other datasets) for seed 002's corpus-level figure, `accuracy_across.png` (this one first).
    """
    ledger = Ledger(store_root)
    execution = ledger.latest_execution(experiment)
    if log_mlflow and execution is not None:  # before anything is written: its parent run, once logged
        logged_now(store_root, experiment, execution["name"], say=_notice)
        execution = ledger.execution(experiment, execution["name"])
        parent_run(execution)
    outcomes = ledger.outcomes(experiment, execution)
    outcomes = outcomes[~ensemble_rows(outcomes)]
    res = compute(outcomes, experiment, metric, n_resamples, seed)
    base = Path(out_dir) if out_dir else StoreLayout.of(store_root).analysis(experiment)
    files: list[Path] = []
    if eor:
        from tracking.analysis.eor_cells import eor_cells

        train = None if eor_train is None else ledger.outcomes(eor_train, ledger.latest_execution(eor_train))
        eor_outcomes, info = eor_cells(store_root, experiment, outcomes, seed=seed, train_outcomes=train,
                                       train_experiment=eor_train, pooling=eor_pooling)
        if info:
            res.eor = dict(info)
        for k, cell in enumerate(info.get("cells", [])):
            members = info["members"][cell]
            held = set(info["test_qids"])
            sub = pd.concat([outcomes[outcomes["cell"].isin(members)], eor_outcomes[eor_outcomes["cell"] == cell]])
            sub = sub[sub["qid"].isin(held)]
            eres = compute(sub, f"{experiment} (EoR, held-out)", metric, n_resamples, seed)
            res.eor_results[cell] = eres
            files += write_outputs(eres, base / f"eor{k + 1}", None, report=False)
            summary = _eor_summary(eres, cell, members)
            res.eor.setdefault("summaries", {})[cell] = summary
            if k == 0:  # the first reader's EoR also at top level (MLflow metrics analysis.eor_*)
                res.eor.update(summary)
    files = write_outputs(res, base, store_root, report=False) + files
    if across:
        files += _write_across(res, store_root, [experiment, *across], metric, base)
    files.append(_put_report(res, base, store_root))
    res.files = files
    if log_mlflow and execution is not None:
        log_analysis(res, res.files, execution, base, ANALYSIS_VERSION)
    return res


def _notice(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _write_across(res: AnalysisResult, store_root: str | Path, experiments: list[str], metric: str, base: Path) -> list[Path]:
    """accuracy_across.parquet and its figure (also among the report's plots): tracking/analysis/across.py."""
    from tracking.analysis.across import accuracy_across
    from tracking.report import plots

    table = accuracy_across(store_root, experiments, metric)
    png = plots.accuracy_across(table, experiments, metric)
    res.pngs["accuracy_across.png"] = png
    table.to_parquet(base / "accuracy_across.parquet", index=False)
    (base / "accuracy_across.png").write_bytes(png)
    return [base / "accuracy_across.parquet", base / "accuracy_across.png"]


def _eor_summary(eres: AnalysisResult, cell: str, members: list[str]) -> dict[str, Any]:
    """EoR against the best single retriever of the same reader, on the held-out questions."""
    t = eres.inconsistency.set_index("cell")
    best = max(members, key=lambda c: (t.at[c, "accuracy"], c))
    return {"eor_cell": cell, "best_single": best, "eor_em": float(t.at[cell, "accuracy"]), "eor_f1": float(t.at[cell, "f1"]),
            "best_single_em": float(t.at[best, "accuracy"]), "best_single_f1": float(t.at[best, "f1"]),
            "eor_mrlr": float(t.at[cell, "MRLR"]), "best_single_mrlr": float(t.at[best, "MRLR"]),
            "held_out_questions": eres.questions}


@flow(name="ragledger-analyze", version=ANALYSIS_VERSION)
def analyze_flow(store_root: str, experiment: str, out_dir: str | None = None, metric: str = "em", eor: bool = True,
                 log_mlflow: bool = True, eor_train: str | None = None, eor_pooling: str = "mean",
                 across: tuple[str, ...] = ()) -> dict[str, Any]:
    res = run_analysis(store_root, experiment, out_dir, metric, eor, log_mlflow, eor_train=eor_train, eor_pooling=eor_pooling,
                       across=tuple(across))
    return {"experiment": experiment, "metric": metric, "questions": res.questions, "cells": res.cells,
            "files": [str(f) for f in res.files], "parent_run_id": res.parent_run_id, "tracking_uri": res.tracking_uri,
            "dropped_questions": res.dropped_questions,
            "sections": [s.as_dict() for out in res.outputs.values() for s in out.sections]}
