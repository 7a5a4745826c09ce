"""The experiment's entry points: the experiment flow (run by flows/execute.py from the plan of flows/plan.py), the
runner choice, and the scheduled flow a `ragledger schedule` deployment serves, which runs a spec as an experiment
or, for a list of datasets, as a sweep (flows/sweep.py).

This module sits above both flows, so neither imports it: flows/sweep.py runs its experiments through
flows/execute.py.
"""

from __future__ import annotations

from prefect import flow

from flows.execute import experiment_flow, run_experiment
from flows.executor import recall_curve_files
from flows.plan import FLOW_VERSION, question_rows, shard
from flows.recording import log_to_mlflow
from flows.run_summary import RunSummary
from flows.runners import HEARTBEAT_SETTINGS, task_runner_for, without_default_heartbeats
from flows.sweep import run_spec

__all__ = ["FLOW_VERSION", "HEARTBEAT_SETTINGS", "RunSummary", "experiment_flow", "log_to_mlflow", "question_rows",
           "recall_curve_files", "run_experiment", "scheduled_experiment", "shard", "task_runner_for",
           "without_default_heartbeats"]


@flow(name="ragledger-scheduled", version=FLOW_VERSION)
def scheduled_experiment(spec_dict: dict, store_root: str, tracking_uri: str, runner: str | None = None,
                         workers: int | None = None) -> dict:
    """What a `ragledger schedule` deployment runs: the experiment (or, for a list of datasets, the sweep) as a
    subflow, on the runner asked for (a deployment re-imports its flow by entrypoint, so the task runner is
    chosen here, at run time)."""
    return run_spec(spec_dict, store_root, tracking_uri=tracking_uri, runner=runner, workers=workers)
