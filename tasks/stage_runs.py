"""A stage task's body wherever it runs (a thread of the run's process, or a Dask worker), and the results of the
stages run before, kept in the store under each stage's key.

A stage's key hashes everything that determines its records (tasks/stages.py), so a result kept under it answers
any later run that plans the same stage, as long as its segment is still in the store: the task then returns the
kept result without running. The results are kept under the store's projections
(`<store>/projections/stages/<key>.json`, core/paths.py `StoreLayout.stage_result`): deleting them only makes the
stages run again, finding their records and model calls in the store. A run in Prefect's flow meets Prefect's own
result cache first (tasks/prefect_tasks.py); a run without Prefect (flows/direct.py) only these.

Nothing here imports Prefect."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import progress
from core.paths import StoreLayout
from tasks.stages import RunContext, Stage, StageResult

log = logging.getLogger(__name__)


def kept_result(run: RunContext, stage: Stage) -> StageResult | None:
    """The result kept under the stage's key whose segment is still in the store, or None."""
    try:
        data = json.loads(StoreLayout.of(run.store_root).stage_result(stage.key).read_text())
        result = StageResult(**data)
    except (OSError, ValueError, TypeError):  # none kept, or unreadable, or of another StageResult's shape
        return None
    return result if result.segment_exists() else None


def is_kept(run: RunContext, stage: Stage) -> bool:
    """Whether the stage's task will take a kept result instead of running."""
    return kept_result(run, stage) is not None


def keep_result(run: RunContext, stage: Stage, result: StageResult) -> None:
    """Keep `result` under the stage's key. An optimisation: a failure to write it is left to the store's next
    write to report (a full disk)."""
    from core.diskfull import write_text_atomically

    try:
        write_text_atomically(StoreLayout.of(run.store_root).stage_result(stage.key),
                              json.dumps(dataclasses.asdict(result)))
    except OSError as exc:
        log.debug("stage result %s not kept: %s", stage.key, exc)


def stage_body(fn: Callable[..., StageResult]) -> Callable[..., StageResult]:
    """`fn` (a stage's function, taking `run` and `stage`) as a task runs it: a result kept under the stage's key
    answers at once; else the stage runs and its result is kept. Its progress reaches the run's process; on a
    machine with a mirror of its own of a store at a URL (a Dask worker), the stage is worked in that mirror, the
    calls it made put in the bucket, and its segment named as the run's process names it (tasks/stages.py
    `RunContext.on_this_machine`)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)  # Prefect reads the stage function's own signature through it
    def on_this_machine(*args: Any, **kwargs: Any) -> StageResult:
        given = signature.bind(*args, **kwargs)
        run: RunContext = given.arguments["run"]
        stage: Stage = given.arguments["stage"]
        with progress_to_run(run.run_token):
            here = run.on_this_machine()
            if here is run:
                kept = kept_result(run, stage)
                if kept is not None:
                    return kept
                result = fn(*args, **kwargs)
                keep_result(run, stage, result)
                return result
            given.arguments["run"] = here
            result = fn(*given.args, **given.kwargs)
            if result.counters.get("llm_calls"):  # a task that called the model (a pack scans the whole cache)
                from tracking.store.remote import share_calls

                share_calls(Path(here.store_root))
            return result.named_under(run.store_root)

    return on_this_machine


def stage_functions() -> dict[str, tuple[type[Stage], Callable[..., StageResult]]]:
    """Each stage's function, by the name of its task in flows/executor.py `StageTasks`: the one list both runners
    take their tasks from (tasks/prefect_tasks.py, flows/direct.py)."""
    from tasks.closed_book_filter import run_closed_book_filter
    from tasks.evaluate import run_evaluate
    from tasks.generate import run_generate_round
    from tasks.retrieve import run_retrieve
    from tasks.stages import EvaluateStage, FilterStage, GenerateStage, RetrieveStage, VoteStage
    from tasks.vote import run_vote

    return {"closed_book_filter": (FilterStage, run_closed_book_filter), "retrieve": (RetrieveStage, run_retrieve),
            "generate_round": (GenerateStage, run_generate_round), "vote": (VoteStage, run_vote),
            "evaluate": (EvaluateStage, run_evaluate)}


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
