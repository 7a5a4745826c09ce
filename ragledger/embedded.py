"""Start and stop the embedded OpenAI-compatible server (llama.cpp via llama-cpp-python[server]).

ragledger talks to it exactly as to vLLM or OpenAI: through `LLMClient` with its base_url.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from ragledger.models import ensure_model
from ragledger.processes import stop_child


class EmbeddedServerError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def embedded_server(
    model_name: str, context_window: int = 4096, log_dir: Path | None = None, log=print, logits_all: bool = False
) -> Iterator[str]:
    """Run the embedded server for the duration of the block; yield its base_url.

    `logits_all` makes llama.cpp keep every position's logits, which it needs to return token
    log-probabilities (REFEED's ensemble); it costs memory (a context x vocabulary float buffer), so it
    is on only when a strategy of the run asks for log-probabilities."""
    if not llama_server_available():
        raise EmbeddedServerError(
            "the embedded backend needs llama-cpp-python[server]; run `bash infra/setup.sh` (README, command 1)"
        )
    model_path = ensure_model(model_name, log=log)
    port = _free_port()
    cmd = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model_path),
        "--model_alias", model_name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(context_window),
        "--n_threads", str(os.cpu_count() or 2),
        "--logits_all", "true" if logits_all else "false",  # without it llama.cpp refuses logprobs (HTTP 500)
    ]  # fmt: skip
    log_dir = log_dir or Path(".ragledger/logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"embedded-server-{port}.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        base_url = f"http://127.0.0.1:{port}/v1"
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-1500:]
                    raise EmbeddedServerError(f"embedded server exited with {proc.returncode}; log {log_path}:\n{tail}")
                try:
                    if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EmbeddedServerError(f"embedded server did not answer within 180 s; log {log_path}")
                time.sleep(0.5)
            yield base_url
        finally:
            stop_child(proc, grace_s=15)
