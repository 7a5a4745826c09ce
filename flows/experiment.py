"""The scheduled flow a `ragledger schedule` deployment serves: it runs a spec as an experiment or, for a list of
datasets, as a sweep (flows/sweep.py). The experiment flow itself is flows/execute.py's, run from the plan of
flows/plan.py.

This module sits above both flows, so neither imports it: flows/sweep.py runs its experiments through
flows/execute.py.
"""

from __future__ import annotations

from prefect import flow

from flows.plan import FLOW_VERSION
from flows.sweep import run_spec
from schemas.spec import parse_spec


@flow(name="ragledger-scheduled", version=FLOW_VERSION)
def scheduled_experiment(spec_dict: dict, store_root: str, tracking_uri: str, runner: str | None = None,
                         workers: int | None = None) -> dict:
    """What a `ragledger schedule` deployment runs: the experiment (or, for a list of datasets, the sweep) as a
    subflow, on the runner asked for (a deployment re-imports its flow by entrypoint, so the task runner is
    chosen here, at run time), into the store at `store_root`: a folder, or an s3:// URL, read and written through
    this machine's mirror of it, brought up to date at each run (tracking/store/remote.py)."""
    from tracking.store.remote import local_root, pushed

    root = local_root(store_root, "--store", creating=True)
    with pushed(root):
        return run_spec(parse_spec(spec_dict), root, tracking_uri=tracking_uri, runner=runner, workers=workers)
