"""The model-call process (`python -m engines.model_call_process`): a child of each ragledger process that makes
calls (the CLI's, a Dask worker's), fed through a pipe by engines/call_processes.py. It makes each call (engines/llm_http.py)
once it has claimed it in the call cache, so that no other process makes it meanwhile; a call answered or being made
elsewhere is answered from the cache.
A process whose endpoint allows many requests in flight starts more than one; each bounds its share of the
endpoint's concurrency (engines/concurrency.py).

Why a process of its own: stage tasks run in threads of the flow's process, and their CPU work (planning prompts,
validating and writing records, scoring) held the GIL while the event loop's sockets waited: the loop got the GIL
late, so its slots sat answered but unread (docs/performance.md, "Small costs behind the code"). In its own process
the loop's only work is the calls.

Protocol (both ends ragledger's own): length-prefixed pickles. Parent -> child: ("call", id, Endpoint, LLMRequest,
cache key, cache path or None, unreachable_for_s, rounds_after) and ("close", base_url). Child -> parent: (id, True,
LLMResponse) or (id, False, message), a ContextOverflow being sent as itself.
A call is written to the call cache before its answer is sent, so a call that was answered is never asked again,
whatever happens to either process afterwards.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import struct
import sys
from typing import Any

from engines.llm_http import call_endpoint, close_clients
from engines.llm_types import BackendError, ContextOverflow, Endpoint, LLMRequest, LLMResponse, cache_entry, cached_response

FRAME = struct.Struct("!I")


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return FRAME.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader) -> Any:
    """The next message, or None at the end of the stream."""
    try:
        (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
        return pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        return None


class _Caches:
    """The call caches this process writes, by path (one SQLite file per store)."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}

    def get(self, path: str | None):
        if path is None:
            return None
        if path not in self._open:
            from engines.llm_cache import LLMCallCache

            self._open[path] = LLMCallCache(path)
        return self._open[path]


CLAIM_POLL_S = 0.1  # how often a call another process is making is looked for in the cache


async def cached_call(caches: _Caches, ep: Endpoint, req: LLMRequest, cache_key: str, cache_path: str | None,
                      unreachable_for_s: float, rounds_after: int = 0) -> LLMResponse:
    cache = caches.get(cache_path)
    # the client looked the call up before sending it (engines/llm.py): the claim is refused when it has been answered
    # since, or another process is making it (experiments started together on one store), and only then is the call
    # looked up again, until its answer comes
    while cache is not None and not cache.claim(cache_key, stale_after_s=ep.timeout_s * (ep.max_retries + 1) + 60):
        hit = cache.get(cache_key)
        if hit is not None:
            return cached_response(hit)
        await asyncio.sleep(CLAIM_POLL_S)
    try:
        response = await call_endpoint(ep, req, unreachable_for_s, rounds_after)
    except BaseException:
        if cache is not None:
            cache.release(cache_key)
        raise
    if cache is not None:
        cache.put(cache_key, cache_entry(response))
    return response


async def serve(reader: asyncio.StreamReader, write) -> None:
    """Answer calls from `reader` until it ends; `write(bytes)` sends an answer back."""
    caches = _Caches()
    running: set[asyncio.Task] = set()

    async def answer(call_id: int, ep: Endpoint, req: LLMRequest, cache_key: str, cache_path: str | None,
                     unreachable_for_s: float, rounds_after: int = 0) -> None:
        try:
            response = await cached_call(caches, ep, req, cache_key, cache_path, unreachable_for_s, rounds_after)
            message = (call_id, True, response)
        except ContextOverflow as exc:
            message = (call_id, False, exc)  # as itself: the parent names the cell and question (tasks/generate.py)
        except BackendError as exc:
            message = (call_id, False, str(exc))
        except Exception as exc:  # anything else is a defect here: say what it was, keep serving the others
            message = (call_id, False, f"model-call process: {type(exc).__name__}: {exc}")
        write(encode(message))

    while (message := await read_message(reader)) is not None:
        if message[0] == "call":
            task = asyncio.ensure_future(answer(*message[1:]))
            running.add(task)
            task.add_done_callback(running.discard)
        elif message[0] == "close":
            await close_clients(message[1])
    await close_clients()


def main() -> None:
    # a Ctrl-C at the terminal reaches the run's whole process group: the run decides what it means, and this
    # process ends when the run closes its stdin or dies (the parent-death signal), without a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the answers go to the parent on the original stdout; anything else printed (a library's warning) goes to
    # stderr, so it can never corrupt a frame
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # what the first call needs, imported before it comes (a second on a busy machine): the process is started ahead
    # of the first calls (engines/llm.py `start_call_processes`)
    import aiohttp  # noqa: F401
    import httpcore2  # noqa: F401  (the client's transport imports it, and trio with it, when the first client is made)
    import openai  # noqa: F401

    import engines.llm_cache  # noqa: F401

    async def run() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**26)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        transport, _ = await loop.connect_write_pipe(asyncio.Protocol, out)
        await serve(reader, transport.write)
        transport.close()

    asyncio.run(run())


if __name__ == "__main__":
    # run as the module's own name, not __main__, so what it pickles (LLMResponse) unpickles in the parent
    from engines import model_call_process

    model_call_process.main()

