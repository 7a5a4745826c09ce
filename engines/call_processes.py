"""The transport of model calls: one event loop per process (the engine) that forwards every call to this
process's model-call processes (`python -m engines.model_call_process`, which says why they are processes of their own), and
those processes: started on the first call, started again if one exits, each bounding its share of the endpoint's
concurrency. The client (`engines.llm.LLMClient`) hands a call here with
`call_processes_of(loop).call(endpoint, request, cache_key, cache_path, rounds_after)` and awaits its answer."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from core.paths import REPO_ROOT  # the model-call process imports the project's packages from here
from engines.concurrency import call_process_share, call_processes_for, outstanding_bound
from engines.llm_types import BackendError, Endpoint, LLMRequest, LLMResponse
from engines.model_call_process import encode, read_message

T = TypeVar("T")

# calls to an endpoint that a call gave up on for a transport failure fail at once for this long (engines.llm_http)
UNREACHABLE_FOR_S = 60.0

# Stage tasks run in worker threads; routing all their calls through one loop and its model-call processes lets
# them share one connection pool and one concurrency bound per endpoint (the embedded server answers one request
# at a time; a vLLM server wants a steady, bounded stream).
_PROCESSES: dict[int, _CallProcesses] = {}  # event loop -> its model-call processes
_engine_loop: asyncio.AbstractEventLoop | None = None
_engine_lock = threading.Lock()


class _CallProcess:
    """The parent's end of one model-call process (`python -m engines.model_call_process`): started on the first call,
    from the engine loop's thread (which lives as long as the process, so the child's parent-death signal fires
    only when this process dies), and started again if it exits."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._starting: asyncio.Lock | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = 0
        self._reader: asyncio.Future | None = None
        self.outstanding = 0  # calls sent (or about to be) and not yet answered: how busy this process is
        self.answered = False  # it has answered a call: its imports (openai, its client: ~1 s) are done

    async def ensure_started(self) -> asyncio.subprocess.Process:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._proc is None or self._proc.returncode is not None:
                from core.processes import die_with_parent

                self._proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "engines.model_call_process", stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, preexec_fn=die_with_parent, limit=2**26,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.getenv("PYTHONPATH"))))},
                )  # fmt: skip
                self._reader = asyncio.ensure_future(self._read_answers(self._proc))
            return self._proc

    async def _read_answers(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        why = ""
        try:
            while (message := await read_message(proc.stdout)) is not None:
                call_id, ok, payload = message
                self.answered = True
                future = self._pending.pop(call_id, None)
                if future is not None and not future.done():
                    if ok:
                        future.set_result(payload)
                    else:  # a message, or a ContextOverflow as itself (engines.model_call_process.serve)
                        future.set_exception(payload if isinstance(payload, BackendError) else BackendError(payload))
        except Exception as exc:  # an unreadable answer: no call may wait forever for it
            why = f": {type(exc).__name__}: {exc}"
            proc.kill()
        code = await proc.wait()
        lost, self._pending = self._pending, {}
        for future in lost.values():
            if not future.done():
                future.set_exception(BackendError(
                    f"the model-call process ({sys.executable} -m engines.model_call_process) exited with code {code}{why} "
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


class _CallProcesses:
    """One event loop's model-call processes. An endpoint that may have n of them (`call_processes_for`) has its
    calls spread over the first n: each process bounds its share of the endpoint's concurrency, so the shares add
    up to `Endpoint.concurrency`. A call waits here while the endpoint's processes together hold the concurrency
    plus a backlog each (engines/concurrency.py), then goes to the usable one with the fewest calls outstanding (with all of
    them usable, none holds much more than its share plus the backlog). With one process every call goes to it at
    once: its call gate then orders all the waiting calls (engines/call_gate.py)."""

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
            room = self._room[ep] = asyncio.Semaphore(outstanding_bound(ep.concurrency, n))
        async with room:
            # a run's head start starts one process first and holds the others back for its endpoint until its first
            # calls left
            usable = range(min(n, self.held_from.get(ep) or n))
            i = min(self._ready(usable, ep, n) or usable, key=lambda j: self.processes[j].outstanding)
            return await self.processes[i].call(self._share(ep, i, n), req, cache_key, cache_path, rounds_after)

    def _ready(self, usable: range, ep: Endpoint, n: int) -> list[int]:
        """The usable processes that have answered a call (the first one before any has), each below its share of
        the concurrency: a call goes to one of them rather than wait for another's imports. A small run's calls
        then all go to its first process, started ahead; a large run's spread over all as the others come up."""
        warm = [j for j in usable if self.processes[j].answered] or list(usable)[:1]
        return [j for j in warm if self.processes[j].outstanding < self._share(ep, j, n).concurrency]

    def _share(self, ep: Endpoint, i: int, n: int) -> Endpoint:
        """The endpoint as process i of n bounds it: its share of the concurrency (the first ones take the rest)."""
        if n == 1:
            return ep
        if (ep, i, n) not in self._shares:
            self._shares[(ep, i, n)] = replace(ep, concurrency=call_process_share(ep.concurrency, i, n))
        return self._shares[(ep, i, n)]

    async def close_clients(self, base_url: str | None) -> None:
        await asyncio.gather(*(p.close_clients(base_url) for p in self.processes))


def consume_exception(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def start_first_call_process() -> None:
    """Start this process's first model-call process now, before any endpoint's client exists: its imports (openai,
    aiohttp: ~1 s of CPU) then overlap whatever comes before the first call (flows/head_start.py), rather than following
    it. A client's calls go to it as to one it started itself. Returns at once."""

    async def start() -> None:
        await call_processes_of(asyncio.get_running_loop()).start(1)

    asyncio.run_coroutine_threadsafe(start(), engine_loop())


def call_processes_of(loop: asyncio.AbstractEventLoop) -> _CallProcesses:
    return _PROCESSES.setdefault(id(loop), _CallProcesses())


def engine_loop() -> asyncio.AbstractEventLoop:
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
    return asyncio.run_coroutine_threadsafe(coro, engine_loop()).result()
