"""What vLLM and llama.cpp answer differently to the same request, replayed from their real answers.

The bodies below were recorded from vLLM 0.32.0 (the CPU build, infra/vllm_cpu.sh) and llama-cpp-python 0.3.36's
server, both serving the embedded Qwen2.5-Coder-0.5B model with a 2,048-token context; tests/test_vllm_server.py sends
ragledger's requests to the real vLLM server. These run in seconds, through the real client and its model-call
process: a prompt over the context is a ContextOverflow however the server words it, and an answer's token
log-probabilities are its own tokens on both (vLLM also lists the end-of-turn token).
"""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engines.llm import BackendError, ContextOverflow, LLMClient, LLMRequest, run_on_engine
from engines.llm_types import Endpoint

# {"message": ...} of each server's HTTP 400 for a prompt longer than the context (2,048 tokens)
VLLM_OVERFLOW = {"error": {
    "message": "This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input "
               "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
               "prompt. (parameter=input_tokens, value=2049)",
    "type": "BadRequestError", "param": "input_tokens", "code": 400}}
LLAMA_CPP_OVERFLOW = {"error": {
    "message": "This model's maximum context length is 2048 tokens. However, you requested 2542 tokens (2530 in the "
               "messages, 12 in the completion). Please reduce the length of the messages or completion.",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
# vLLM refuses max_tokens above its context; llama.cpp clamps it (an ordinary request error, not an overflow)
VLLM_MAX_TOKENS = {"error": {"message": "max_tokens=5000 cannot be greater than max_model_len=2048. Please request "
                                        "fewer output tokens. (parameter=max_tokens, value=5000)",
                             "type": "BadRequestError", "param": "max_tokens", "code": 400}}


def _entry(token: str, logprob: float, with_bytes: bool) -> dict:
    raw = list(token.encode())
    return {"token": token, "logprob": logprob, "bytes": raw if with_bytes else None,
            "top_logprobs": [{"token": token, "logprob": logprob, "bytes": raw if with_bytes else None}]}


ANSWER = [("The", -0.0372), (" capital", -0.00054), (" of", -0.0128), (" France", -0.00021), (" is", -0.0025),
          (" Paris", -0.0246), (".", -0.0073)]


def _completion(content: str, entries: list[dict] | None, completion_tokens: int) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "logprobs": {"content": entries} if entries is not None else None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 23, "completion_tokens": completion_tokens, "total_tokens": 23 + completion_tokens}}


# vLLM: bytes per token, and the end-of-turn token listed last (and counted in completion_tokens: 8, llama.cpp 7)
VLLM_LOGPROBS = _completion("The capital of France is Paris.",
                            [_entry(t, lp, True) for t, lp in ANSWER] + [_entry("<|im_end|>", -0.0019, True)], 8)
LLAMA_CPP_LOGPROBS = _completion("The capital of France is Paris.", [_entry(t, lp, False) for t, lp in ANSWER], 7)
# a character split over two tokens: vLLM spells each half as U+FFFD but gives its bytes (here "é" = c3 a9)
SPLIT = _completion("Café", [{"token": "Caf", "logprob": -0.1, "bytes": list(b"Caf"), "top_logprobs": []},
                             {"token": "\ufffd", "logprob": -0.2, "bytes": [0xC3], "top_logprobs": []},
                             {"token": "\ufffd", "logprob": -0.3, "bytes": [0xA9], "top_logprobs": []},
                             {"token": "<|im_end|>", "logprob": -0.4, "bytes": list(b"<|im_end|>"), "top_logprobs": []}],
                    4)


class Replay:
    """A server that answers each prompt with a recorded (status, body)."""

    def __init__(self, answers: dict[str, tuple[int, dict]]) -> None:
        self.answers = answers
        self.requests: list[dict] = []

    def __enter__(self) -> Replay:
        import socket
        import threading
        import time

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        status, answer = self.answers[body["messages"][-1]["content"]]
        return JSONResponse(answer, status_code=status) if status != 200 else Response(json.dumps(answer),
                                                                                       media_type="application/json")


def _client(server: Replay) -> LLMClient:
    return LLMClient(Endpoint(base_url=server.base_url, model="m", max_retries=2, backoff_base_s=0.01), "replay", None)


def _req(prompt: str, logprobs: bool = False) -> LLMRequest:
    return LLMRequest(system="s", prompt=prompt, temperature=0.0, top_p=1.0, max_tokens=12, seed=0, logprobs=logprobs)


@pytest.mark.parametrize("body", [VLLM_OVERFLOW, LLAMA_CPP_OVERFLOW], ids=["vllm", "llama.cpp"])
def test_a_prompt_over_the_context_is_a_context_overflow_with_the_servers_whole_message(body):
    with Replay({"long": (400, body)}) as server:
        with pytest.raises(ContextOverflow) as caught:
            run_on_engine(_client(server).complete(_req("long")))
        message = str(caught.value)
        assert len(server.requests) == 1  # not retried
        assert "\n" not in message and message.startswith("the prompt does not fit the model's context: ")
        # the whole message, its figures included (vLLM's runs past the 200 characters other errors keep)
        assert body["error"]["message"] in message and "HTTP 400, not retried" in message and server.base_url in message


def test_other_request_errors_stay_ordinary_backend_errors():
    with Replay({"q": (400, VLLM_MAX_TOKENS)}) as server:
        with pytest.raises(BackendError) as caught:
            run_on_engine(_client(server).complete(_req("q")))
        assert not isinstance(caught.value, ContextOverflow)
        assert "HTTP 400 (not retried)" in str(caught.value) and "max_tokens=5000" in str(caught.value)


def test_token_logprobs_are_the_answers_own_tokens_on_both_servers():
    with Replay({"v": (200, VLLM_LOGPROBS), "l": (200, LLAMA_CPP_LOGPROBS), "split": (200, SPLIT)}) as server:
        client = _client(server)
        vllm = run_on_engine(client.complete(_req("v", logprobs=True)))
        llama = run_on_engine(client.complete(_req("l", logprobs=True)))
        split = run_on_engine(client.complete(_req("split", logprobs=True)))
    assert vllm.token_logprobs == llama.token_logprobs == ANSWER  # vLLM's "<|im_end|>" is not the answer's
    assert vllm.mean_logprob == pytest.approx(sum(lp for _, lp in ANSWER) / len(ANSWER)) == llama.mean_logprob
    # usage is passed on as each server counts it: vLLM counts the end-of-turn token
    assert (vllm.tokens_out, llama.tokens_out) == (8, 7)
    # the end-of-turn token is found from the bytes even where a character's halves are spelled U+FFFD
    assert [t for t, _ in split.token_logprobs] == ["Caf", "\ufffd", "\ufffd"]


def test_the_generate_stage_names_the_cell_and_the_question():
    from strategies.readers.base import Call
    from tasks.generate import overflow_message

    exc = ContextOverflow("the prompt does not fit the model's context: This model's maximum context length is 2048 "
                          "tokens. (http://127.0.0.1:8011/v1, HTTP 400, not retried)")
    line = overflow_message("bm25@20 · concatenation · qwen", "q-17", 1, Call("answer", "s", "p"), exc)
    assert "\n" not in line
    assert line.startswith("cell 'bm25@20 · concatenation · qwen', question q-17 (round 1, answer call): the prompt does "
                           "not fit the model's context: This model's maximum context length is 2048 tokens.")
    assert "--max-model-len" in line and "model.context_window" in line
