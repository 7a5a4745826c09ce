"""Test tool: an OpenAI-compatible chat-completions server that answers every request after a fixed delay,
with unlimited concurrency. It stands in for a fast remote inference server (vLLM) in the throughput
benchmark, so what is measured is the client side: ragledger's flow against a bare asyncio loop.

A plain asyncio HTTP/1.1 server (keep-alive, Content-Length bodies) rather than a web framework: at
640 requests/s on a 2-core machine the server's own CPU cost must stay far below the client's.
Run: python -m tests.fakes.latency_server --port 8123 --delay 0.1   (prints "ready <port>")
With `--request-log FILE` it appends one line per completion, "<arrived> <answered>" (time.time()), from which the
requests in flight at any moment of a run can be counted (docs/performance.md).

`GET /stats` answers {"requests": completions answered, "first_request_at": wall-clock time (time.time()) the
first completion request arrived, or null}; `POST /stats/reset` starts both afresh. The cold-start benchmark
uses them to time a command's first model call from outside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from typing import TextIO

ANSWER_RE = re.compile(r"Question:\s*(.+?)\s*(?:\\n|$)")


def completion_body(request: bytes) -> bytes:
    # a short, deterministic answer drawn from the question, so votes have something to count
    match = ANSWER_RE.search(request.decode("utf-8", "replace"))
    words = (match.group(1) if match else "unknown").split()
    answer = words[-1].strip("?\"\\") if words else "unknown"
    body = {
        "id": "chatcmpl-latency", "object": "chat.completion", "created": 0, "model": "latency",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": {"prompt_tokens": len(request) // 4, "completion_tokens": 2, "total_tokens": len(request) // 4 + 2},
    }
    return json.dumps(body).encode()


def _respond(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, stats: dict,
                 log: TextIO | None = None) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:].strip())
            body = await reader.readexactly(length) if length else b""
            if head.startswith((b"GET /stats", b"POST /stats/reset")):
                if head.startswith(b"POST"):
                    stats.update(requests=0, first_request_at=None)
                _respond(writer, json.dumps(stats).encode())
                await writer.drain()
                continue
            arrived = time.time()
            if stats["first_request_at"] is None:
                stats["first_request_at"] = arrived
            await asyncio.sleep(delay)
            stats["requests"] += 1
            if log is not None:
                log.write(f"{arrived:.4f} {time.time():.4f}\n")
            _respond(writer, completion_body(body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def serve(port: int, delay: float, log: TextIO | None = None) -> None:
    stats = {"requests": 0, "first_request_at": None}
    server = await asyncio.start_server(lambda r, w: handle(r, w, delay, stats, log), "127.0.0.1", port, backlog=4096,
                                        limit=2**20)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--request-log", type=argparse.FileType("a", bufsize=1), default=None)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.delay, args.request_log))
