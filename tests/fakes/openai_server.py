"""Test tool: an OpenAI-compatible chat-completions server with scripted answers and injected faults.

It stands in for a remote service (vLLM / OpenAI) in tests only; the same client code path is also
tested against the real embedded model. Runs uvicorn in a background thread on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.servers import free_port


@dataclass
class Faults:
    """Fault rates in [0, 1]; each request draws once (seeded) to pick at most one fault."""

    http_500: float = 0.0
    http_429: float = 0.0
    retry_after_s: float = 0.05
    hang: float = 0.0
    hang_s: float = 5.0
    malformed: float = 0.0
    empty: float = 0.0
    seed: int = 0


@dataclass
class ScriptedServer:
    answer: Callable[[str, str, dict], str] = lambda system, prompt, body: "unknown"
    faults: Faults = field(default_factory=Faults)
    delay_s: float = 0.0
    logprob: float | None = -0.5
    # per-request token logprob (system, prompt, answer text) -> one value for every token, or one per token
    # (tokens: the text cut before each run of whitespace, " Denver", " Broncos"); overrides `logprob` when set
    logprob_fn: Callable[[str, str, str], float | list[float] | None] | None = None
    requests: list[dict] = field(default_factory=list)
    faults_injected: dict[str, int] = field(default_factory=dict)
    max_in_flight: int = 0  # the most requests the server held at once (client-side concurrency bounds)
    bodies_received: list[bytes] = field(default_factory=list)  # every request's body, faulted or not, in order

    def __post_init__(self) -> None:
        self._rng = random.Random(self.faults.seed)
        self._in_flight = 0
        self._lock = threading.Lock()
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                Route("/v1/models", self._models, methods=["GET"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    @property
    def calls(self) -> int:
        return len(self.requests)

    @property
    def repeats(self) -> int:
        """Requests whose body the server had received before: the client's retries as seen on the wire (an injected
        fault, or an answer that reached the client after its timeout on a loaded machine)."""
        return len(self.bodies_received) - len(set(self.bodies_received))

    def _pick_fault(self) -> str | None:
        f = self.faults
        with self._lock:
            x = self._rng.random()
        for name, rate in (("http_500", f.http_500), ("http_429", f.http_429), ("hang", f.hang),
                           ("malformed", f.malformed), ("empty", f.empty)):
            if x < rate:
                self.faults_injected[name] = self.faults_injected.get(name, 0) + 1
                return name
            x -= rate
        return None

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        self._in_flight += 1  # one event loop: no lock needed
        self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            return await self._answer(request)
        finally:
            self._in_flight -= 1

    async def _answer(self, request: Request) -> Response:
        raw = await request.body()
        self.bodies_received.append(raw)
        body = json.loads(raw)
        fault = self._pick_fault()
        if fault == "http_500":
            return JSONResponse({"error": {"message": "injected"}}, status_code=500)
        if fault == "http_429":
            return JSONResponse({"error": {"message": "slow down"}}, status_code=429,
                                headers={"Retry-After": str(self.faults.retry_after_s)})
        if fault == "hang":
            await asyncio.sleep(self.faults.hang_s)
        if fault == "malformed":
            return Response('{"id": "x", "choices": [{"index": 0, "message": {"role": "assist', media_type="application/json")
        messages = body.get("messages", [])
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        prompt = next((m["content"] for m in messages if m["role"] == "user"), "")
        self.requests.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        text = self.answer(system, prompt, body)
        logprob = self.logprob_fn(system, prompt, text) if self.logprob_fn is not None else self.logprob
        tokens = re.findall(r"\s*\S+", text)
        values = logprob if isinstance(logprob, list) else [logprob] * len(tokens)
        choices = [] if fault == "empty" else [{
            "index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text},
            "logprobs": ({"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                                      for t, lp in zip(tokens, values, strict=True)]}
                         if body.get("logprobs") and logprob is not None else None),
        }]  # fmt: skip
        payload = {"id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                   "model": body.get("model"),
                   "choices": choices, "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
                                                 "total_tokens": len(prompt.split()) + len(text.split())}}
        return Response(json.dumps(payload), media_type="application/json")

