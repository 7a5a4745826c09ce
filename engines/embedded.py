"""Start and stop the embedded OpenAI-compatible server (llama.cpp via llama-cpp-python[server]).

ragledger talks to it exactly as to vLLM or OpenAI: through `LLMClient` with its base_url.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from core.processes import die_with_parent, stop_child
from engines.models import bundled_model, ensure_model


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


PROMPT_BATCH = 64


@contextlib.contextmanager
def embedded_server(
    model_name: str, context_window: int = 4096, log_dir: Path | None = None, log=print, logits_all: bool = False
) -> Iterator[str]:
    """Run the embedded server for the duration of the block; yield its base_url.

    `logits_all` makes llama.cpp keep every position's logits, which it needs to return token
    log-probabilities (REFEED's ensemble); it costs time and memory (a context x vocabulary float buffer),
    so a run starts a second server with it for the calls that ask for log-probabilities only
    (`embedded_endpoints`). Flash attention is on: ~15-20% faster prompt evaluation here, same model."""
    if not llama_server_available():
        raise EmbeddedServerError(
            "the embedded backend needs llama-cpp-python[server]; run `bash infra/setup.sh` (README, command 1)"
        )
    model_path = ensure_model(model_name, log=log)
    served = bundled_model(model_name).call_name  # what the run's calls ask for (engines.llm_types.served_name)
    port = _free_port()
    cmd = _server_command(model_path, served, port, context_window, logits_all)
    log_dir = log_dir or Path(".ragledger/logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"embedded-server-{port}.log"
    with log_path.open("wb") as log_file:
        # its own session (a Ctrl-C of the run reaches it through stop_child, in order); and it dies with the run
        # even when the run is SIGTERMed or SIGKILLed, which skips stop_child: two orphaned servers kept the CPU
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)
        base_url = f"http://127.0.0.1:{port}/v1"
        try:
            _wait_until_ready(proc, base_url, log_path)
            _first_completion(base_url, served, proc, log_path)
            _SERVER_LOGS[base_url] = (log_path, log_path.stat().st_size)  # what the run's calls evaluate starts here
            try:
                yield base_url
            except Exception as exc:
                # a server that died under the run shows up as refused connections: say what really happened
                if proc.poll() is not None:
                    raise EmbeddedServerError(died_message(proc.returncode, log_path)) from exc
                raise
        finally:
            from engines.llm import close_clients

            close_clients(base_url)  # its connections die with it
            stop_child(proc, grace_s=15)


def _server_command(model_path: Path, served: str, port: int, context_window: int, logits_all: bool) -> list[str]:
    return [
        sys.executable, "-m", "engines.llama_server",  # llama-cpp-python's server, prefix reuse batch-aligned
        "--model", str(model_path),
        "--model_alias", served,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", str(context_window),
        "--n_threads", str(os.cpu_count() or 2),
        "--logits_all", "true" if logits_all else "false",  # without it llama.cpp refuses logprobs (HTTP 500)
        "--flash_attn", "true",
        # the batch a prompt is evaluated in, which is also what a reused prefix is rounded down to
        # (engines/llama_server.py): 64 keeps most of the reuse; prompts evaluate 13-15% slower than in llama.cpp's
        # default 512 (docs/performance.md, tests/benchmarks/test_prompt_batch.py)
        "--n_batch", str(PROMPT_BATCH), "--n_ubatch", str(PROMPT_BATCH),
    ]  # fmt: skip


def _wait_until_ready(proc: subprocess.Popen, base_url: str, log_path: Path, timeout_s: float = 180) -> None:
    """Until the server answers /models; EmbeddedServerError naming how it died, or that it did not answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise EmbeddedServerError(died_message(proc.returncode, log_path))
        try:
            if httpx.get(f"{base_url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise EmbeddedServerError(f"embedded server did not answer within {timeout_s:.0f} s; log {log_path}")
        time.sleep(0.5)


# llama.cpp reports, after each completion, how many prompt tokens it evaluated: with the previous prompt's prefix
# still in its KV cache, only the rest (llama_cpp.Llama.generate: "N prefix-match hit, remaining M prompt tokens")
_PROMPT_EVAL = re.compile(rb"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")
_SERVER_LOGS: dict[str, tuple[Path, int]] = {}  # base_url -> (its log, the log's size when the run got the server)


def prompt_tokens_evaluated(base_url: str) -> int | None:
    """The prompt tokens the embedded server at `base_url` evaluated for the calls it answered, from its own
    per-completion report in its log (after the start-up check); None for a server this process did not start."""
    entry = _SERVER_LOGS.get(base_url)
    if entry is None:
        return None
    path, start = entry
    try:
        with path.open("rb") as f:
            f.seek(start)
            return sum(int(n) for n in _PROMPT_EVAL.findall(f.read()))
    except OSError:
        return None


def died_message(returncode: int | None, log_path: Path) -> str:
    """Why the server process ended, in words a user can act on, with the end of its log."""
    tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
    if returncode is not None and returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    hint = ""
    if returncode == -signal.SIGILL:
        hint = ("; SIGILL: this llama-cpp-python build uses CPU instructions this machine lacks. Rebuild it for this CPU: "
                "`.venv/bin/pip uninstall -y llama-cpp-python && bash infra/setup.sh` (the build picks instruction sets "
                "from /proc/cpuinfo; RAGLEDGER_LLAMA_VARIANT=avx2 forces the conservative one)")
    elif returncode == -signal.SIGSEGV:
        hint = ("; SIGSEGV: a llama.cpp build problem (docs/operations.md, Troubleshooting); "
                "RAGLEDGER_LLAMA_VARIANT=avx2 is the safe build")
    # the cause and its fix on the first line: a failed run's error line is the message's first line (the rest,
    # the log's tail, goes to the run log)
    return f"the embedded model server {how}; log {log_path}{hint}\n{tail}"


def _first_completion(base_url: str, model_name: str, proc: subprocess.Popen, log_path: Path) -> None:
    """One one-token completion before the run relies on the server: /models answers before any model code has
    run, so a build that crashes on its first matrix multiply (an instruction this CPU lacks) is caught here,
    with its cause, rather than as refused connections in the middle of a run."""
    body = {"model": model_name, "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1, "temperature": 0}
    try:
        httpx.post(f"{base_url}/chat/completions", json=body, timeout=120).raise_for_status()
    except httpx.HTTPError as exc:
        time.sleep(0.5)  # let a crashed process be reaped, so its signal is known
        if proc.poll() is not None:
            raise EmbeddedServerError(died_message(proc.returncode, log_path)) from None
        raise EmbeddedServerError(f"the embedded model server failed its first completion ({exc}); log {log_path}") from None


@dataclass(frozen=True)
class Endpoints:
    """Where a run's model calls go: `base_url` for every call, `logprobs_url` (if set) for the calls that
    ask for token log-probabilities."""

    base_url: str
    logprobs_url: str | None = None


@contextlib.contextmanager
def embedded_endpoints(
    model_name: str, context_window: int = 4096, needs_logprobs: bool = False, log=print
) -> Iterator[Endpoints]:
    """The embedded model for a run: one server without `logits_all` for ordinary calls and, only when a
    reader of the run needs log-probabilities, a second one with it for those calls. Measured on the 0.5B
    model (2 cores, ~1,000-token prompt): 160 tok/s prompt evaluation without logits_all, 110 with it, so
    sending every call of a mixed run to a logits_all server made all readers pay for REFEED's ensemble.
    The client serialises calls across both servers (one CPU), see LLMClient."""
    attached = attached_endpoints(model_name, context_window, needs_logprobs)
    if attached is not None:
        yield attached
        return
    with contextlib.ExitStack() as stack:
        base_url = stack.enter_context(embedded_server(model_name, context_window, log=log))
        logprobs_url = None
        if needs_logprobs:
            logprobs_url = stack.enter_context(embedded_server(model_name, context_window, log=log, logits_all=True))
        yield Endpoints(base_url, logprobs_url)


ATTACH_ENV = "RAGLEDGER_EMBEDDED_SERVERS"


def attach_value(model_name: str, context_window: int, base_url: str, logprobs_url: str | None) -> str:
    """What `ATTACH_ENV` holds for servers this process started with `embedded_server`: their URLs, the model and
    context they serve, and their logs (for `prompt_tokens_evaluated`)."""
    servers = [u for u in (base_url, logprobs_url) if u]
    return json.dumps({"model": model_name, "context_window": context_window, "base_url": base_url,
                       "logprobs_url": logprobs_url, "logs": {u: str(_SERVER_LOGS[u][0]) for u in servers}})


def attached_endpoints(model_name: str, context_window: int, needs_logprobs: bool) -> Endpoints | None:
    """Embedded servers already running, named in $RAGLEDGER_EMBEDDED_SERVERS (`attach_value`), when they serve this
    model and context (and log-probabilities if needed); None otherwise, and the run starts its own. The test
    suite starts one pair for all its real-model runs this way (tests/conftest.py `embedded_servers`): what differs
    between runs is the spec, not the server, and each start loads the model and answers a first completion."""
    raw = os.environ.get(ATTACH_ENV)
    if not raw:
        return None
    try:
        given = json.loads(raw)
        fits = (given["model"] == model_name and given["context_window"] == context_window
                and (given["logprobs_url"] or not needs_logprobs))
        if not fits:
            return None
        for url, path in given["logs"].items():
            _SERVER_LOGS[url] = (Path(path), Path(path).stat().st_size)  # what this run's calls evaluate starts here
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise EmbeddedServerError(f"{ATTACH_ENV} does not name running embedded servers ({exc})") from None
    return Endpoints(given["base_url"], given["logprobs_url"] if needs_logprobs else None)
