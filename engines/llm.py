"""The one way ragledger talks to a model: the `openai` client against an OpenAI-compatible endpoint.

OpenAI, a vLLM server and the embedded llama.cpp server all go through `LLMClient.complete`: the call's key in the
content-addressed call cache, looked up once here, identical calls in flight asked once, and the counters a stage
reports. Backends that ignore `n` are handled by callers asking for one sample per request, each with its own
`sample_index` (and seed).

The calls themselves are made in model-call processes (`engines.model_call_process`, which says why), started on the
first call by this process's engine loop: there the concurrency is bounded (engines/concurrency.py) and a failed call
retried with exponential backoff, jitter and Retry-After (engines/llm_http.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from core.hashing import stable_hash
from engines.call_processes import (
    call_processes_of,
    close_clients,
    consume_exception,
    engine_loop,
    run_on_engine,
    start_first_call_process,
)
from engines.concurrency import call_processes_for
from engines.llm_cache import LLMCallCache
from engines.llm_types import BackendError, ContextOverflow, Endpoint, LLMRequest, LLMResponse, cached_response

# the client's API: the call types, and the engine loop its calls run on (engines/call_processes.py)
__all__ = ["BackendError", "CallCounters", "ContextOverflow", "HeadStartCalls", "LLMClient", "LLMRequest", "LLMResponse",
           "api_key_from_env", "close_clients", "run_on_engine", "start_first_call_process"]


_REQUEST_FIELDS = tuple(f.name for f in fields(LLMRequest))
# the keys computed in this process, by (model identity, model name, request): a call's key is asked for three times, by
# clients of a run's head start and its task (flows/head_start.py sends it early), and for its generation record; each
# hashes the whole prompt. Bounded (oldest first): a shard's calls are asked for within a few thousand others
_KEYS: dict[tuple[str, str, LLMRequest], str] = {}
_KEYS_MAX = 20_000
_KEYS_LOCK = threading.Lock()
TOKEN_LOGPROBS_FORMAT = "token-logprobs-1"


def _call_key(identity: str, model: str, req: LLMRequest) -> str:
    memo = (identity, model, req)
    key = _KEYS.get(memo)
    if key is None:
        # the fields by name, as dataclasses.asdict gives them (same key), without its deep copy of the prompt: this
        # runs on the engine loop once per call (docs/performance.md, "Small costs behind the code")
        request = {name: getattr(req, name) for name in _REQUEST_FIELDS}
        # a call asking for log-probabilities caches them per token (TOKEN_LOGPROBS_FORMAT): entries from
        # before, which kept only their mean, are not reused for it
        fmt = (TOKEN_LOGPROBS_FORMAT,) if req.logprobs else ()
        key = stable_hash("llm-call", identity, model, request, *fmt, length=40)
        with _KEYS_LOCK:  # asked for on the engine loop and in task threads
            if len(_KEYS) >= _KEYS_MAX:
                _KEYS.pop(next(iter(_KEYS)))
            _KEYS[memo] = key
    return key


@dataclass
class CallCounters:
    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0

    def add(self, other: CallCounters) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def as_stage_counters(self) -> dict[str, int]:
        """The counters a stage task reports (StageResult.counters; `calls` is named llm_calls there)."""
        return {"llm_calls": self.calls, "cache_hits": self.cache_hits, "retries": self.retries,
                "tokens_in": self.tokens_in, "tokens_out": self.tokens_out}


@dataclass
class LLMClient:
    endpoint: Endpoint  # where and how to call: sent to the model-call process with each call
    model_identity: str  # the model that answers (engines.llm_types.model_identity): names every call's cache key
    cache: LLMCallCache | None
    counters: CallCounters = field(default_factory=CallCounters)
    # what call keys named before they named the model (llm_types.endpoint_identity: the server's URL); a call
    # missing from the cache under its key is looked for under this one, and kept under its key when found
    legacy_identity: str | None = None
    # calls of a run sent before their task ran (flows/head_start.py), taken over by this client's `complete`
    head_start_calls: HeadStartCalls | None = None

    def cache_key(self, req: LLMRequest) -> str:
        return _call_key(self.model_identity, self.endpoint.model, req)

    def _legacy_key(self, req: LLMRequest) -> str | None:
        if self.legacy_identity is None or self.legacy_identity == self.model_identity:
            return None
        if self.cache is None or not self.cache.may_hold_url_keys:  # a cache created since keys name the model
            return None
        return _call_key(self.legacy_identity, self.endpoint.model, req)

    async def complete(self, req: LLMRequest, rounds_after: int = 0) -> LLMResponse:
        """The response to `req`, from the cache or the model. `rounds_after`: how many rounds of the calling
        strategy follow this call's (a hint to the call gate's order, engines/call_gate.py; not part of the call)."""
        key = self.cache_key(req)
        # an identical request already in flight (strategies sharing calls in the same round, e.g.
        # concat_pf's round 1 and concatenation) waits for that one instead of calling the model again
        loop = asyncio.get_running_loop()
        slot = (id(loop), key)
        pending = _INFLIGHT.get(slot)
        if pending is not None:
            shared = await asyncio.shield(pending)
            self.counters.cache_hits += 1
            return replace(shared, from_cache=True, retries=0)
        future: asyncio.Future[LLMResponse] = loop.create_future()
        _INFLIGHT[slot] = future
        try:
            # a call sent before its task ran (send_head_start) is taken over as this one's own call
            sent = self.head_start_calls.take(slot) if self.head_start_calls is not None else None
            # not sent before: an identical call may have been answered already (two questions of a run with the same
            # text and passages); its cached answer now, not after every call queued ahead of this one, which would
            # leave that question's shard, and its vote and evaluation, to the end of the run
            cached = self._cached(key, req) if sent is None else None
            response = cached or await (sent if sent is not None else self._call(loop, req, key, rounds_after))
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: waiters re-raise it, and no "never retrieved" warning
            raise
        else:
            future.set_result(response)
        finally:
            _INFLIGHT.pop(slot, None)
        if response.from_cache:
            self.counters.cache_hits += 1
            return response
        self.counters.calls += 1
        self.counters.retries += response.retries
        self.counters.tokens_in += response.tokens_in
        self.counters.tokens_out += response.tokens_out
        return response

    def _cached(self, key: str, req: LLMRequest) -> LLMResponse | None:
        if self.cache is None:
            return None
        hit = self.cache.get(key)
        if hit is None and (legacy := self._legacy_key(req)) is not None:
            hit = self.cache.get(legacy)
            if hit is not None:  # answered before under the URL's key: kept under the model's from now on
                self.cache.put(key, hit)
        return cached_response(hit) if hit is not None else None

    def _call(self, loop: asyncio.AbstractEventLoop, req: LLMRequest, key: str,
              rounds_after: int) -> Coroutine[Any, Any, LLMResponse]:
        cache_path = str(self.cache.path) if self.cache is not None else None
        return call_processes_of(loop).call(self.endpoint, req, key, cache_path, rounds_after)

    def start_call_processes(self, at_most: int | None = None) -> None:
        """Start this endpoint's model-call processes now (their imports take a second), not on the first call; or
        only the first `at_most` of them, the others taking no call until this is called again without it. Returns at
        once."""

        async def start() -> None:
            processes = call_processes_of(asyncio.get_running_loop())
            processes.held_from[self.endpoint] = at_most
            await processes.start(min(call_processes_for(self.endpoint.concurrency), at_most or sys.maxsize))

        asyncio.run_coroutine_threadsafe(start(), engine_loop())

    def send_head_start(self, requests: list[LLMRequest], rounds_after: int = 0) -> None:
        """Send these calls now, before the task that makes them runs (flows/head_start.py: while Prefect's server
        starts), into `self.head_start_calls`. The first `complete` of the same request by a client with the same
        `head_start_calls` takes the answer over and counts it as its own call; an answer nobody takes still lands in
        the call cache."""
        calls = self.head_start_calls
        assert calls is not None, "send_head_start needs the run's HeadStartCalls"
        asyncio.run_coroutine_threadsafe(self._send_head_start(requests, rounds_after, calls), engine_loop()).result()

    async def _send_head_start(self, requests: list[LLMRequest], rounds_after: int, calls: HeadStartCalls) -> None:
        loop = asyncio.get_running_loop()
        for req in requests:
            slot = (id(loop), self.cache_key(req))
            if self._legacy_key(req) is not None:  # a call cached under the URL's key is kept under the model's,
                self._cached(slot[1], req)  # which the model-call process looks up
            if slot not in calls and slot not in _INFLIGHT:
                calls.add(slot, loop.create_task(self._call(loop, req, slot[1], rounds_after)))


class HeadStartCalls:
    """One run's calls sent before the tasks that make them ran (flows/head_start.py), by (event loop, call key), until
    a task's `complete` takes each over. Touched only on the engine loop."""

    def __init__(self) -> None:
        self._calls: dict[tuple[int, str], asyncio.Task] = {}

    def add(self, slot: tuple[int, str], task: asyncio.Task) -> None:
        task.add_done_callback(consume_exception)  # the task that takes it over re-raises it
        self._calls[slot] = task

    def take(self, slot: tuple[int, str]) -> asyncio.Task | None:
        return self._calls.pop(slot, None)

    def __contains__(self, slot: object) -> bool:
        return slot in self._calls

    def __len__(self) -> int:
        return len(self._calls)


# calls of this process in flight on the engine loop (engines/call_processes.py), by (event loop, call cache key)
_INFLIGHT: dict[tuple[int, str], asyncio.Future] = {}  # (event loop, call cache key) -> its pending response


def api_key_from_env(var: str | None) -> str:
    """Read an API key by env-var name; the key itself never enters specs, params or records."""
    if not var:
        return os.environ.get("OPENAI_API_KEY", "not-needed")
    value = os.environ.get(var)
    if not value:
        raise BackendError(f"model.api_key_env names {var!r}, but that environment variable is not set")
    return value
