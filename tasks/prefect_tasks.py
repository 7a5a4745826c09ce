"""The Prefect tasks of the pipeline's stages: each stage's function (tasks/stage_runs.py `stage_functions`) as a task
runs it (`stage_body`), its result persisted and cached by Prefect under the stage's own key (`Stage.key`: a hash of
small inputs chained from upstream), never of live objects.

Kept apart from tasks/ so that planning and running a stage imports no Prefect: a run's head start (flows/head_start.py)
plans and sends the first calls while Prefect is still being imported and its server started, and a run without
Prefect's flow (flows/direct.py) runs the same stage bodies on a plain thread pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import task

from tasks.stage_runs import stage_body, stage_functions
from tasks.stages import Stage


def stage_task(stage: type[Stage], fn: Callable[..., Any]):
    return task(name=stage.task_name, cache_key_fn=lambda ctx, params: params["stage"].key,
                persist_result=True)(stage_body(fn))


STAGE_TASKS = {name: stage_task(stage, fn) for name, (stage, fn) in stage_functions().items()}
closed_book_filter_task = STAGE_TASKS["closed_book_filter"]
retrieve_task = STAGE_TASKS["retrieve"]
generate_round_task = STAGE_TASKS["generate_round"]
vote_task = STAGE_TASKS["vote"]
evaluate_task = STAGE_TASKS["evaluate"]
