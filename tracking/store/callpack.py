"""Call packs: an experiment's LLM calls (cache key, what was asked, the response with its usage and token
log-probabilities) in one file, so another machine can fill its LLM-call cache and rerun or extend the experiment
without calling the model again for the calls already made.

Format: gzip'd JSON lines. The first line is a header (format, version, experiment, number of calls, sha256 of the
lines after it); each further line is one call `{"key", "request", "response"}`. The response is the cache entry as
`engines.llm_cache` stores it, so importing is a plain insert under the same key. The header's checksum catches a
truncated or altered pack before anything is imported. Written with gzip mtime 0: the same calls give the same bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engines.llm_cache import LLMCallCache

FORMAT = "ragledger-callpack"
VERSION = 1
ARTIFACT = "callpack/calls.jsonl.gz"  # where a parent run keeps its pack (tracking/mlflow/views.py)
CACHE_FILE = "llm_cache.sqlite"  # the store's call cache (tasks/context.py opens <store>/llm_cache.sqlite)
KEY_PATTERN = re.compile(r"^[0-9a-f]{16,64}$")
# the fields of engines.llm_types.LLMResponse a cache entry holds (from_cache is set on reading)
RESPONSE_REQUIRED = ("text", "mean_logprob", "tokens_in", "tokens_out", "latency_ms")
RESPONSE_FIELDS = frozenset((*RESPONSE_REQUIRED, "retries", "token_logprobs"))


class CallPackError(ValueError):
    """A pack that cannot be read or imported; the message names the file and, where it can, the line."""


@dataclass
class CallPack:
    header: dict[str, Any]
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ImportResult:
    calls: int  # in the pack
    added: int  # new to the cache
    present: int  # already cached (kept as they were)


def cache_path(store_root: str | Path) -> Path:
    return Path(store_root) / CACHE_FILE


def build(cache: LLMCallCache, calls: dict[str, dict[str, Any]],
          header: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The pack of `calls` (key -> request) whose responses are in `cache`: (gzip'd bytes, header). Calls missing
    from the cache (it was deleted, or another store made them) are counted in the header, not packed."""
    responses = cache.get_many(calls)
    lines = [json.dumps({"key": k, "request": calls[k], "response": responses[k]}, sort_keys=True, ensure_ascii=False)
             for k in sorted(responses)]
    body = "".join(line + "\n" for line in lines).encode("utf-8")
    head = {"format": FORMAT, "version": VERSION, **(header or {}), "calls": len(lines),
            "missing_from_cache": len(calls) - len(responses), "sha256": hashlib.sha256(body).hexdigest(),
            "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    data = (json.dumps(head, sort_keys=True) + "\n").encode("utf-8") + body
    return gzip.compress(data, mtime=0), head


def build_all(cache: LLMCallCache, header: dict[str, Any] | None = None) -> tuple[bytes, dict[str, Any]]:
    """The pack of every call in `cache` (no request details: a whole cache does not say which records asked)."""
    return build(cache, {k: {} for k in cache.all_keys()}, header)


def write(path: str | Path, data: bytes) -> None:
    """Write a pack aside and rename it into place: a reader never finds half a pack."""
    import os

    from core.atomic import temp_path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path.parent, ".gz")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read(path: str | Path) -> CallPack:
    """Read and check a pack: format, checksum, and every line's key and response fields."""
    path = Path(path)
    try:
        raw = gzip.decompress(path.read_bytes())
    except FileNotFoundError:
        raise CallPackError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise CallPackError(f"{path}: not a readable call pack (gzip: {exc})") from None
    head_line, _, body = raw.partition(b"\n")
    try:
        header = json.loads(head_line)
    except ValueError:
        raise CallPackError(f"{path}: not a call pack (line 1 is not a JSON header)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CallPackError(f"{path}: not a call pack (line 1 has no format {FORMAT!r})")
    if header.get("version") != VERSION:
        raise CallPackError(f"{path}: call pack version {header.get('version')!r}; this ragledger reads version {VERSION}")
    if hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise CallPackError(f"{path}: checksum mismatch (the pack was truncated or altered after it was written)")
    pack = CallPack(header)
    for n, line in enumerate(body.decode("utf-8").splitlines(), start=2):
        try:
            entry = json.loads(line)
        except ValueError:
            raise CallPackError(f"{path}: line {n} is not JSON") from None
        problem = _entry_problem(entry)
        if problem:
            raise CallPackError(f"{path}: line {n}: {problem}")
        pack.calls.append(entry)
    if len(pack.calls) != header.get("calls"):
        raise CallPackError(f"{path}: header says {header.get('calls')} calls, the pack holds {len(pack.calls)}")
    return pack


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "not a JSON object"
    if not isinstance(entry.get("key"), str) or not KEY_PATTERN.match(entry["key"]):
        return f"key {entry.get('key')!r} is not a call cache key"
    response = entry.get("response")
    if not isinstance(response, dict):
        return "response is not an object"
    missing = [f for f in RESPONSE_REQUIRED if f not in response]
    if missing:
        return f"response lacks {', '.join(missing)}"
    unknown = sorted(set(response) - RESPONSE_FIELDS)
    if unknown:
        return f"response has unknown field(s) {', '.join(unknown)}"
    if not isinstance(response["text"], str):
        return "response text is not a string"
    return None


def import_into(pack: CallPack, cache: LLMCallCache) -> ImportResult:
    """Insert a checked pack's calls; a key already cached keeps its response (same key, same call)."""
    added = cache.put_many((c["key"], c["response"]) for c in pack.calls)
    return ImportResult(len(pack.calls), added, len(pack.calls) - added)


def import_file(path: str | Path, cache: LLMCallCache) -> ImportResult:
    return import_into(read(path), cache)
