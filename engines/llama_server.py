"""The embedded model's server: llama-cpp-python's own, with its prompt-prefix reuse aligned to whole batches.

llama-cpp-python keeps the previous request's tokens in the KV cache and evaluates only the part of a new prompt
that differs (`Llama.generate`). On the CPU the logits then depend on where that part starts: llama.cpp evaluates a
prompt in batches, and its matrix kernels group a batch's rows by the batch's size, so the same token computed in a
batch of 37 rows or of 512 rows differs in the last bits, and greedy near-ties flip. Measured on
qwen2.5-coder-1.5b-instruct-q4km: last-token logits off by up to 0.59 from a fresh evaluation of the same prompt. A run's
outcomes then depend on the order its calls reached the server (known upstream: llama.cpp issue #28368 "cache_prompt
reuse changes computed logprobs", ollama issue #16860).

Here a prompt reuses only the cached tokens that were computed in whole batches of `--n_batch` tokens starting at
position 0, and at most its shared prefix rounded down to a batch boundary. Every remaining batch then starts where
a fresh evaluation's would, with the same tokens: the logits equal a fresh server's bit for bit, whatever came
before (tests/test_real_model_prefix_reuse.py), at the cost of re-evaluating under one batch of the shared prefix.
engines/embedded.py starts this module with n_batch = n_ubatch (llama.cpp's physical batch), 64 tokens.

RAGLEDGER_PREFIX_REUSE=exact keeps llama-cpp-python's own reuse (every shared token; outcomes depend on order).
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def aligned_prefix(cached: Sequence[int], prompt: Sequence[int], whole_batches: int, batch: int) -> int:
    """How many leading tokens of `prompt` may come from the KV cache holding `cached`, of which the first
    `whole_batches` were computed in whole, position-0-aligned batches of `batch` tokens. The prompt's last token is
    always evaluated (its logits give the first sampled token)."""
    shared = 0
    for a, b in zip(cached, prompt[:-1], strict=False):
        if a != b:
            break
        shared += 1
    return min(shared, whole_batches) // batch * batch


def align_prefix_reuse() -> None:
    """Make `Llama.generate` keep only the aligned prefix of its KV cache before its own prefix match runs."""
    from llama_cpp import Llama

    original = Llama.generate

    def generate(self, tokens, *args, **kwargs):
        tokens = list(tokens)
        if kwargs.get("reset", True) and self.n_tokens > 0:
            keep = aligned_prefix(self._input_ids, tokens, getattr(self, "_whole_batches", 0), self.n_batch)
            # the original compares only the first n_tokens and drops the KV cache from its match on
            self.n_tokens = min(self.n_tokens, keep)
        # this prompt's tokens in whole batches; generated tokens (one at a time) and the last partial batch are not
        self._whole_batches = len(tokens) // self.n_batch * self.n_batch
        return original(self, tokens, *args, **kwargs)

    Llama.generate = generate


def main() -> None:
    if os.environ.get("RAGLEDGER_PREFIX_REUSE", "aligned") != "exact":
        align_prefix_reuse()
    from llama_cpp.server.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()
