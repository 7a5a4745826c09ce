"""A run's head start: its first stage tasks begun before Prefect is up, so the first model calls leave within seconds.

A run through Prefect's flow (`ragledger run --foreground`, the Python API; flows/launch.py) needs Prefect's
temporary API server (seconds to start) and Prefect's imports before its flow can run a task. Meanwhile a head
start, in a thread, does what the flow would do first, with the flow's own functions: it plans the run
(flows/prepare.py `plan_run`: the questions sampled, the plan; a rerun comes planned already, by flows/launch.py
asking the store for a cached answer), then retrieves the plan's retrieve stages in the plan's order
(`ExperimentPlan.retrieval_order`) with the retrieve stage's function (tasks/retrieve.py `retrieve_rows`); for an
endpoint that is already up (OpenAI, a vLLM server, `--base-url`) each part of a shard, once retrieved, has its
round-1 calls planned by the generate stage (tasks/generate.py `plan_round`) and sent (engines/llm.py
`HeadStartCalls`). It writes nothing: storing stays with the flow's tasks, beside the first calls.

The flow is handed the head start (flows/execute.py): it takes the planned run instead of planning it, and every
task of the run meets it through `RunContext.head_start` (tasks/stages.py `HeadStartView`): a retrieve task takes and
stores its stage's records, a generate task's client takes the calls sent early over as its own calls.

It stops when the flow starts executing its plan (`stop`), after the stage it is on. With the embedded model (its
server starts inside the flow) it sends no call and retrieves each retriever's first shard only. Only what the flow
will do is done: no stage whose result Prefect already holds (a cached rerun starts no JVM), no retriever that calls
the model; and there is no head start for a spec with the closed-book filter (its shards are known only after the
filter's model calls) or with the Dask runner (its workers are other processes). Any failure is left for the flow to
meet and report. Nothing here imports Prefect.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.paths import StoreLayout
from schemas.spec import AnySpec, ExperimentSpec
from tracking.store.catalog import segment_exists

if TYPE_CHECKING:
    import pandas as pd

    from engines.llm import HeadStartCalls, LLMClient
    from flows.prepare import PreparedRun
    from tasks.stages import RetrieveStage

log = logging.getLogger(__name__)

FIRST_QUESTIONS = 16  # of the first shard, retrieved and sent before the rest of it


class HeadStart:
    """One run's head start: its thread, what it prepared and retrieved, and the calls it sent early. Slots, not a
    __dict__: given to the flow as a parameter, it is left out of the flow run Prefect records (Prefect keeps
    "<HeadStart>" for a value its JSON encoder cannot take)."""

    __slots__ = (
        "_lock",
        "_open",
        "_planned",
        "_prepared",
        "_retrievals",
        "first_calls_sent",
        "head_start_calls",
        "spec",
        "started_at",
        "store_root",
        "thread",
        "url",
    )

    def __init__(self, spec: ExperimentSpec, store_root: str, base_url: str | None,
                 planned: PreparedRun | None = None) -> None:
        self.spec, self.store_root = spec, store_root
        self._planned = planned  # the run as planned before the head start began (flows/launch.py), if it was
        self.url = up_already(spec, base_url)  # the endpoint, when it is up before the flow: calls are sent early
        self.started_at = time.perf_counter()  # the run's work started here, not with the flow
        # set once the first shard's calls are sent (or the head start ended without): `ragledger run` starts
        # Prefect's server and imports Prefect only then, so the first calls do not share 2 cores and the GIL with them
        self.first_calls_sent = threading.Event()
        # made in the thread, before the run is planned and so before any task can meet it: the client's import here
        # would hold back the search engines' start
        self.head_start_calls: HeadStartCalls
        self._prepared: concurrent.futures.Future[PreparedRun] = concurrent.futures.Future()
        # stage key -> the records of a retrieve stage retrieved here, taken once by that stage's task. Claims are taken
        # only until `stop`, so a retrieve task either finds its stage claimed and waits for it, or retrieves it alone
        self._retrievals: dict[str, concurrent.futures.Future[list[dict[str, Any]]]] = {}
        self._open = True
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="ragledger-head-start", daemon=True)

    @classmethod
    def begin(cls, spec: AnySpec, store_root: str, runner: str | None, base_url: str | None = None,
              planned: PreparedRun | None = None) -> HeadStart | None:
        """The head start of a thread-runner experiment, begun in its thread; None when there is nothing to begin.
        `planned`: the run, when it was planned already (it is not planned again). When it sends calls, returns once
        the first ones left: Prefect's server and imports, which come next, would take half of 2 cores and the GIL
        from them."""
        if not isinstance(spec, ExperimentSpec) or spec.dataset.closed_book_filter:
            return None
        if spec.execution.runner_taken(runner) != "thread" or spec.execution.scheduler_address:
            return None
        head = cls(spec, store_root, base_url, planned)
        head.thread.start()
        if head.url is not None:
            head.first_calls_sent.wait(timeout=60)
        return head

    def prepared(self) -> PreparedRun | None:
        """The run as planned here (waiting for it), or None when planning failed: the flow meets the error itself."""
        try:
            return self._prepared.result()
        except Exception:
            return None

    def stop(self) -> None:
        """The flow executes its plan: no further stage is claimed here."""
        with self._lock:
            self._open = False

    def take_retrieval(self, stage: RetrieveStage) -> list[dict[str, Any]] | None:
        """The records of `stage` retrieved here (waiting for them if it is on it), or None: its task retrieves."""
        with self._lock:
            future = self._retrievals.pop(stage.key, None)
        if future is None:
            return None
        try:
            return future.result()
        except Exception:  # it failed here: the task retrieves and meets the error itself
            return None

    def _claim(self, stage: RetrieveStage) -> concurrent.futures.Future[list[dict[str, Any]]] | None:
        with self._lock:
            if not self._open or stage.key in self._retrievals:
                return None
            future = self._retrievals[stage.key] = concurrent.futures.Future()
            return future

    def _run(self) -> None:
        try:
            if self.url is not None:  # the first calls go to a model-call process: it imports while the rest starts
                from engines.llm import start_first_call_process

                start_first_call_process()
            first_in_store = engines_started_for_a_first_run(self.spec, self.store_root)
            from engines.llm import HeadStartCalls
            from flows.prepare import plan_run

            self.head_start_calls = HeadStartCalls()
            prepared = (self._planned.met_by(self) if self._planned is not None
                        else plan_run(self.spec, self.store_root, head_start=self))
            persisted = _persisted_check(prepared.run.questions_segment, self.store_root)  # before the flow stores it
            self._prepared.set_result(prepared)
            self._retrieve(prepared, persisted, first_in_store)
        except Exception as exc:  # the flow does the same work and reports what fails, with its context
            log.debug("head start stopped: %s", exc)
        finally:
            if not self._prepared.done():  # stopped before the run was planned: the flow plans it, not waiting here
                self._prepared.set_exception(RuntimeError("the head start stopped before the run was planned"))
            self.first_calls_sent.set()

    def _retrieve(self, prepared: PreparedRun, persisted: Callable[[str], bool], first_in_store: bool) -> None:
        """The plan's retrieve stages in its order (each retriever's first shard only, when no call is sent early),
        kept for their tasks, which store them (the stage's questions from memory: the flow stores them)."""
        import pandas as pd

        from flows.plan import question_rows
        from tasks.context import llm_client_for
        from tasks.retrieve import retrieve_rows

        the_plan, run, questions = prepared
        order = the_plan.retrieval_order() if self.url is not None else the_plan.first_retrievals()
        stages = [s for s in order if not s.calls_model and not persisted(s.key)]
        if not first_in_store:
            _start_engines(list(dict.fromkeys(s.retriever for s in stages)))
        rows = pd.DataFrame(question_rows(self.spec, questions)).set_index("qid", drop=False)
        client = (llm_client_for(self.spec, self.url, self.store_root, head_start_calls=self.head_start_calls)
                  if self.url else None)
        if client is not None:
            # one model-call process for the first calls, the others once those have left: on 2 cores their
            # imports would share the CPU with the JVM's start and the first retrieval, which the first calls wait for
            client.start_call_processes(at_most=1)
        try:
            for stage in stages:
                claim = self._claim(stage)
                if claim is None:  # the flow has started: it runs the rest itself
                    return
                send = None if client is None else _round_one_sender(prepared, stage, client, persisted)
                first = FIRST_QUESTIONS if stage.qids == the_plan.shards[0].qids else 0
                try:
                    claim.set_result(retrieve_rows(run, stage, rows.loc[list(stage.qids)], on_part=send, first=first))
                except BaseException as exc:  # the task waiting on it retrieves itself
                    claim.set_exception(exc)
                    raise
                self.first_calls_sent.set()
        finally:  # whatever stopped the head start, every model-call process takes calls again
            if client is not None:
                client.start_call_processes()


def _round_one_sender(prepared: PreparedRun, stage: RetrieveStage, client: LLMClient,
                      persisted: Callable[[str], bool]) -> Callable[[pd.DataFrame, list[dict[str, Any]]], None]:
    """What sends a retrieved part's round-1 calls, of every cell on the stage's retriever, ahead of their tasks."""
    import pandas as pd

    from schemas.records import columns_of
    from tasks.generate import plan_round

    the_plan, run, _ = prepared
    sid = the_plan.shard_of(stage)

    def send(questions: pd.DataFrame, rows: list[dict[str, Any]]) -> None:
        retrievals = pd.DataFrame(rows, columns=columns_of("retrievals"))
        for cell in the_plan.cells_of(stage.retriever):
            first_round = the_plan.generates[(cell, sid)][0]
            if not persisted(first_round.key):
                calls = plan_round(run.spec, first_round, run.store_root, questions, retrievals, {})
                client.send_head_start([req for *_, req in calls.calls], calls.rounds_after)
        client.start_call_processes()  # the first calls left: the other model-call processes now

    return send


def _persisted_check(questions_segment: str, store_root: str) -> Callable[[str], bool]:
    """Whether the flow will take a stage's result from Prefect's persisted results (one file per cache key, in the
    folder ragledger/prefect_env.py sets: asking Prefect itself would import it and start its own ephemeral server,
    the API not being up yet) or from the result the store keeps under its key (tasks/stage_runs.py). Prefect's
    files outlive a deleted store, but the flow runs again every stage whose segment is gone (flows/pipeline.py):
    with the run's questions segment gone too, none of them counts."""
    results, layout = Path(os.environ["PREFECT_LOCAL_STORAGE_PATH"]), StoreLayout.of(store_root)
    stored = segment_exists(questions_segment)
    return lambda key: stored and ((results / key).exists() or layout.stage_result(key).exists())


def up_already(spec: ExperimentSpec, base_url: str | None) -> str | None:
    """The endpoint the flow's generate tasks will call, when it is up already (not the embedded server)."""
    if base_url is not None:
        return base_url
    return spec.model.base_url if spec.model.backend != "embedded" and spec.model.base_url else None


def engines_started_for_a_first_run(spec: ExperimentSpec, store_root: str) -> bool:
    """Whether this is the first run of the experiment in this store, whose search engines then start now, before
    anything else (the stages' imports, the model-call process, the dataset, the plan: ~1 s on 2 cores), since its
    first retrieval waits for them. Otherwise they start once the plan says which retrievals are still to be made."""
    from engines import java
    from strategies.retrievers import parse_retriever

    # this process searches the run's questions once per retriever, then exits: the JVM's compiler is chosen for that
    limit = spec.dataset.limit
    java.expect_queries(limit * len(spec.retrievers) if limit else None)
    first_in_store = not StoreLayout.of(store_root).records("questions", spec.name).exists()
    if first_in_store:
        _start_engines([name for name in spec.retrievers if not parse_retriever(name).needs_llm])
    return first_in_store


def started_ahead_of_a_first_run(spec: ExperimentSpec, store_root: str, base_url: str | None) -> None:
    """For the first run of an experiment in this store: its search engines (the JVM) and, for an endpoint that is
    up already, one model-call process started now, in the background, so that their starts overlap the command's
    checks and imports (flows/launch.py, the direct route). Starts nothing for a rerun, which the store may answer."""
    if engines_started_for_a_first_run(spec, store_root) and up_already(spec, base_url) is not None:
        from engines.call_processes import start_first_call_process

        start_first_call_process()


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
