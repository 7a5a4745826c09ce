"""The analysis flow: seed 002's projections over an experiment's stored outcomes, written as
parquet tables + PNG plots + an HTML report to the MLflow parent run of the experiment's latest
execution. It reads records only (event store + run manifests); it never calls a model.

`run_analysis` is the pure-ish function (files + optional MLflow logging); `analyze_flow` is its
thin Prefect wrapper.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow

from core.paths import StoreLayout
from tracking.analysis import inconsistency as an
from tracking.analysis.inconsistency import AnalysisResult
from tracking.analysis.registry import ANALYSES
from tracking.analysis.tables import PER_ERRORS, compute, per_error_long, rwr_long
from tracking.mlflow.analysis import log_analysis
from tracking.store.ledger import Ledger, ensemble_rows

# analysis-2: RWR / MRWR / MRLR and per-error RWR per (reader, model) group (tracking/analysis/inconsistency.py), not pooled
ANALYSIS_VERSION = "analysis-2"
# the figures' names for the classes where ragledger's differs from seed 002's literal one
ERROR_LABELS = {"HE": "HE, abstentions apart (seed 002's HE also counts an abstention with the answer in context)"}


def write_outputs(res: AnalysisResult, out_dir: Path, store_root: str | Path | None = None, report: bool = True) -> list[Path]:
    """Parquet tables, PNG plots and the HTML report under out_dir; returns the files."""
    from tracking.analysis import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []

    def put(name: str, data: bytes | pd.DataFrame) -> None:
        p = out_dir / name
        if isinstance(data, pd.DataFrame):
            data.to_parquet(p, index=False)
        else:
            p.write_bytes(data)
        files.append(p)

    acc = res.inconsistency.set_index("cell")["accuracy"]
    put("inconsistency.parquet", res.inconsistency)
    put("rwr.parquet", rwr_long(res.groups))
    put("per_error_rwr.parquet", per_error_long(res.groups))
    keep = ["experiment", "cell", "qid", "retriever", "reader", "model", "prediction", "em", "f1", "error_type",
            *an.ERROR_INDICATORS, "correct", "fail"]
    put("decomposition.parquet", res.decomposition[[c for c in keep if c in res.decomposition.columns]])
    put("error_shares.parquet", res.shares)
    put("identity.parquet", res.identity)
    if not res.paired.empty:
        put("paired.parquet", res.paired)
    for name, t in res.tables.items():
        put(f"{name}.parquet", t)
    pngs = {}
    comparable = [g for g in res.groups if g.comparable]
    if comparable:  # one panel per (reader, model) group, axes labelled by retriever (the panel names the group)
        pngs["rwr_heatmap.png"] = plots.rwr_heatmaps(
            [(g.label, _by_retriever(g, g.rwr), acc.loc[g.cells].set_axis(g.retrievers))
             for g in comparable if g.rwr is not None],
            f"{res.experiment}: RWR(i→j) within each reader and model, retrievers by accuracy")
        for e in PER_ERRORS:
            pngs[f"rwr_{e}.png"] = plots.rwr_heatmaps(
                [(g.label, _by_retriever(g, g.per_error_rwr[e]), None) for g in comparable],
                f"{res.experiment}: RWR for error {ERROR_LABELS.get(e, e)} (share of i's {e} that j avoids)")
    pngs["error_shares.png"] = plots.error_share_bars(res.shares, res.cells)
    for name, png in pngs.items():
        put(name, png)
    res.pngs = pngs
    if report:
        files.append(_put_report(res, out_dir, store_root))
    return files


def _by_retriever(g: an.RetrieverGroup, matrix: pd.DataFrame) -> pd.DataFrame:
    return matrix.set_axis(g.retrievers, axis=0).set_axis(g.retrievers, axis=1)


def _put_report(res: AnalysisResult, out_dir: Path, store_root: str | Path | None) -> Path:
    from tracking.analysis.report import html_report

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
    outcomes = ledger.outcomes(experiment, execution)
    outcomes = outcomes[~ensemble_rows(outcomes)]
    res = compute(outcomes, experiment, metric, n_resamples, seed)
    base = Path(out_dir) if out_dir else StoreLayout.of(store_root).analysis(experiment)
    files = write_outputs(res, base, store_root, report=False)
    if across:
        files += _write_across(res, store_root, [experiment, *across], metric, base)
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
        if res.eor:
            files += _write_eor(res, base)
    files.append(_put_report(res, base, store_root))
    res.files = files
    if log_mlflow and execution is not None:
        log_analysis(res, res.files, execution, base, ANALYSIS_VERSION)
    return res


def _write_across(res: AnalysisResult, store_root: str | Path, experiments: list[str], metric: str, base: Path) -> list[Path]:
    """accuracy_across.parquet and its figure (also among the report's plots): tracking/analysis/across.py."""
    from tracking.analysis import plots
    from tracking.analysis.across import accuracy_across

    table = accuracy_across(store_root, experiments, metric)
    png = plots.accuracy_across(table, experiments, metric)
    res.pngs["accuracy_across.png"] = png
    table.to_parquet(base / "accuracy_across.parquet", index=False)
    (base / "accuracy_across.png").write_bytes(png)
    return [base / "accuracy_across.parquet", base / "accuracy_across.png"]


def _write_eor(res: AnalysisResult, base: Path) -> list[Path]:
    """eor_weights.parquet and its figure (also among the report's plots), and eor.json."""
    from tracking.analysis import plots

    info, out = res.eor, []
    if info.get("weights_table"):
        weights = pd.DataFrame(info["weights_table"])
        p = base / "eor_weights.parquet"
        weights.to_parquet(p, index=False)
        png = plots.eor_weights(weights)
        res.pngs["eor_weights.png"] = png
        (base / "eor_weights.png").write_bytes(png)
        out += [p, base / "eor_weights.png"]
    p = base / "eor.json"
    p.write_text(json.dumps({k: v for k, v in info.items() if k not in ("weights_table", "train_qids", "test_qids")},
                            indent=2, default=str))
    out.append(p)
    return out


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
            "groups": [{"reader": g.reader, "model": g.model, "label": g.label, "cells": g.cells,
                        "retrievers": g.retrievers, "comparable": g.comparable} for g in res.groups],
            "inconsistency": res.inconsistency.to_dict("records"), "shares": res.shares.to_dict("records"),
            "identity": res.identity.to_dict("records"), "eor": res.eor,
            "tables": {name: {"title": ANALYSES[name].title, "rows": t.to_dict("records")} for name, t in res.tables.items()}}
