"""The Prefect tasks of the pipeline's stages: each stage's pure function (tasks/), its result persisted and cached
under the stage's own key (`Stage.key`: a hash of small inputs chained from upstream), never of live objects.

Kept apart from tasks/ so that planning and running a stage imports no Prefect: a run's head start (flows/head_start.py)
plans and sends the first calls while Prefect is still being imported and its server started.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import task

from core import progress
from tasks.closed_book_filter import run_closed_book_filter
from tasks.evaluate import run_evaluate
from tasks.generate import run_generate_round
from tasks.retrieve import run_retrieve
from tasks.stages import (
    EvaluateStage,
    FilterStage,
    GenerateStage,
    RetrieveStage,
    RunContext,
    Stage,
    StageResult,
    VoteStage,
)
from tasks.vote import run_vote


def stage_task(stage: type[Stage], fn: Callable[..., Any]):
    signature = inspect.signature(fn)

    @functools.wraps(fn)  # Prefect reads the stage function's own signature through it
    def on_this_machine(*args: Any, **kwargs: Any) -> StageResult:
        """The stage where the task runs: its progress to the run's process; on a machine with a mirror of its own
        of a store at a URL (a Dask worker), the stage worked in that mirror, the calls it made put in the bucket,
        and its segment named as the run's process names it (tasks/stages.py `RunContext.on_this_machine`)."""
        given = signature.bind(*args, **kwargs)
        run: RunContext = given.arguments["run"]
        with progress_to_run(run.run_token):
            here = run.on_this_machine()
            if here is run:
                return fn(*args, **kwargs)
            given.arguments["run"] = here
            result = fn(*given.args, **given.kwargs)
            if result.counters.get("llm_calls"):  # a task that called the model (a pack scans the whole cache)
                from tracking.store.remote import share_calls

                share_calls(Path(here.store_root))
            return result.named_under(run.store_root)

    return task(name=stage.task_name, cache_key_fn=lambda ctx, params: params["stage"].key,
                persist_result=True)(on_this_machine)


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
