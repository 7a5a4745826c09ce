"""What every stage task rebuilds from small, explicit inputs (never live objects).

Tasks receive the spec as a dict, the store root and an endpoint URL; everything heavy (the
corpus, the retriever's index, the LLM client) is reopened per process and memoised, so the same
task code runs in the thread runner and on Dask workers.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

from core.paths import StoreLayout
from engines.concurrency import process_share
from engines.llm import HeadStartCalls, LLMClient, api_key_from_env
from engines.llm_cache import LLMCallCache
from engines.llm_types import Endpoint, endpoint_identity, model_identity, served_name
from schemas.spec import ExperimentSpec
from strategies.retrievers import Corpus, Retriever, parse_retriever
from tasks.stages import StageResult as StageResult  # results Prefect persisted name it tasks.context.StageResult


def index_root_for(store_root: str) -> Path:
    """Indexes are keyed by corpus hash and shared by every experiment and checkout on the machine."""
    return StoreLayout.of(store_root).indexes


def corpus_for(spec: ExperimentSpec, index_root: Path, log=print) -> Corpus:
    """The spec's corpus, for a retriever about to search it: passage files read for the first time on this machine
    are indexed by that same read (strategies/retrievers/lucene.py `load_with_index`)."""
    from strategies.retrievers.lucene import load_with_index

    return load_with_index(spec.corpus.name, tuple(spec.corpus.paths), spec.corpus.faiss, index_root, log=log)


_retrievers: dict[tuple[str, str, str], Retriever] = {}


def retriever_for(spec: ExperimentSpec, name: str, store_root: str, log=print) -> Retriever:
    index_root = index_root_for(store_root)
    corpus = corpus_for(spec, index_root, log=log) if parse_retriever(name).needs_corpus else None
    key = (name, corpus.corpus_hash if corpus else "", store_root)
    if key not in _retrievers:
        retriever = parse_retriever(name)
        if corpus is not None:
            retriever.prepare(corpus, index_root, log=log)
        _retrievers[key] = retriever
    return _retrievers[key]


def llm_client_for(spec: ExperimentSpec, base_url: str, store_root: str, logprobs_base_url: str | None = None,
                   head_start_calls: HeadStartCalls | None = None, task_processes: int = 1) -> LLMClient:
    """The run's model as a client in one of its `task_processes` (tasks/stages.py `RunContext.task_processes`);
    `head_start_calls`: the calls its head start sent (flows/head_start.py), which it takes over."""
    endpoint = Endpoint(
        base_url=base_url,
        logprobs_base_url=logprobs_base_url,
        model=served_name(spec.model),
        api_key=api_key_from_env(spec.model.api_key_env) if spec.model.backend == "openai" else "not-needed",
        concurrency=process_share(spec.model.concurrency, task_processes),  # engines/concurrency.py
        timeout_s=spec.model.timeout_s,
        max_retries=spec.model.max_retries,
        local_server=spec.model.backend == "embedded",
    )
    return LLMClient(endpoint, model_identity(spec.model), cache=_llm_cache(str(StoreLayout.of(store_root).llm_cache)),
                     legacy_identity=endpoint_identity(spec.model, base_url), head_start_calls=head_start_calls)


_cache_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _cached_llm_cache(path: str) -> LLMCallCache:
    return LLMCallCache(path)


def _llm_cache(path: str) -> LLMCallCache:
    """One cache connection per store per process: concurrent tasks (retrieve and generate shards) would otherwise
    each open the file, lru_cache not being atomic."""
    with _cache_lock:
        return _cached_llm_cache(path)
