"""The sweep flow: a spec whose `dataset` is a list runs as one experiment per dataset (`SweepSpec.expand`),
each an ordinary experiment subflow with its own store records, caches and MLflow parent run, all in one
MLflow experiment. The experiments run in sequence and share one model endpoint (the embedded server starts
at most once per sweep, and only when some task must call the model)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from core import progress
from flows.endpoint import shared_endpoint
from flows.execute import run_experiment
from flows.head_start import HeadStart
from flows.plan import FLOW_VERSION
from flows.runners import without_default_heartbeats
from schemas.spec import AnySpec, SweepSpec
from tracking.mlflow.sync import MlflowLoggingPending

# the run-summary counters a sweep adds up over its experiments
TOTALS = ("llm_calls", "cache_hits", "retries", "tasks_total", "tasks_from_cache", "prompt_tokens_sent")


@dataclass
class SweepSummary:
    sweep: str
    experiments: list[dict[str, Any]] = field(default_factory=list)  # each experiment's RunSummary, in list order
    llm_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    tasks_total: int = 0
    tasks_from_cache: int = 0
    prompt_tokens_sent: int = 0
    prompt_tokens_evaluated: int | None = None  # the embedded server's own count; None for other backends
    wall_time_s: float = 0.0
    tracking_uri: str = ""
    mlflow_experiment_id: str | None = None
    flow_run_id: str | None = None


@flow(name="ragledger-sweep", version=FLOW_VERSION)
def sweep_flow(spec: SweepSpec, store_root: str, tracking_uri: str | None = None, base_url: str | None = None,
               runner: str | None = None, workers: int | None = None, scheduler_address: str | None = None) -> dict:
    started = time.perf_counter()
    experiments = spec.expand()
    summary = SweepSummary(spec.name, flow_run_id=str(flow_run.id) if flow_run.id else None)
    progress.set_total("experiments", len(experiments))
    with shared_endpoint(spec, base_url):
        for experiment in experiments:
            result = run_experiment(experiment, store_root, base_url=base_url, tracking_uri=tracking_uri,
                                    runner=runner, workers=workers, scheduler_address=scheduler_address)
            summary.experiments.append(result)
            progress.advance("experiments", 1)
    for key in TOTALS:
        setattr(summary, key, sum(r[key] for r in summary.experiments))
    evaluated = [r["prompt_tokens_evaluated"] for r in summary.experiments]
    summary.prompt_tokens_evaluated = None if None in evaluated else sum(evaluated)
    summary.tracking_uri = summary.experiments[0]["tracking_uri"]
    summary.mlflow_experiment_id = summary.experiments[0]["mlflow_experiment_id"]  # one MLflow experiment for all
    summary.wall_time_s = round(time.perf_counter() - started, 2)
    return asdict(summary)


def run_spec(spec: AnySpec, store_root: str, base_url: str | None = None, tracking_uri: str | None = None,
             runner: str | None = None, workers: int | None = None, scheduler_address: str | None = None,
             head_start: HeadStart | None = None) -> dict:
    """A spec with one dataset runs as an experiment (its RunSummary); with a list of datasets, as a sweep
    (a SweepSummary, whose `experiments` holds each RunSummary). Raises MlflowLoggingPending (its `summary` the
    summary) when MLflow did not take some experiment's logging: every experiment ran and stored its events.
    `head_start`: an experiment's, begun before Prefect was up (flows/head_start.py)."""
    if isinstance(spec, SweepSpec):
        with without_default_heartbeats():
            summary = sweep_flow(spec, store_root, tracking_uri, base_url, runner, workers, scheduler_address)
    else:
        summary = run_experiment(spec, store_root, base_url=base_url, tracking_uri=tracking_uri, runner=runner,
                                 workers=workers, scheduler_address=scheduler_address, head_start=head_start)
    experiments = summary.get("experiments", [summary])
    pending = [e["mlflow_pending"] for e in experiments if e.get("mlflow_pending")]
    if pending:
        # an error, not a warning (exit 2): what the user sees in MLflow is incomplete until the sync
        more = f" ({len(pending)} of the sweep's {len(experiments)} experiments)" if "experiments" in summary else ""
        error = MlflowLoggingPending(pending[0] + more)
        error.summary = summary  # type: ignore[attr-defined]
        raise error
    return summary
