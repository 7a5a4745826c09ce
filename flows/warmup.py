"""A first run's start-up work, done while Prefect's temporary server starts.

`ragledger run` waits seconds for the Prefect API (ragledger/prefect_server.py `prefect_api` runs this meanwhile,
in the command's own process). The flow would then load the dataset and the corpus, start the JVM, open each
retriever's index and retrieve its first shard before the first model call could leave. Done here instead, the
flow finds all of it ready: the corpus and retrievers are memoised per process (tasks/context.py) and the first
shards' hits are handed to their retrieve tasks (tasks/retrieve.py `prefetch`).

Only what the flow will do is done: nothing for a retrieve stage whose result Prefect already holds (a cached rerun
starts no JVM), nothing for a retriever that calls the model (its endpoint is not up yet) or a spec with the
closed-book filter (its shards are known only after the filter's model calls), and nothing with the Dask runner
(its workers are other processes). Any failure is left for the flow to meet and report.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from schemas.spec import AnySpec, ExperimentSpec

log = logging.getLogger(__name__)


def warm_up(spec: AnySpec, store_root: str, runner: str | None) -> None:
    """Prepare the first retrievals of a thread-runner experiment; never raises (the flow reports failures)."""
    if not isinstance(spec, ExperimentSpec) or spec.dataset.closed_book_filter:
        return
    if (runner or spec.execution.runner) != "thread" or spec.execution.scheduler_address:
        return
    try:
        _prefetch_first_shards(spec, store_root)
    except Exception as exc:  # the flow does the same work and reports what fails, with its context
        log.debug("warm-up skipped: %s", exc)


def _prefetch_first_shards(spec: ExperimentSpec, store_root: str) -> None:
    from flows.plan import plan, question_rows
    from tasks.context import retriever_for
    from tasks.retrieve import prefetch, queries_of

    questions = spec.dataset.sampled_questions()
    the_plan = plan(spec, questions, store_root=store_root)
    # Prefect's persisted task results, one file per cache key (ragledger/prefect_env.py sets the folder); asking
    # Prefect itself would start its own ephemeral server, the API not being up yet
    results = Path(os.environ["PREFECT_LOCAL_STORAGE_PATH"])
    rows = {r["qid"]: r for r in question_rows(spec, questions)}
    for stage in the_plan.first_retrievals():
        if stage.calls_model or (results / stage.key).exists():
            continue
        retriever = retriever_for(spec, stage.retriever, store_root)
        prefetch(stage, retriever.retrieve(queries_of(rows[q] for q in stage.qids)))
