"""A first run's start-up work, begun before Prefect is up, so the first model calls leave within seconds.

`ragledger run` needs Prefect's temporary API server (seconds to start) and Prefect's imports before its flow can
run a task. Meanwhile a warm-up thread does what the flow's first tasks would: it loads the dataset and the corpus,
starts the JVM, retrieves shard after shard, and, for an endpoint that is already up (OpenAI, a vLLM server,
`--base-url`), sends each shard's round-1 calls. The flow finds it done: a retrieve task takes its shard's hits
(tasks/retrieve.py `take_prefetched`), and a generate task's calls take over the answers of the same calls sent early
(engines/llm.py `LLMClient.send_early`), counted as that task's own calls. Nothing here imports Prefect.

The warm-up retrieves in the flow's order (shard by shard, each retriever's in turn) and stops when the flow starts
executing its plan (`stop`), after the shard it is on; the flow retrieves the rest. With the embedded model (its
server starts inside the flow) it sends no call and prepares the first shard only. Only what the flow will do is
done: nothing for a stage whose result Prefect already holds (a cached rerun starts no JVM), nothing for a retriever
that calls the model or a spec with the closed-book filter (its shards are known only after the filter's model
calls), and nothing with the Dask runner (its workers are other processes). Any failure is left for the flow to meet
and report.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.spec import AnySpec, ExperimentSpec
from tracking.store.catalog import segment_exists

if TYPE_CHECKING:
    import pandas as pd

    from engines.llm import LLMClient
    from flows.plan import ExperimentPlan
    from strategies.retrievers import Hit, Retriever
    from tasks.stages import RetrieveStage

log = logging.getLogger(__name__)

_started_at: float | None = None  # time.perf_counter() when this process's warm-up began
# set once the first shard's calls are sent (or the warm-up ended without): `ragledger run` starts Prefect's server
# and imports Prefect only then, so the first calls do not share 2 cores and the GIL with them
first_calls_sent = threading.Event()
FIRST_QUESTIONS = 16  # of the first shard, retrieved and sent before the rest of it


def take_started_at() -> float | None:
    """When the warm-up of this run began (once; None without one): the run's work started then, not with the flow."""
    global _started_at
    started, _started_at = _started_at, None
    return started


def stop() -> None:
    """The flow executes its plan: the warm-up claims no further shard and ends after the one it is on."""
    from tasks.prefetch import close_prefetch

    close_prefetch()


def warm_up(spec: AnySpec, store_root: str, runner: str | None, base_url: str | None = None) -> threading.Thread | None:
    """Start the warm-up of a thread-runner experiment in a background thread; returns at once (the thread, or None
    when there is nothing to warm up)."""
    global _started_at
    if not isinstance(spec, ExperimentSpec) or spec.dataset.closed_book_filter:
        return None
    if (runner or spec.execution.runner) != "thread" or spec.execution.scheduler_address:
        return None
    from tasks.prefetch import open_prefetch

    _started_at = time.perf_counter()
    first_calls_sent.clear()
    open_prefetch()
    thread = threading.Thread(target=_warm_up, args=(spec, store_root, base_url), name="ragledger-warm-up", daemon=True)
    thread.start()
    return thread


def _warm_up(spec: ExperimentSpec, store_root: str, base_url: str | None) -> None:
    try:
        url = _early_url(spec, base_url)
        if url is not None:  # the first calls go to a model-call process: it imports while the rest starts
            from engines.llm import start_first_call_process

            start_first_call_process()
        first_in_store = _start_engines_of_a_first_run(spec, store_root)
        _prepare_shards(spec, store_root, url, first_in_store)
    except Exception as exc:  # the flow does the same work and reports what fails, with its context
        log.debug("warm-up stopped: %s", exc)
    finally:
        first_calls_sent.set()


def sends_early_calls(spec: AnySpec, base_url: str | None) -> bool:
    """Whether the warm-up of this run sends calls (its endpoint is up before the flow: not the embedded server)."""
    return isinstance(spec, ExperimentSpec) and _early_url(spec, base_url) is not None


def _early_url(spec: ExperimentSpec, base_url: str | None) -> str | None:
    """The endpoint the flow's generate tasks will call, when it is up already (not the embedded server)."""
    if base_url is not None:
        return base_url
    return spec.model.base_url if spec.model.backend != "embedded" and spec.model.base_url else None


def _start_engines_of_a_first_run(spec: ExperimentSpec, store_root: str) -> bool:
    """Whether this is the first run of the experiment in this store, whose search engines then start now, before
    anything else the warm-up does (the stages' imports, the model-call process, the dataset, the plan: ~1 s on 2
    cores), since its first retrieval waits for them. Otherwise they start once the plan says which retrievals are
    still to be made."""
    from core.paths import StoreLayout
    from engines import java
    from strategies.retrievers import parse_retriever

    # this process searches the run's questions once per retriever, then exits: the JVM's compiler is chosen for that
    limit = spec.dataset.limit
    java.expect_queries(limit * len(spec.retrievers) if limit else None)
    first_in_store = not StoreLayout.of(store_root).records("questions", spec.name).exists()
    if first_in_store:
        _start_engines([name for name in spec.retrievers if not parse_retriever(name).needs_llm])
    return first_in_store


def _prepare_shards(spec: ExperimentSpec, store_root: str, url: str | None, first_in_store: bool) -> None:
    from tasks.context import llm_client_for

    client = llm_client_for(spec, url, store_root) if url else None
    if client is None:
        _retrieve_shards(spec, store_root, None, first_in_store)
        return
    # one model-call process for the first calls, the others once those have left (_retrieve_shards): on 2 cores
    # their imports would share the CPU with the JVM's start and the first retrieval, which the first calls wait for
    client.start_call_processes(at_most=1)
    try:
        _retrieve_shards(spec, store_root, client, first_in_store)
    finally:  # whatever stopped the warm-up, every model-call process takes calls again
        client.start_call_processes()


def _retrieve_shards(spec: ExperimentSpec, store_root: str, client: LLMClient | None, first_in_store: bool) -> None:
    import pandas as pd

    from flows.plan import plan, question_rows
    from tasks.context import retriever_for
    from tasks.prefetch import claim_prefetch

    sampled = spec.dataset.sampled_questions()
    questions = pd.DataFrame(question_rows(spec, sampled))
    the_plan = plan(spec, sampled, store_root=store_root)
    persisted = _persisted_check(the_plan)
    if not first_in_store:
        opening = [the_plan.retrieves[(name, the_plan.shards[0].id)] for name in spec.retrievers] if the_plan.shards else []
        _start_engines([s.retriever for s in opening if not s.calls_model and not persisted(s.key)])
    for shard in the_plan.shards if client is not None else the_plan.shards[:1]:
        for name in spec.retrievers:
            stage = the_plan.retrieves[(name, shard.id)]
            if stage.calls_model or persisted(stage.key):
                continue
            prefetched = claim_prefetch(stage)
            if prefetched is None:  # the flow has started: it retrieves the rest itself
                return
            hits: dict = {}
            try:
                retriever = retriever_for(spec, name, store_root)
                # the very first calls wait only for a few questions' retrieval, not the whole shard's (where the
                # hits are the same either way), and the next few follow before the rest of the shard is retrieved
                first = FIRST_QUESTIONS if shard is the_plan.shards[0] and retriever.per_query else len(stage.qids)
                n = len(stage.qids)
                cuts = sorted({0, min(first, n), min(4 * first, n), n})
                for a, b in itertools.pairwise(cuts):  # distinct cuts: no part is empty
                    hits.update(_retrieve_and_send(spec, the_plan, stage, shard.id, retriever, questions,
                                                    stage.qids[a:b], client, persisted))
                    if client is not None:  # the first calls left: the other model-call processes now
                        client.start_call_processes()
            except BaseException as exc:  # the retrieve task waiting on it retrieves itself
                prefetched.set_exception(exc)
                raise
            prefetched.set_result(hits)
            first_calls_sent.set()


def _persisted_check(the_plan: ExperimentPlan) -> Callable[[str], bool]:
    """Whether the flow will take a stage's result from Prefect's persisted results: one file per cache key, in the
    folder ragledger/prefect_env.py sets (asking Prefect itself would import it and start its own ephemeral server,
    the API not being up yet). Those files outlive a deleted store, but the flow runs again every stage whose segment
    is gone (flows/pipeline.py): with the run's questions segment gone too, none of them counts."""
    results = Path(os.environ["PREFECT_LOCAL_STORAGE_PATH"])
    stored = segment_exists(the_plan.questions_segment)
    return lambda key: stored and (results / key).exists()


def _start_engines(names: list[str]) -> None:
    """Start the search engines of these retrievers (BM25: the JVM and Anserini's classes, ~1 s, mostly outside the
    GIL) in a thread, while this one opens the retrievers (the corpus by its kept hash, its index from disk) and retrieves."""
    from strategies.retrievers import parse_retriever

    def start() -> None:
        for name in names:
            try:
                parse_retriever(name).start_engine()
            except Exception as exc:  # the retrieval meets the failure again and reports it
                log.debug("search engine of %s not started ahead: %s", name, exc)

    if names:
        threading.Thread(target=start, name="ragledger-search-engines", daemon=True).start()


def _retrieve_and_send(spec: ExperimentSpec, the_plan: ExperimentPlan, stage: RetrieveStage, shard_id: str,
                       retriever: Retriever, questions: pd.DataFrame, qids: list[str], client: LLMClient | None,
                       persisted: Callable[[str], bool]) -> dict[str, list[Hit]]:
    """Retrieve `qids` of a retrieve stage and send their round-1 calls of every cell on that retriever."""
    import pandas as pd

    from schemas.records import columns_of
    from tasks.generate import plan_round
    from tasks.retrieve import queries_of, retrieval_rows

    part = questions[questions["qid"].isin(qids)]
    hits = retriever.retrieve(queries_of(part.to_dict("records")))
    if client is None:
        return hits
    retrievals = pd.DataFrame(retrieval_rows(spec.name, retriever, stage.key, hits), columns=columns_of("retrievals"))
    for cell in the_plan.cells_of(stage.retriever):
        first_round = the_plan.generates[(cell, shard_id)][0]
        if not persisted(first_round.key):
            calls = plan_round(spec, first_round, the_plan.store_root, part, retrievals, {})
            client.send_early([req for *_, req in calls.calls], calls.rounds_after)
    return hits
