"""How one model call reaches an OpenAI-compatible endpoint: `call_endpoint` sends one chat completion with the
`openai` client (aiohttp transport): bounded concurrency per endpoint (a CallGate, engines/call_gate.py), bounded
retries with exponential backoff, jitter and Retry-After, and a breaker that fails queued calls at once after a
transport give-up. It runs in a model-call process (engines/model_call_process.py), never in a process that runs
stage tasks; the server dialects (vLLM, llama.cpp, OpenAI) are read here.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from engines.call_gate import CallGate, admission_log_from_env, prefix_order_enabled
from engines.llm_types import BackendError, ContextOverflow, Endpoint, LLMRequest, LLMResponse

# ---- one call --------------------------------------------------------------------------------------------

_SHARED: dict[tuple, tuple[Any, CallGate]] = {}


def _shared(ep: Endpoint, logprobs: bool = False) -> tuple[Any, CallGate]:
    """One HTTP client and one concurrency bound (a CallGate: prefix-ordered with one slot) per endpoint, shared
    by every call in the process; `ep.concurrency` is this process's share (engines/concurrency.py).
    Calls routed to `logprobs_base_url` share the main endpoint's bound: both servers run on one machine."""
    key = (ep.base_url, ep.api_key, ep.concurrency, ep.timeout_s)
    if key not in _SHARED:
        _SHARED[key] = (_openai(ep, ep.base_url), CallGate(ep.concurrency, prefix_order_enabled(), admission_log_from_env()))
    client, gate = _SHARED[key]
    if logprobs and ep.logprobs_base_url:
        lp_key = ("logprobs", ep.logprobs_base_url, *key)
        if lp_key not in _SHARED:
            _SHARED[lp_key] = (_openai(ep, ep.logprobs_base_url), gate)
        client = _SHARED[lp_key][0]
    return client, gate


def _openai(ep: Endpoint, url: str) -> Any:
    import openai

    # the openai client's aiohttp transport (extra `openai[aiohttp]`), not its default httpx one: less CPU per request
    # (docs/performance.md, P1); at hundreds of requests per second the client's CPU, not the server, bounded a run
    return openai.AsyncOpenAI(base_url=url, api_key=ep.api_key, max_retries=0, timeout=ep.timeout_s,
                              http_client=openai.DefaultAioHttpClient(timeout=ep.timeout_s))


async def call_endpoint(ep: Endpoint, req: LLMRequest, unreachable_for_s: float, rounds_after: int = 0) -> LLMResponse:
    client, gate = _shared(ep, req.logprobs)
    async with gate.slot(f"{req.system}\x00{req.prompt}", str(client.base_url), rounds_after):
        return await _call_with_retries(ep, client, req, unreachable_for_s)


async def _call_with_retries(ep: Endpoint, client: Any, req: LLMRequest, unreachable_for_s: float) -> LLMResponse:
    import json

    import openai

    from core.secrets import redact_url

    url = str(client.base_url)
    shown = redact_url(ep.base_url)  # the specs refuse URL credentials; an Endpoint built otherwise may carry them
    last_error, transport_failure = "", False
    for attempt in range(ep.max_retries + 1):
        _fail_if_unreachable(url, unreachable_for_s)
        started = time.perf_counter()
        try:
            # the body as parsed JSON (`cast_to=object`), not a ChatCompletion model: building that model is a fifth
            # of a call's instructions here (docs/performance.md), and only four of its fields are read (`_answer_of`)
            body = await client.post("/chat/completions", body=_chat_body(ep.model, req), cast_to=object)
            response = _response(body, req.logprobs, started, attempt)
            _UNREACHABLE.pop(url, None)
            return response
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status == 400 and _is_context_overflow(exc):
                raise ContextOverflow(f"the prompt does not fit the model's context: {_server_message(exc)} ({shown}, "
                                      f"HTTP 400, not retried)") from None
            if status in (400, 401, 403, 404, 422):
                raise BackendError(f"{shown}: HTTP {status} (not retried): {_short(exc)}") from None
            last_error, transport_failure = f"HTTP {status}", False
            delay = _retry_after(exc.response) if status == 429 else None
        except (openai.APITimeoutError, openai.APIConnectionError) as exc:
            last_error, transport_failure = _transport_error(exc), True
            delay = None
            if ep.local_server and _refused(exc):
                break
        except (_Retryable, openai.APIResponseValidationError, json.JSONDecodeError) as exc:
            # malformed or truncated bodies, empty completions: what the server sent
            last_error, transport_failure = f"malformed response: {_short(exc)}", False
            delay = None
        except Exception as exc:
            # the request never left this process (the aiohttp transport refuses a URL with credentials beside the
            # Authorization header, a URL it cannot parse, ...): retrying gives the same, and it is no malformed response
            raise BackendError(f"{shown}: the request could not be sent (client-side {type(exc).__name__}, not "
                               f"retried): {redact_url(_short(exc))}") from None
        if attempt == ep.max_retries:
            break
        await asyncio.sleep(delay if delay is not None else _backoff(ep, attempt))
    attempts = f"{attempt + 1} attempt{'s' if attempt else ''}"
    if transport_failure:
        _UNREACHABLE[url] = (time.monotonic(), last_error, attempts)
    raise BackendError(f"{shown}: gave up after {attempts}; last error: {last_error}")


def _response(body: Any, logprobs: bool, started: float, attempt: int) -> LLMResponse:
    text, tokens, tokens_in, tokens_out = _answer_of(body, logprobs)
    return LLMResponse(text=text, mean_logprob=sum(lp for _, lp in tokens) / len(tokens) if tokens else None,
                       tokens_in=tokens_in, tokens_out=tokens_out, latency_ms=(time.perf_counter() - started) * 1000,
                       retries=attempt, token_logprobs=tokens)


def _backoff(ep: Endpoint, attempt: int) -> float:
    """Exponential backoff with jitter (a server's Retry-After, when it sent one, is used instead)."""
    return min(ep.backoff_max_s, ep.backoff_base_s * 2**attempt) * (0.5 + random.random())


# An endpoint that a call gave up on for a transport failure (refused, reset, timed out: a server that is down
# or hung, not one answering errors): calls to it in the next `unreachable_for_s` fail at once. Without this each
# queued call spent its own retries and their backoff while holding a concurrency slot, so a run whose embedded
# server died took many minutes to fail. A later run (a schedule server's next one) tries the endpoint again.
# endpoint URL -> (when a call gave up on it, its last error, its attempts)
_UNREACHABLE: dict[str, tuple[float, str, str]] = {}


def _fail_if_unreachable(url: str, unreachable_for_s: float) -> None:
    down = _UNREACHABLE.get(url)
    if down is None:
        return
    when, error, attempts = down
    age = time.monotonic() - when
    if age > unreachable_for_s:
        _UNREACHABLE.pop(url, None)
        return
    from core.secrets import redact_url

    # the attempts are named: a run may end on this line rather than on the give-up it refers to
    raise BackendError(f"{redact_url(url)}: not reachable: a call gave up on it {age:.0f} s ago after {attempts} "
                       f"(last error: {error}); not retried")


def _chat_body(model: str, req: LLMRequest) -> dict[str, Any]:
    """The chat-completions request body. Sent with the openai client's `post` (same auth, errors and
    response model as `chat.completions.create`) because `create` first walks every parameter through its
    typed-params transform, which does nothing to these plain values and was the largest single cost per
    request (measured: docs/performance.md, P1)."""
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


def _causes(exc: BaseException) -> list[BaseException]:
    chain, cause = [], exc.__cause__ or exc.__context__
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def _refused(exc: BaseException) -> bool:
    return any(isinstance(c, ConnectionRefusedError) for c in _causes(exc))


def _transport_error(exc: Any) -> str:
    """Name a transport failure by its root cause. The aiohttp transport reports a refused connection as a
    connect *timeout* (openai.APITimeoutError), which sends a user looking at timeouts, not at a server that
    is down; the root cause (ConnectionRefusedError, a reset, a read timeout) says which it was."""
    chain = _causes(exc)
    if not chain:
        return type(exc).__name__
    refused = any(isinstance(c, ConnectionError) for c in chain)  # refused, reset, aborted (not TimeoutError)
    kind = "APIConnectionError" if refused else type(exc).__name__
    return f"{kind} ({type(chain[-1]).__name__}: {_short(chain[-1])})"


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _server_message(exc: Any) -> str:
    """The error body's own message, whole and on one line (vLLM's context error runs past `_short`'s 200
    characters, and its figures are at the end)."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message.strip():
        return _short(exc)
    return " ".join(message.split())[:600]


def _is_context_overflow(exc: Any) -> bool:
    """Whether an HTTP 400 says the prompt is longer than the context window. The servers' bodies, as they answer
    the same over-long request (tests/test_vllm_server.py; tests/test_server_dialects.py replays both):
    vLLM 0.32: {"message": "This model's maximum context length is 2048 tokens. However, your prompt contains at least
    2049 input tokens, ...", "type": "BadRequestError", "param": "input_tokens", "code": 400};
    llama.cpp (llama-cpp-python): {"message": "This model's maximum context length is 2048 tokens. However, you
    requested 2542 tokens (2530 in the messages, 12 in the completion). ...", "code": "context_length_exceeded"};
    OpenAI: code "context_length_exceeded"."""
    body = getattr(exc, "body", None)
    if not isinstance(body, dict):
        return False
    message = str(body.get("message") or "").lower()
    return (body.get("code") == "context_length_exceeded" or "maximum context length" in message
            or "context window" in message or body.get("param") == "input_tokens")


def _retry_after(response: Any) -> float | None:
    try:
        value = response.headers.get("retry-after")
        return min(60.0, max(0.0, float(value))) if value is not None else None
    except (AttributeError, ValueError):
        return None


def _answer_of(body: Any, logprobs: bool) -> tuple[str, list[tuple[str, float]] | None, int, int]:
    """(text, token log-probabilities, prompt tokens, completion tokens) of a chat-completion body; a body of
    another shape (no choices, no message content, a text that is not JSON) is a malformed response: retried."""
    if not isinstance(body, dict):  # the client returns the text of a body that is not JSON
        raise _Retryable(f"not a JSON object: {str(body)[:80]!r}")
    if not body.get("choices"):
        raise _Retryable("response has no choices")
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"]
        usage = body.get("usage") or {}
        tokens_in, tokens_out = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        tokens = _token_logprobs(choice) if logprobs else None
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise _Retryable(f"not a chat completion ({type(exc).__name__}: {exc})") from None
    if not isinstance(text, str):
        raise _Retryable("response has no message content")
    return text, tokens, tokens_in, tokens_out


def _token_logprobs(choice: dict[str, Any]) -> list[tuple[str, float]] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    entries = [t for t in content if t.get("logprob") is not None]
    # vLLM lists the token that ended the answer (Qwen's "<|im_end|>") after the answer's tokens, though the text
    # does not contain it; llama.cpp does not list it. Dropped, so an output's mean log-probability is over the
    # same tokens on both (tests/test_server_dialects.py)
    text = choice["message"]["content"] or ""
    if len(entries) > 1 and _spelled(entries) != text and _spelled(entries[:-1]) == text:
        entries = entries[:-1]
    pairs = [(t.get("token") or "", float(t["logprob"])) for t in entries]
    return pairs or None


def _spelled(entries: list[dict[str, Any]]) -> str:
    """The text a list of logprob entries spells: from their bytes where the server gives them (vLLM; a character
    split over two tokens has half of its bytes in each), else from their token strings (llama.cpp gives no bytes)."""
    if all(t.get("bytes") is not None for t in entries):
        return bytes(b for t in entries for b in t["bytes"]).decode("utf-8", errors="replace")
    return "".join(t.get("token") or "" for t in entries)


async def close_clients(base_url: str | None = None) -> None:
    """Close the HTTP clients of one endpoint (an embedded server that stopped) or of all: each holds an aiohttp
    session, and a long-lived process (a schedule server) would otherwise keep one per finished run's endpoint."""
    stale = [k for k in list(_SHARED) if base_url is None or base_url in k]
    clients = [_SHARED.pop(k)[0] for k in stale]
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
