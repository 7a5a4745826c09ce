"""The model endpoint of a run: started at most once, and only when a task that calls the model must run.

An experiment flow opens one with `model_endpoint`; a sweep opens `shared_endpoint` around its experiment
subflows, and they use it instead of their own, so the embedded server starts once per sweep (a few seconds
to a minute each time on a CPU), and not at all when every model call comes from a cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from schemas.spec import AnySpec, ModelSpec


class ModelEndpoint:
    def __init__(self, model: ModelSpec, base_url: str | None = None, logprobs: bool = False) -> None:
        self.model = model
        self.base_url = base_url  # an endpoint given from outside (--base-url): never started here
        self.logprobs = logprobs
        self._url: str | None = None
        self._logprobs_url: str | None = None  # the embedded backend's second server, for log-probability calls
        self._stack = contextlib.ExitStack()

    def url(self) -> str:
        """The endpoint's URL, starting the embedded server on first use."""
        if self.base_url is not None:
            return self.base_url
        if self._url is None:
            if self.model.backend == "embedded":
                from engines.embedded import embedded_endpoints

                started = self._stack.enter_context(
                    embedded_endpoints(self.model.embedded_model, self.model.context_window, needs_logprobs=self.logprobs))
                self._url, self._logprobs_url = started.base_url, started.logprobs_url
            else:
                self._url = self.model.base_url or ""
        return self._url

    def logprobs_url(self) -> str | None:
        """Where log-probability calls go when it is not `url()` (the embedded server started with logits_all)."""
        return self._logprobs_url

    def prompt_tokens_evaluated(self) -> int | None:
        """The prompt tokens the embedded servers of this endpoint evaluated so far, by their own report (llama.cpp
        evaluates only what differs from the previous prompt); None for other backends or a server not started."""
        if self.base_url is not None or self._url is None or self.model.backend != "embedded":
            return None
        from engines.embedded import prompt_tokens_evaluated

        counts = [prompt_tokens_evaluated(u) for u in (self._url, self._logprobs_url) if u]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def known_url(self) -> str:
        """The URL without starting anything, for tasks whose results come from the cache (they make no call)."""
        return self.base_url or self._url or self.model.base_url or ""

    def serves(self, model: ModelSpec, base_url: str | None, logprobs: bool) -> bool:
        # a server started without log-probabilities cannot serve a run that needs them; the reverse is fine
        return model == self.model and base_url == self.base_url and (self.logprobs or not logprobs)


_shared: ContextVar[ModelEndpoint | None] = ContextVar("ragledger_shared_endpoint", default=None)


def needs_logprobs(spec: AnySpec) -> bool:
    """Log-probabilities cost the embedded server time and memory (a second server with logits_all serves those
    calls): only when a reader of the spec needs them."""
    from strategies.readers import get_reader

    return any(get_reader(e.name).needs_logprobs for e in spec.reader_entries())


@contextlib.contextmanager
def model_endpoint(spec: AnySpec, base_url: str | None = None) -> Iterator[ModelEndpoint]:
    """The enclosing sweep's endpoint when it serves this spec's model; otherwise one of the block's own,
    stopped when the block ends."""
    logprobs = needs_logprobs(spec)
    shared = _shared.get()
    if shared is not None and shared.serves(spec.model, base_url, logprobs):
        yield shared
        return
    endpoint = ModelEndpoint(spec.model, base_url, logprobs)
    with endpoint._stack:  # exits a started server with the block's error, so a server that died can name the cause
        yield endpoint


@contextlib.contextmanager
def shared_endpoint(spec: AnySpec, base_url: str | None = None) -> Iterator[ModelEndpoint]:
    """One endpoint for every `model_endpoint` opened inside the block (a sweep's experiments)."""
    with model_endpoint(spec, base_url) as endpoint:
        token = _shared.set(endpoint)
        try:
            yield endpoint
        finally:
            _shared.reset(token)
