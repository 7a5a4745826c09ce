"""The one way ragledger talks to a model: the `openai` client against an OpenAI-compatible endpoint.

OpenAI, a vLLM server and the embedded llama.cpp server all go through `LLMClient.complete`, which
adds the content-addressed call cache, bounded concurrency, and bounded retries with exponential
backoff, jitter and Retry-After. Backends that ignore `n` are handled by callers asking for one
sample per request, each with its own `sample_index` (and seed).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import threading
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

import openai
from openai.types.chat import ChatCompletion

from tracking.events import stable_hash
from tracking.llm_cache import LLMCallCache

T = TypeVar("T")


@dataclass(frozen=True)
class LLMRequest:
    system: str
    prompt: str
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    sample_index: int = 0
    logprobs: bool = False


@dataclass
class LLMResponse:
    text: str
    mean_logprob: float | None
    tokens_in: int
    tokens_out: int
    latency_ms: float
    from_cache: bool = False
    retries: int = 0


class BackendError(RuntimeError):
    """The model endpoint failed after all retries (or refused the request outright)."""


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
    base_url: str
    model: str
    backend_identity: str
    cache: LLMCallCache | None
    api_key: str = field(default="not-needed", repr=False)
    concurrency: int = 4
    timeout_s: float = 120.0
    max_retries: int = 6
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    counters: CallCounters = field(default_factory=CallCounters)
    # the embedded backend serves log-probability calls from a second server (ragledger.embedded.Endpoints)
    logprobs_base_url: str | None = None

    def _shared(self, logprobs: bool = False) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        """One HTTP client and one concurrency bound per endpoint, shared by every task in the process.
        Calls routed to `logprobs_base_url` share the main endpoint's bound: both servers run on one machine."""
        key = (self.base_url, self.api_key, self.concurrency, self.timeout_s)
        if key not in _SHARED:
            _SHARED[key] = (self._openai(self.base_url), asyncio.Semaphore(self.concurrency))
        client, semaphore = _SHARED[key]
        if logprobs and self.logprobs_base_url:
            lp_key = ("logprobs", self.logprobs_base_url, *key)
            if lp_key not in _SHARED:
                _SHARED[lp_key] = (self._openai(self.logprobs_base_url), semaphore)
            client = _SHARED[lp_key][0]
        return client, semaphore

    def _openai(self, url: str) -> openai.AsyncOpenAI:
        # the openai client's aiohttp transport (extra `openai[aiohttp]`), not its default httpx one: measured
        # 10,000 calls at concurrency 64 against a 100 ms test server, 2.8 ms CPU per request against 4.8 ms
        # (README, P1); at hundreds of requests per second the client's CPU, not the server, bounded a run
        return openai.AsyncOpenAI(base_url=url, api_key=self.api_key, max_retries=0, timeout=self.timeout_s,
                                  http_client=openai.DefaultAioHttpClient(timeout=self.timeout_s))

    def cache_key(self, req: LLMRequest) -> str:
        return stable_hash("llm-call", self.backend_identity, self.model, asdict(req), length=40)

    async def complete(self, req: LLMRequest) -> LLMResponse:
        key = self.cache_key(req)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.counters.cache_hits += 1
                return LLMResponse(**{**hit, "from_cache": True})
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
            client, semaphore = self._shared(req.logprobs)
            async with semaphore:
                response = await self._call_with_retries(client, req)
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
        self.counters.calls += 1
        self.counters.retries += response.retries
        self.counters.tokens_in += response.tokens_in
        self.counters.tokens_out += response.tokens_out
        if self.cache is not None:
            self.cache.put(key, {k: v for k, v in asdict(response).items() if k != "from_cache"})
        return response

    async def _call_with_retries(self, client: openai.AsyncOpenAI, req: LLMRequest) -> LLMResponse:
        url = str(client.base_url)
        last_error, transport_failure = "", False
        for attempt in range(self.max_retries + 1):
            _fail_if_unreachable(url)
            started = time.perf_counter()
            try:
                result = await client.post("/chat/completions", body=_chat_body(self.model, req), cast_to=ChatCompletion)
                if not result.choices or result.choices[0].message is None:
                    raise _Retryable("response has no choices")
                choice = result.choices[0]
                text = choice.message.content
                if text is None:
                    raise _Retryable("response has no message content")
                mean_lp = _mean_logprob(choice) if req.logprobs else None
                usage = result.usage
                _UNREACHABLE.pop(url, None)
                return LLMResponse(
                    text=text,
                    mean_logprob=mean_lp,
                    tokens_in=int(usage.prompt_tokens) if usage else 0,
                    tokens_out=int(usage.completion_tokens) if usage else 0,
                    latency_ms=(time.perf_counter() - started) * 1000,
                    retries=attempt,
                )
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status in (400, 401, 403, 404, 422):
                    raise BackendError(f"{self.base_url}: HTTP {status} (not retried): {_short(exc)}") from None
                last_error, transport_failure = f"HTTP {status}", False
                delay = _retry_after(exc.response) if status == 429 else None
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                last_error, transport_failure = _transport_error(exc), True
                delay = None
            except (_Retryable, openai.APIResponseValidationError, ValueError) as exc:
                # malformed or truncated bodies, empty completions
                last_error, transport_failure = f"malformed response: {_short(exc)}", False
                delay = None
            if attempt == self.max_retries:
                break
            if delay is None:
                delay = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
                delay = delay * (0.5 + random.random())  # jitter
            await asyncio.sleep(delay)
        if transport_failure:
            _UNREACHABLE[url] = (time.monotonic(), last_error)
        raise BackendError(f"{self.base_url}: gave up after {self.max_retries + 1} attempts; last error: {last_error}")


# An endpoint that a call gave up on for a transport failure (refused, reset, timed out: a server that is down
# or hung, not one answering errors): calls to it in the next UNREACHABLE_FOR_S fail at once. Without this each
# queued call spent its own retries (~30 s of backoff) while holding a concurrency slot, so a run whose embedded
# server died took many minutes to fail. A later run (a schedule server's next one) tries the endpoint again.
UNREACHABLE_FOR_S = 60.0
_UNREACHABLE: dict[str, tuple[float, str]] = {}  # endpoint URL -> (when a call gave up on it, its last error)


def _fail_if_unreachable(url: str) -> None:
    down = _UNREACHABLE.get(url)
    if down is None:
        return
    when, error = down
    age = time.monotonic() - when
    if age > UNREACHABLE_FOR_S:
        _UNREACHABLE.pop(url, None)
        return
    raise BackendError(f"{url}: not reachable: a call gave up on it {age:.0f} s ago (last error: {error}); not retried")


# ---- the engine: one event loop per process that runs every model call ----------------------------
# Stage tasks run in worker threads; routing all their calls through one loop lets them share one
# connection pool and one concurrency bound per endpoint (the embedded server answers one request
# at a time; a vLLM server wants a steady, bounded stream).
_SHARED: dict[tuple, tuple[openai.AsyncOpenAI, asyncio.Semaphore]] = {}
_INFLIGHT: dict[tuple[int, str], asyncio.Future] = {}  # (event loop, call cache key) -> its pending response
_engine_loop: asyncio.AbstractEventLoop | None = None
_engine_lock = threading.Lock()


def _engine() -> asyncio.AbstractEventLoop:
    global _engine_loop
    with _engine_lock:
        if _engine_loop is None or _engine_loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ragledger-llm-engine", daemon=True).start()
            _engine_loop = loop
        return _engine_loop


def close_clients(base_url: str | None = None) -> None:
    """Close the shared HTTP clients of one endpoint (an embedded server that stopped) or of all (process exit):
    each holds an aiohttp session, and a long-lived process (a schedule server) would otherwise keep one per
    finished run's endpoint."""
    stale = [k for k in list(_SHARED) if base_url is None or base_url in k]
    clients = [_SHARED.pop(k)[0] for k in stale]
    loop = _engine_loop
    if not clients or loop is None or loop.is_closed() or not loop.is_running():
        return

    async def close_all() -> None:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    with contextlib.suppress(Exception):  # never block or fail a shutdown over a connection pool
        asyncio.run_coroutine_threadsafe(close_all(), loop).result(timeout=10)


atexit.register(close_clients)


def run_on_engine(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of model calls on the process-wide engine loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, _engine()).result()


def _chat_body(model: str, req: LLMRequest) -> dict[str, Any]:
    """The chat-completions request body. Sent with the openai client's `post` (same auth, errors and
    response model as `chat.completions.create`) because `create` first walks every parameter through its
    typed-params transform, which does nothing to these plain values and was the largest single cost per
    request (measured, README P1)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "system", "content": req.system}, {"role": "user", "content": req.prompt}],
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_tokens": req.max_tokens,
        "seed": req.seed + req.sample_index,
        "n": 1,
    }
    if req.logprobs:
        # llama.cpp's server returns token logprobs only when top_logprobs is set
        body |= {"logprobs": True, "top_logprobs": 1}
    return body


class _Retryable(Exception):
    pass


def _transport_error(exc: openai.APIConnectionError) -> str:
    """Name a transport failure by its root cause. The aiohttp transport reports a refused connection as a
    connect *timeout* (openai.APITimeoutError), which sends a user looking at timeouts, not at a server that
    is down; the root cause (ConnectionRefusedError, a reset, a read timeout) says which it was."""
    chain, cause = [], exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not chain:
        return type(exc).__name__
    refused = any(isinstance(c, ConnectionError) for c in chain)  # refused, reset, aborted (not TimeoutError)
    kind = "APIConnectionError" if refused else type(exc).__name__
    return f"{kind} ({type(chain[-1]).__name__}: {_short(chain[-1])})"


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _retry_after(response: Any) -> float | None:
    try:
        value = response.headers.get("retry-after")
        return min(60.0, max(0.0, float(value))) if value is not None else None
    except (AttributeError, ValueError):
        return None


def _mean_logprob(choice: Any) -> float | None:
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    if not content:
        return None
    values = [t.logprob for t in content if t.logprob is not None]
    return sum(values) / len(values) if values else None


def api_key_from_env(var: str | None) -> str:
    """Read an API key by env-var name; the key itself never enters specs, params or records."""
    if not var:
        return os.environ.get("OPENAI_API_KEY", "not-needed")
    value = os.environ.get(var)
    if not value:
        raise BackendError(f"model.api_key_env names {var!r}, but that environment variable is not set")
    return value
