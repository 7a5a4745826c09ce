"""The one way ragledger talks to a model: the `openai` client against an OpenAI-compatible endpoint.

OpenAI, a vLLM server and the embedded llama.cpp server all go through `LLMClient.complete`, which
adds the content-addressed call cache, bounded concurrency, and bounded retries with exponential
backoff, jitter and Retry-After. Backends that ignore `n` are handled by callers asking for one
sample per request, each with its own `sample_index` (and seed).

The calls themselves are made in model-call processes (`ragledger.llm_http`, which says why), started on the
first call by this process's engine loop; this side keeps what belongs to a run: the call's cache key, identical
calls in flight asked once, and the counters a stage reports.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from ragledger.hashing import stable_hash
from ragledger.llm_http import cached_response, encode, read_message
from ragledger.llm_types import BackendError, ContextOverflow, Endpoint, LLMRequest, LLMResponse
from tracking.llm_cache import LLMCallCache

T = TypeVar("T")

__all__ = ["BackendError", "CallCounters", "ContextOverflow", "LLMClient", "LLMRequest", "LLMResponse", "api_key_from_env",
           "close_clients", "run_on_engine"]

REPO_ROOT = str(Path(__file__).resolve().parents[1])  # the model-call process imports ragledger and tracking from here
# calls to an endpoint that a call gave up on for a transport failure fail at once for this long (ragledger.llm_http)
UNREACHABLE_FOR_S = 60.0
# One model-call process per this many requests in flight, and at most one per core. One process's CPU per
# request (~0.7 ms in the openai client) bounds it at hundreds of requests a second: answers arrive in waves and
# wait for each other. P1 (10,000 calls, 64 in flight, 100 ms each): the flow took 19.5 s with one process and
# 18.2-18.8 s with two (docs/performance.md).
REQUESTS_PER_CALL_PROCESS = 32
MAX_CALL_PROCESSES = os.cpu_count() or 1


def call_processes_for(concurrency: int) -> int:
    """How many model-call processes share an endpoint whose bound is `concurrency` requests in flight."""
    return max(1, min(MAX_CALL_PROCESSES, concurrency // REQUESTS_PER_CALL_PROCESS))


_REQUEST_FIELDS = tuple(f.name for f in fields(LLMRequest))
# the keys computed in this process, by (model identity, model name, request): a call's key is asked for three times, by
# clients of its warm-up and its task (flows/warmup.py sends it early), and for its generation record; each
# hashes the whole prompt. Bounded (oldest first): a shard's calls are asked for within a few thousand others
_KEYS: dict[tuple[str, str, LLMRequest], str] = {}
_KEYS_MAX = 20_000
_KEYS_LOCK = threading.Lock()
TOKEN_LOGPROBS_FORMAT = "token-logprobs-1"


def _call_key(identity: str, model: str, req: LLMRequest) -> str:
    memo = (identity, model, req)
    key = _KEYS.get(memo)
    if key is None:
        # the fields by name, as dataclasses.asdict gives them (same key), without its 6 us deep copy: this
        # runs on the engine loop once per call
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
    model_identity: str  # the model that answers (ragledger.llm_types.model_identity): names every call's cache key
    cache: LLMCallCache | None
    counters: CallCounters = field(default_factory=CallCounters)
    # what call keys named before they named the model (llm_types.endpoint_identity: the server's URL); a call
    # missing from the cache under its key is looked for under this one, and kept under its key when found
    legacy_identity: str | None = None

    def cache_key(self, req: LLMRequest) -> str:
        return _call_key(self.model_identity, self.endpoint.model, req)

    def _legacy_key(self, req: LLMRequest) -> str | None:
        if self.legacy_identity is None or self.legacy_identity == self.model_identity:
            return None
        return _call_key(self.legacy_identity, self.endpoint.model, req)

    async def complete(self, req: LLMRequest, rounds_after: int = 0) -> LLMResponse:
        """The response to `req`, from the cache or the model. `rounds_after`: how many rounds of the calling
        strategy follow this call's (a hint to the call gate's order, ragledger/call_gate.py; not part of the call)."""
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
            # a call sent before its task ran (send_early) is taken over as this one's own call
            early = _EARLY.pop(slot, None)
            # not sent before: an identical call may have been answered already (two questions of a run with the same
            # text and passages); its cached answer now, not after every call queued ahead of this one, which would
            # leave that question's shard, and its vote and evaluation, to the end of the run
            cached = self._cached(key, req) if early is None else None
            response = cached or await (early if early is not None else self._call(loop, req, key, rounds_after))
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
        return _call_processes(loop).call(self.endpoint, req, key, cache_path, rounds_after)

    def start_call_processes(self, at_most: int | None = None) -> None:
        """Start this endpoint's model-call processes now (their imports take a second), not on the first call; or
        only the first `at_most` of them, the others taking no call until this is called again without it. Returns at
        once."""

        async def start() -> None:
            processes = _call_processes(asyncio.get_running_loop())
            processes.held_from[self.endpoint] = at_most
            await processes.start(min(call_processes_for(self.endpoint.concurrency), at_most or sys.maxsize))

        asyncio.run_coroutine_threadsafe(start(), _engine())

    def send_early(self, requests: list[LLMRequest], rounds_after: int = 0) -> None:
        """Send these calls now, before the task that makes them runs (flows/warmup.py: while Prefect's server
        starts). The first `complete` of the same request in this process takes the answer over and counts it as
        its own call; an answer nobody takes still lands in the call cache."""
        asyncio.run_coroutine_threadsafe(self._send_early(requests, rounds_after), _engine()).result()

    async def _send_early(self, requests: list[LLMRequest], rounds_after: int) -> None:
        loop = asyncio.get_running_loop()
        for req in requests:
            slot = (id(loop), self.cache_key(req))
            # a call answered under the URL's key is not sent again (the embedded model's key never changed)
            answered = self._legacy_key(req) is not None and self._cached(slot[1], req) is not None
            if slot not in _EARLY and slot not in _INFLIGHT and not answered:
                task = loop.create_task(self._call(loop, req, slot[1], rounds_after))
                task.add_done_callback(_consume_exception)  # the task that takes it over re-raises it
                _EARLY[slot] = task


# ---- the engine: one event loop per process that forwards every model call ------------------------
# Stage tasks run in worker threads; routing all their calls through one loop and one model-call process lets
# them share one connection pool and one concurrency bound per endpoint (the embedded server answers one request
# at a time; a vLLM server wants a steady, bounded stream).
_INFLIGHT: dict[tuple[int, str], asyncio.Future] = {}  # (event loop, call cache key) -> its pending response
_EARLY: dict[tuple[int, str], asyncio.Task] = {}  # calls sent before their task ran, until one takes them over
_PROCESSES: dict[int, _CallProcesses] = {}  # event loop -> its model-call processes
_engine_loop: asyncio.AbstractEventLoop | None = None
_engine_lock = threading.Lock()


class _CallProcess:
    """The parent's end of one model-call process (`python -m ragledger.llm_http`): started on the first call,
    from the engine loop's thread (which lives as long as the process, so the child's parent-death signal fires
    only when this process dies), and started again if it exits."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Lock | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._reader: asyncio.Future | None = None
        self.outstanding = 0  # calls sent (or about to be) and not yet answered: how busy this process is

    async def ensure_started(self) -> asyncio.subprocess.Process:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._proc is None or self._proc.returncode is not None:
                from ragledger.processes import die_with_parent

                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "ragledger.llm_http", stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent, limit=2**26,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (REPO_ROOT, os.environ.get("PYTHONPATH"))))},
                )  # fmt: skip
                self._reader = asyncio.ensure_future(self._read_answers(self._proc))
            return self._proc

    async def _read_answers(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        why = ""
        try:
            while (message := await read_message(proc.stdout)) is not None:
                call_id, ok, payload = message
                future = self._pending.pop(call_id, None)
                if future is not None and not future.done():
                    if ok:
                        future.set_result(payload)
                    else:  # a message, or a ContextOverflow as itself (ragledger.llm_http.serve)
                        future.set_exception(payload if isinstance(payload, BackendError) else BackendError(payload))
        except Exception as exc:  # an unreadable answer: no call may wait forever for it
            why = f": {type(exc).__name__}: {exc}"
            proc.kill()
        code = await proc.wait()
        lost, self._pending = self._pending, {}
        for future in lost.values():
            if not future.done():
                future.set_exception(BackendError(
                    f"the model-call process ({sys.executable} -m ragledger.llm_http) exited with code {code}{why} "
                    f"while {len(lost)} call(s) waited for it; its own error, if any, is above in stderr"))

    async def call(self, ep: Endpoint, req: LLMRequest, cache_key: str, cache_path: str | None,
                   rounds_after: int = 0) -> LLMResponse:
        """Send one call; UNREACHABLE_FOR_S is read now, so a change to it applies to the next call."""
        self.outstanding += 1  # before the first await: the next call's choice of process already sees it
        try:
            proc = await self.ensure_started()
            assert proc.stdin is not None
            self._next_id += 1
            call_id = self._next_id
            future = asyncio.get_running_loop().create_future()
            self._pending[call_id] = future
            proc.stdin.write(encode(("call", call_id, ep, req, cache_key, cache_path, UNREACHABLE_FOR_S, rounds_after)))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # gone: _read_answers fails the call
                await proc.stdin.drain()
            return await future
        finally:
            self.outstanding -= 1

    async def close_clients(self, base_url: str | None) -> None:
        if self._proc is not None and self._proc.returncode is None and self._proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._proc.stdin.write(encode(("close", base_url)))
                await self._proc.stdin.drain()


# Calls a model-call process may hold beyond its share of the concurrency: queued there, they go out the moment a
# slot frees, even while task threads hold this process's GIL (128 is ~0.4 s of P1's calls per process). The rest
# wait here, so the processes finish together: handed out all at once when queued, a shard's calls left one
# process with ~600 to make alone, 32 in flight, for the last 2 s of P1 while the other idled.
BACKLOG_PER_CALL_PROCESS = 128


class _CallProcesses:
    """One event loop's model-call processes. An endpoint that may have n of them (`call_processes_for`) has its
    calls spread over the first n: each process bounds its share of the endpoint's concurrency, so the shares add
    up to `Endpoint.concurrency`. A call waits here while the endpoint's processes together hold the concurrency
    plus BACKLOG_PER_CALL_PROCESS each, then goes to the usable one with the fewest calls outstanding (with all of
    them usable, none holds much more than its share plus the backlog). With one process every call goes to it at
    once: its call gate then orders all the waiting calls (ragledger/call_gate.py)."""

    def __init__(self) -> None:
        self.processes: list[_CallProcess] = []
        self._shares: dict[tuple[Endpoint, int, int], Endpoint] = {}
        self._room: dict[Endpoint, asyncio.Semaphore] = {}  # per endpoint: calls that may be outstanding at once
        # per endpoint: its processes from this index on take no call yet (LLMClient.start_call_processes)
        self.held_from: dict[Endpoint, int | None] = {}

    def _at_least(self, n: int) -> list[_CallProcess]:
        """The first n processes, made (not started) as needed."""
        while len(self.processes) < n:
            self.processes.append(_CallProcess())
        return self.processes[:n]

    async def start(self, n: int) -> None:
        """The first n processes started (each once)."""
        await asyncio.gather(*(p.ensure_started() for p in self._at_least(n)))

    async def call(self, ep: Endpoint, req: LLMRequest, cache_key: str, cache_path: str | None,
                   rounds_after: int = 0) -> LLMResponse:
        n = call_processes_for(ep.concurrency)
        self._at_least(n)
        if n == 1:
            return await self.processes[0].call(ep, req, cache_key, cache_path, rounds_after)
        room = self._room.get(ep)
        if room is None:
            room = self._room[ep] = asyncio.Semaphore(ep.concurrency + n * BACKLOG_PER_CALL_PROCESS)
        async with room:
            # the warm-up starts one process first and holds the others back for its endpoint until its first
            # calls left
            usable = range(min(n, self.held_from.get(ep) or n))
            i = min(usable, key=lambda j: self.processes[j].outstanding)
            return await self.processes[i].call(self._share(ep, i, n), req, cache_key, cache_path, rounds_after)

    def _share(self, ep: Endpoint, i: int, n: int) -> Endpoint:
        """The endpoint as process i of n bounds it: its share of the concurrency (the first ones take the rest)."""
        if n == 1:
            return ep
        if (ep, i, n) not in self._shares:
            share = ep.concurrency // n + (1 if i < ep.concurrency % n else 0)
            self._shares[(ep, i, n)] = replace(ep, concurrency=share)
        return self._shares[(ep, i, n)]

    async def close_clients(self, base_url: str | None) -> None:
        await asyncio.gather(*(p.close_clients(base_url) for p in self.processes))


def _consume_exception(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def start_first_call_process() -> None:
    """Start this process's first model-call process now, before any endpoint's client exists: its imports (openai,
    aiohttp: ~1 s of CPU) then overlap whatever comes before the first call (flows/warmup.py), rather than following
    it. A client's calls go to it as to one it started itself. Returns at once."""

    async def start() -> None:
        await _call_processes(asyncio.get_running_loop()).start(1)

    asyncio.run_coroutine_threadsafe(start(), _engine())


def _call_processes(loop: asyncio.AbstractEventLoop) -> _CallProcesses:
    return _PROCESSES.setdefault(id(loop), _CallProcesses())


def _engine() -> asyncio.AbstractEventLoop:
    global _engine_loop
    with _engine_lock:
        if _engine_loop is None or _engine_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ragledger-llm-engine", daemon=True).start()
            _engine_loop = loop
        return _engine_loop


def close_clients(base_url: str | None = None) -> None:
    """Close the model-call processes' HTTP clients of one endpoint (an embedded server that stopped) or of all
    (process exit): each holds an aiohttp session, and a long-lived process (a schedule server) would otherwise
    keep one per finished run's endpoint."""
    loop = _engine_loop
    process = _PROCESSES.get(id(loop)) if loop is not None else None
    if process is None or loop is None or loop.is_closed() or not loop.is_running():
        return
    with contextlib.suppress(Exception):  # never block or fail a shutdown over a connection pool
        asyncio.run_coroutine_threadsafe(process.close_clients(base_url), loop).result(timeout=10)


atexit.register(close_clients)


def run_on_engine(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of model calls on the process-wide engine loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, _engine()).result()


def api_key_from_env(var: str | None) -> str:
    """Read an API key by env-var name; the key itself never enters specs, params or records."""
    if not var:
        return os.environ.get("OPENAI_API_KEY", "not-needed")
    value = os.environ.get(var)
    if not value:
        raise BackendError(f"model.api_key_env names {var!r}, but that environment variable is not set")
    return value
