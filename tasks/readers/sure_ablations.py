"""SuRe ablations of seed 004 Table 3 ("where the effectiveness of SuRe comes from").

`sure_generic` — *Sum-and-pred (Gen)*: instead of candidate-conditioned summaries, one generic summary of the
passages (Listing 6, verbatim: "One can observe that the conditioning part is removed, compared to p_sum"), then a
prediction from that summary alone. The paper prints no prediction template; ours is the Base prompt (Listing 5)
with the summary in place of the passages. 2 calls per question (1 when the summary comes back empty).

`sure_mcq` — *MCQ prompt* (Listing 7): the answer candidates of SuRe's round 1 (Listing 1; the same call, so it
is served from the LLM-call cache when `sure` runs too) offered as multiple choices appended to the Base prompt;
the model picks one. Listing 7's text was lost in extraction; the paper describes it as Listing 5 plus "the
conditioning with multiple choices part", so the choices are written as in Listing 2 (`Choices: (a) xx (b) yy`).
An answer naming a choice (by letter or by text) is that candidate; any other answer is kept as given (method
`mcq-off-choices`). 2 calls per question; 1 when round 1 yields fewer than two candidates (then, as in `sure`,
there is nothing to choose between).
"""

# ruff: noqa: E501  (the prompt templates are the paper's text, kept on their original lines)
from __future__ import annotations

import re

from ragledger.answers import normalize_answer
from tasks.readers.base import Call, Decision, Generation, Reader, ReaderInput, ReaderSettings, clean_answer, fill
from tasks.readers.sure import (
    LABEL_MAX_TOKENS,
    SUMMARY_MAX_TOKENS,
    SYSTEM,
    K,
    candidates_call,
    candidates_from,
    passages_block,
)
from tasks.readers.sure import PROMPT_VERSION as SURE_VERSION

PROMPT_VERSION = f"{SURE_VERSION}+004-listings6-7-v1"

GENERIC_SUMMARY_USER = """{passages}

Your job is to act as a professional writer. You will write a good-quality passage that can support the prediction about the question only based on the information in the provided supporting passages.

Now, let's start. After you write, please write [DONE] to indicate you are done. Do not write a prefix (e.g., "Response:") while writing a passage.

Question: {question}
Passage:"""

# Sum-and-pred: Listing 5 with the generic summary in place of the passages
PREDICT_FROM_SUMMARY_USER = """{summary}

Task description: predict the answer to the following question. Do not exceed 3 words.
Question: {question}
Answer:"""

# Listing 7 (reconstructed): Listing 5 plus the candidates as multiple choices
MCQ_USER = """{passages}

Task description: predict the answer to the following question. Do not exceed 3 words.
Question: {question}
Choices: {choices}
Answer:"""

MCQ_MAX_TOKENS = max(LABEL_MAX_TOKENS, 16)


def choices_text(cands: list[str]) -> str:
    return " ".join(f"({chr(97 + i)}) {c}" for i, c in enumerate(cands))


_LETTER = re.compile(r"^\s*(?:(?:final\s+)?answer\s*[:：]\s*)?(?:choice\s+|option\s+)?\(?([a-z])\)(?:\s|$|[.,:])", re.IGNORECASE)
_BARE_LETTER = re.compile(r"^\s*\(?([a-z])\)?\s*\.?\s*$", re.IGNORECASE)


def pick_choice(output: str, cands: list[str]) -> tuple[int | None, str]:
    """(index of the chosen candidate or None, the answer as given). Never raises."""
    text = (output or "").strip()
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    for pattern in (_LETTER, _BARE_LETTER):
        m = pattern.match(first)
        if m:
            i = ord(m.group(1).lower()) - 97
            if 0 <= i < len(cands):
                return i, cands[i]
    answer = clean_answer(first)
    key = normalize_answer(answer)
    keys = [normalize_answer(c) for c in cands]
    if key in keys:
        return keys.index(key), cands[keys.index(key)]
    named = [i for i, k in enumerate(keys) if k and re.search(rf"(?:^|\s){re.escape(k)}(?:\s|$)", key)]
    if len(named) == 1:  # "The answer is Paris." names exactly one choice
        return named[0], cands[named[0]]
    return None, answer


class SuReGeneric(Reader):
    """Sum-and-pred (Gen), seed 004 Table 3 (6)."""

    name = "sure_generic"
    prompt_version = PROMPT_VERSION
    rounds = 2

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if round_no == 1:
            prompt = fill(GENERIC_SUMMARY_USER, passages=passages_block(item.passages), question=item.question).lstrip()
            return [Call("summary", SYSTEM, prompt, tuple(p.pid for p in item.passages), max_tokens=SUMMARY_MAX_TOKENS,
                         parser="sure_summary")]
        summary = next((g for g in history if g.role == "summary"), None)
        if summary is None or summary.parse_status != "ok" or not summary.parsed_answer:
            return []  # nothing to predict from
        prompt = fill(PREDICT_FROM_SUMMARY_USER, summary=summary.parsed_answer, question=item.question)
        return [Call("answer", SYSTEM, prompt, ())]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        g = next((g for g in history if g.role == "answer"), None)
        if g is None:
            return Decision("sum-and-pred-no-summary", (), (), "unknown")
        return Decision("single", (g.parsed_answer,), (1.0,), g.parsed_answer or "unknown")


class SuReMCQ(Reader):
    """MCQ prompt, seed 004 Table 3 (5): SuRe's candidates as multiple choices; the model picks one."""

    name = "sure_mcq"
    prompt_version = PROMPT_VERSION
    rounds = 2

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        pids = tuple(p.pid for p in item.passages)
        if round_no == 1:  # exactly SuRe's round-1 call (shared through the LLM-call cache)
            return [candidates_call(item)]
        cands = candidates_from(history)
        if len(cands) < K:
            return []
        prompt = fill(MCQ_USER, passages=passages_block(item.passages), question=item.question, choices=choices_text(cands)).lstrip()
        return [Call("choice", SYSTEM, prompt, pids, max_tokens=MCQ_MAX_TOKENS)]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        cands = candidates_from(history)
        if not cands:
            return Decision("mcq-unparseable", (), (), "unknown")
        g = next((g for g in history if g.role == "choice"), None)
        if g is None:  # one candidate: nothing to choose between
            return Decision("mcq-single-candidate", tuple(cands), tuple(1.0 if i == 0 else 0.0 for i in range(len(cands))), cands[0])
        index, answer = pick_choice(g.output, cands)
        if index is None:
            return Decision("mcq-off-choices", tuple(cands), tuple(0.0 for _ in cands), answer or "unknown")
        return Decision("mcq", tuple(cands), tuple(1.0 if i == index else 0.0 for i in range(len(cands))), answer)
