"""On the real embedded model, a prompt's answer does not depend on which prompt the server evaluated before it
(engines/llama_server.py: prefix reuse aligned to whole batches).

One prompt B is sent to a fresh server, then again after prompts that share its passages but not its question
(so llama.cpp takes a long prefix of B from its KV cache). Each answer's tokens and log-probabilities must equal
the fresh ones bit for bit. The control runs the same calls with llama-cpp-python's own reuse
(RAGLEDGER_PREFIX_REUSE=exact) and requires a difference: it shows the comparison can fail. Should a llama.cpp
build ever compute the same logits however a prompt is split, the control fails and the alignment can go.
"""

from __future__ import annotations

import gzip
import json

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]  # the model is ~2-3x slower on AVX2 CPUs

MODEL = "qwen2.5-coder-0.5b-instruct-awq-q4km"


def _prompts(data_dir) -> tuple[str, list[str]]:
    """B, and the prompts sent between its repetitions: the same passages with other questions or one passage
    swapped, as SuRe's and Post-Fusion's calls of one question are."""
    with gzip.open(data_dir / "squad" / "dev-v1.1.json.gz", "rt") as f:
        paragraphs = [p["context"] for p in json.load(f)["data"][0]["paragraphs"]][:8]

    def prompt(passages: list[str], question: str) -> str:
        listed = "".join(f"Passage {i + 1}: {p}\n" for i, p in enumerate(passages))
        return f"{listed}Question: {question}\nAnswer in a few words."

    b = prompt(paragraphs[0:3], "Which team won Super Bowl 50?")
    between = [prompt(paragraphs[0:3], "Where was Super Bowl 50 played?"),
               prompt([*paragraphs[0:2], paragraphs[5]], "Which team won Super Bowl 50?"),
               prompt(paragraphs[0:3], "Which team won Super Bowl 50? Answer with the team's city.")]
    return b, between


def _answers(b: str, between: list[str]) -> list[list[tuple]]:
    """B's tokens with their log-probabilities: first on a fresh server, then after each prompt of `between`."""
    from openai import OpenAI

    from engines.embedded import embedded_server

    out = []
    with embedded_server(MODEL, log=lambda *a, **k: None, logits_all=True) as base_url:
        client = OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=300)

        def ask(prompt: str) -> list[tuple]:
            response = client.chat.completions.create(
                model=MODEL, temperature=0.0, max_tokens=12, logprobs=True, top_logprobs=3,
                messages=[{"role": "system", "content": "Answer from the passages."}, {"role": "user", "content": prompt}])
            return [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs])
                    for t in response.choices[0].logprobs.content]

        out.append(ask(b))
        for other in between:
            ask(other)
            out.append(ask(b))
    return out


# the default tier sends B after the prompt that shares the longest prefix with it (its question extended); --all
# after each of the three (each alone also shows the control's difference)
@pytest.mark.parametrize("sent_between", [slice(2, 3), pytest.param(slice(0, 3), marks=pytest.mark.extended)],
                         ids=["longest-prefix", "all-three"])
def test_an_answer_does_not_depend_on_the_previous_prompt(data_dir, monkeypatch, sent_between):
    b, between = _prompts(data_dir)
    between = between[sent_between]
    monkeypatch.delenv("RAGLEDGER_PREFIX_REUSE", raising=False)
    fresh, *after = _answers(b, between)
    assert fresh and all(answer == fresh for answer in after), (fresh, after)

    monkeypatch.setenv("RAGLEDGER_PREFIX_REUSE", "exact")  # the control: llama-cpp-python's own reuse
    fresh, *after = _answers(b, between)
    assert any(answer != fresh for answer in after), "llama.cpp now computes a prompt the same however it is split"
