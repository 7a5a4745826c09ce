"""The embedded server's own count of the prompt tokens it evaluated, read from its log (engines/embedded.py)."""

from __future__ import annotations

from engines import embedded

# lines as llama-cpp-python 0.3.36's server writes them (copied from a real run's log)
LOG_BEFORE = b"""INFO:     Uvicorn running on http://127.0.0.1:57159 (Press CTRL+C to quit)
llama_perf_context_print: prompt eval time =       0.05 ms /    32 tokens (    0.00 ms per token, 666666.67 tokens per second)
llama_perf_context_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
INFO:     127.0.0.1:40324 - "POST /v1/chat/completions HTTP/1.1" 200 OK
"""
LOG_RUN = b"""Llama.generate: 121 prefix-match hit, remaining 563 prompt tokens to eval
llama_perf_context_print: prompt eval time =   19490.37 ms /   563 tokens (   34.62 ms per token,    28.89 tokens per second)
llama_perf_context_print:        eval time =     461.36 ms /     3 runs   (  153.79 ms per token,     6.50 tokens per second)
llama_perf_context_print:       total time =   19957.18 ms /   566 tokens
INFO:     127.0.0.1:57214 - "POST /v1/chat/completions HTTP/1.1" 200 OK
Llama.generate: 683 prefix-match hit, remaining 1 prompt tokens to eval
llama_perf_context_print: prompt eval time =       0.00 ms /     1 tokens (    0.00 ms per token,      inf tokens per second)
llama_perf_context_print:        eval time =     217.42 ms /     3 runs   (   72.47 ms per token,    13.80 tokens per second)
"""


def test_prompt_tokens_evaluated_counts_the_runs_completions_only(tmp_path, monkeypatch):
    log = tmp_path / "embedded-server-1.log"
    log.write_bytes(LOG_BEFORE)
    monkeypatch.setitem(embedded._SERVER_LOGS, "http://127.0.0.1:1/v1", (log, log.stat().st_size))
    with log.open("ab") as f:
        f.write(LOG_RUN)
    # the start-up check's 32 tokens came before the run got the server; the run's two completions evaluated 563 + 1
    assert embedded.prompt_tokens_evaluated("http://127.0.0.1:1/v1") == 564
    assert embedded.prompt_tokens_evaluated("http://127.0.0.1:2/v1") is None  # not a server this process started
