"""The Prefect tasks of the pipeline's stages: each stage's pure function (tasks/), its result persisted and cached
under the stage's own key (`Stage.key`: a hash of small inputs chained from upstream), never of live objects.

Kept apart from tasks/ so that planning and running a stage imports no Prefect: a run's head start (flows/head_start.py)
plans and sends the first calls while Prefect is still being imported and its server started.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import task

from tasks.closed_book_filter import run_closed_book_filter
from tasks.evaluate import run_evaluate
from tasks.generate import run_generate_round
from tasks.retrieve import run_retrieve
from tasks.stages import EvaluateStage, FilterStage, GenerateStage, RetrieveStage, Stage, VoteStage
from tasks.vote import run_vote


def stage_task(stage: type[Stage], fn: Callable[..., Any]):
    return task(name=stage.task_name, cache_key_fn=lambda ctx, params: params["stage"].key, persist_result=True)(fn)


closed_book_filter_task = stage_task(FilterStage, run_closed_book_filter)
retrieve_task = stage_task(RetrieveStage, run_retrieve)
generate_round_task = stage_task(GenerateStage, run_generate_round)
vote_task = stage_task(VoteStage, run_vote)
evaluate_task = stage_task(EvaluateStage, run_evaluate)
