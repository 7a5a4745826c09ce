"""An analysis of an execution (flows/analyze.py) logged on the execution's MLflow parent run."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tracking.analysis.inconsistency import AnalysisError, AnalysisResult
from tracking.mlflow.log import MlflowLogger


def _mlflow_key(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", s)


def parent_run(execution: dict) -> tuple[str, str]:
    """The MLflow parent run id and tracking URI of a logged execution (its run manifest's)."""
    summary = execution.get("summary", {})
    run_id, uri = summary.get("mlflow_parent_run_id"), summary.get("tracking_uri")
    if not run_id or not uri:
        raise AnalysisError(f"{execution.get('manifest_path')}: manifest has no MLflow parent run id / tracking uri "
                            "(`ragledger sync` logs a pending execution; --no-mlflow analyses without MLflow)")
    return run_id, uri


def log_analysis(res: AnalysisResult, files: list[Path], execution: dict, base: Path, version: str) -> None:
    """An analysis on its execution's MLflow parent run: its files under analysis/, the metrics of every analysis of
    the registry (NaN, a retriever alone in its group, dropped), and the analysis version (`version`) and EoR pooling as tags."""
    run_id, uri = parent_run(execution)
    spec = execution.get("spec", {})
    logger = MlflowLogger(uri, (spec.get("tracking") or {}).get("mlflow_experiment") or res.experiment)
    by_dir: dict[str, list[Path]] = {}
    for f in dict.fromkeys(files):  # each file once, under analysis/<its sub-folder>
        rel = f.parent.relative_to(base).as_posix()
        by_dir.setdefault("analysis" if rel == "." else f"analysis/{rel}", []).append(f)
    for path, fs in by_dir.items():
        logger.log_artifacts(run_id, fs, path)
    metrics = {"analysis.questions": float(res.questions)}
    for out in res.outputs.values():  # every analysis of the registry's (tracking/analysis/registry.py)
        metrics.update({_mlflow_key(k): v for k, v in out.metrics.items()})
    tags = {"ragledger.analysis_version": version}
    if res.eor.get("pooling"):  # the analysis.eor_* metrics are under this pooling (tracking/analysis/eor.py)
        tags["ragledger.eor_pooling"] = str(res.eor["pooling"])
    logger.log(run_id, metrics={k: v for k, v in metrics.items() if v is not None and np.isfinite(v)}, tags=tags)
    res.parent_run_id, res.tracking_uri = run_id, uri
