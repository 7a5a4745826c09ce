"""The Prefect tasks of the pipeline's stages: each stage's pure function (tasks/), its result persisted and cached
under the stage's own key (`Stage.key`: a hash of small inputs chained from upstream), never of live objects.

Kept apart from tasks/ so that planning and running a stage imports no Prefect: a run's head start (flows/head_start.py)
plans and sends the first calls while Prefect is still being imported and its server started.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

from prefect import task

from core import progress
from tasks.closed_book_filter import run_closed_book_filter
from tasks.evaluate import run_evaluate
from tasks.generate import run_generate_round
from tasks.retrieve import run_retrieve
from tasks.stages import EvaluateStage, FilterStage, GenerateStage, RetrieveStage, Stage, VoteStage
from tasks.vote import run_vote


def stage_task(stage: type[Stage], fn: Callable[..., Any]):
    @functools.wraps(fn)  # Prefect reads the stage function's own signature through it
    def reporting(*args: Any, **kwargs: Any) -> Any:
        run = kwargs["run"] if "run" in kwargs else args[0]
        with progress_to_run(run.run_token):
            return fn(*args, **kwargs)

    return task(name=stage.task_name, cache_key_fn=lambda ctx, params: params["stage"].key,
                persist_result=True)(reporting)


def progress_topic(run_token: str) -> str:
    """The Dask event topic a run's tasks send their progress on; the run's process subscribes to it
    (flows/dask_workers.py `progress_from_workers`)."""
    return f"ragledger-progress-{run_token}"


def progress_to_run(run_token: str) -> contextlib.AbstractContextManager[None]:
    """On a Dask worker: the task's progress reports sent to its run's process through the scheduler (the one
    endpoint a worker on another host shares with it), as Dask events. Elsewhere (the run's own process, whose
    listener takes them): nothing. A process that never imported Dask is not a worker: the check imports nothing."""
    if "distributed" not in sys.modules:
        return contextlib.nullcontext()
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:  # not in a worker's task
        return contextlib.nullcontext()
    topic = progress_topic(run_token)
    return progress.relayed(lambda report: worker.log_event(topic, report))


closed_book_filter_task = stage_task(FilterStage, run_closed_book_filter)
retrieve_task = stage_task(RetrieveStage, run_retrieve)
generate_round_task = stage_task(GenerateStage, run_generate_round)
vote_task = stage_task(VoteStage, run_vote)
evaluate_task = stage_task(EvaluateStage, run_evaluate)
