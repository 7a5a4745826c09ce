"""What every stage task rebuilds from small, explicit inputs (never live objects).

Tasks receive the spec as a dict, the store root and an endpoint URL; everything heavy (the
corpus, the retriever's index, the LLM client) is reopened per process and memoised, so the same
task code runs in the thread runner and on Dask workers.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task

from ragledger.datasets import load_corpus
from ragledger.llm import LLMClient, api_key_from_env
from ragledger.llm_http import Endpoint
from schemas.spec import ExperimentSpec
from tasks.retrievers import Corpus, Retriever, parse_retriever
from tracking.events import EventStore
from tracking.llm_cache import LLMCallCache


@dataclass(frozen=True)
class StageResult:
    """What a stage task returns (and Prefect persists): where its records went, and its counters."""

    stage: str
    cell: str
    shard: str
    segment: str | None
    rows: int
    run_token: str  # the run that executed the task; differs from the current run on a cache hit
    counters: dict[str, int]
    pid: int = field(default_factory=os.getpid)  # the process that ran it: the flow's, or a Dask worker's

    def segment_exists(self) -> bool:
        return self.segment is None or Path(self.segment).exists()


def spec_from(spec_dict: dict[str, Any]) -> ExperimentSpec:
    return ExperimentSpec.model_validate(spec_dict)


def store_from(store_root: str) -> EventStore:
    return EventStore(store_root)


def index_root_for(store_root: str) -> Path:
    """Indexes are keyed by corpus hash and shared by every experiment and checkout on the machine
    ($RAGLEDGER_INDEX_DIR, default ~/.cache/ragledger/indexes)."""
    import os

    from ragledger.paths import cache_home

    return Path(os.environ.get("RAGLEDGER_INDEX_DIR") or cache_home() / "indexes")


@functools.lru_cache(maxsize=4)
def _corpus(name: str, paths: tuple[str, ...]) -> Corpus:
    return Corpus.from_frame(load_corpus(name, list(paths)))


def corpus_for(spec: ExperimentSpec) -> Corpus:
    return _corpus(spec.corpus.name, tuple(spec.corpus.paths))


_retrievers: dict[tuple[str, str, str], Retriever] = {}


def retriever_for(spec: ExperimentSpec, name: str, store_root: str, log=print) -> Retriever:
    corpus = corpus_for(spec) if parse_retriever(name).needs_corpus else None
    key = (name, corpus.corpus_hash if corpus else "", store_root)
    if key not in _retrievers:
        retriever = parse_retriever(name)
        if corpus is not None:
            retriever.prepare(corpus, index_root_for(store_root), log=log)
        _retrievers[key] = retriever
    return _retrievers[key]


def backend_identity(spec: ExperimentSpec, base_url: str) -> str:
    """Identity of the model behind the endpoint, for the LLM-call cache key."""
    if spec.model.backend == "embedded":
        from ragledger.models import BUNDLED_MODELS

        return f"embedded:{BUNDLED_MODELS[spec.model.embedded_model].sha256}"
    return f"openai-compatible:{base_url}"


def llm_client_for(spec: ExperimentSpec, base_url: str, store_root: str, logprobs_base_url: str | None = None) -> LLMClient:
    endpoint = Endpoint(
        base_url=base_url,
        logprobs_base_url=logprobs_base_url,
        model=spec.model.embedded_model if spec.model.backend == "embedded" else spec.model.name,
        api_key=api_key_from_env(spec.model.api_key_env) if spec.model.backend == "openai" else "not-needed",
        concurrency=process_concurrency(spec.model.concurrency),
        timeout_s=spec.model.timeout_s,
        max_retries=spec.model.max_retries,
    )
    return LLMClient(endpoint, backend_identity(spec, base_url),
                     cache=_llm_cache(str(Path(store_root).resolve() / "llm_cache.sqlite")))


# Set in the worker processes of a local Dask cluster (flows.experiment.task_runner_for): how many processes
# share one endpoint, so that model.concurrency stays the bound on requests in flight for the whole run.
PROCESSES_ENV = "RAGLEDGER_ENDPOINT_PROCESSES"


def process_concurrency(concurrency: int) -> int:
    """This process's share of model.concurrency (each process has its own bound; see LLMClient)."""
    processes = max(1, int(os.environ.get(PROCESSES_ENV) or 1))
    return max(1, concurrency // processes)


_cache_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _cached_llm_cache(path: str) -> LLMCallCache:
    return LLMCallCache(path)


def _llm_cache(path: str) -> LLMCallCache:
    """One cache connection per store per process: concurrent tasks (retrieve and generate shards) would otherwise
    each open the file, lru_cache not being atomic."""
    with _cache_lock:
        return _cached_llm_cache(path)


def read_questions(store: EventStore, questions_segment: str, qids: list[str]) -> pd.DataFrame:
    """The shard's questions, in shard order, from the experiment's questions segment."""
    q = store.read("questions", paths=[questions_segment])
    q = q[q["qid"].isin(qids)].set_index("qid")
    return q.loc[[x for x in qids if x in q.index]].reset_index()


def cell_name(retriever: str, strategy: str, model: str) -> str:
    return f"{retriever} · {strategy} · {model}"


def stage_task(name: str, fn):
    """The Prefect task of a stage: the pure stage function itself, its result persisted and cached under the
    explicit `stage_key` parameter (a hash of small inputs chained from upstream), never of live objects."""
    return task(name=name, cache_key_fn=lambda ctx, params: params["stage_key"], persist_result=True)(fn)

