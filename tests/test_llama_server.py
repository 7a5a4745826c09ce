"""The aligned prefix rule of engines/llama_server.py on hand-computed cases (batch of 4 tokens)."""

from __future__ import annotations

from engines.llama_server import aligned_prefix


def test_a_shared_prefix_is_rounded_down_to_a_batch_boundary():
    cached = list(range(20))
    prompt = [*range(11), 99, 98]  # shares 11 tokens
    assert aligned_prefix(cached, prompt, whole_batches=20, batch=4) == 8


def test_only_tokens_computed_in_whole_batches_are_reused():
    # the previous prompt was 10 tokens (8 in whole batches), then 10 generated one at a time; the new prompt
    # repeats all 20 and goes on: tokens 8-19 were not computed as a fresh evaluation would compute them
    cached = list(range(20))
    prompt = list(range(25))
    assert aligned_prefix(cached, prompt, whole_batches=8, batch=4) == 8


def test_the_last_prompt_token_is_always_evaluated():
    cached = list(range(8))
    assert aligned_prefix(cached, list(range(8)), whole_batches=8, batch=4) == 4  # shares 7 before the last: 4
    assert aligned_prefix(cached, list(range(9)), whole_batches=8, batch=4) == 8


def test_nothing_is_reused_below_one_batch_or_after_a_first_token_differs():
    assert aligned_prefix([1, 2, 3], [1, 2, 3, 4, 5], whole_batches=0, batch=4) == 0
    assert aligned_prefix(list(range(20)), [7, *list(range(1, 20))], whole_batches=20, batch=4) == 0
