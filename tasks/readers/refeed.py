"""REFEED (seed 003 §3.2): retrieval feedback.

Round 1 (STEP-1): a closed-book answer, greedy, with the Table 10 prompt.
Round 2 (STEP-2, STEP-3): retrieve with "question + initial answer" through the cell's retriever
(`ReaderSettings.retrieve`; k = `feedback_k`, default 10 as in the paper) and refine the answer with the
Table 11 prompt, given the documents and the initial answer.
Decision (MODULE-2, `refeed`): keep the initial answer when its mean token log-probability is higher
than the refined answer's, else the refined one. Without log-probabilities from the backend the refined
answer is kept and the vote's method says so (`refeed-no-logprobs`). `refeed_refined` is the ablation
without the ensemble (always the refined answer); it shares every model call with `refeed`.
MODULE-1 (n sampled initial answers, merged retrieval) is not implemented.
"""

from __future__ import annotations

import math
import re

from tasks.readers.base import (
    Call,
    Decision,
    Generation,
    Reader,
    ReaderInput,
    ReaderSettings,
    clean_answer,
    fill,
    register_parser,
)

PROMPT_VERSION = "003-table10-11-v1"
FEEDBACK_K = 10  # seed 003 §3.2.2: "k = 10 for fair comparisons with baselines"

# Tables 10-11: the paper uses the first 64 QA pairs of NQ train; the extracted text prints five.
SHOTS = """Question: total number of death row inmates in the us? The answer is 2,718
Question: big little lies season 2 how many episodes? The answer is seven
Question: who sang waiting for a girl like you? The answer is Foreigner
Question: where do you cross the arctic circle in norway? The answer is Saltfjellet
Question: who is the main character in green eggs and ham? The answer is Sam - I - am"""

CLOSED_SYSTEM = SHOTS  # Table 10: [prompt words; question]
CLOSED_USER = "Question: {question} The answer is"

OPEN_SYSTEM = SHOTS + "\n\nRefer to the passages below and answer the following question with just a few words."
# Table 11 order (question, documents, instruction, "The answer is"); the initial answer is added because
# STEP-3 refines it: P_after(y | x, y_hat, d).
OPEN_USER = """Question: {question}
{documents}
Initial answer (before reading the passages): {initial}
Refer to the passages below and answer the following question with just a few words.
Question: {question} The answer is"""

_ANSWER_IS = re.compile(r"the\s+answer\s+is\s*[:：]?\s*", re.IGNORECASE)


def parse_answer_is(output: str) -> tuple[str, str]:
    """The text after the last "The answer is" (else the first line), as a short answer."""
    matches = list(_ANSWER_IS.finditer(output))
    tail = output[matches[-1].end():] if matches else output
    first = next((ln for ln in tail.strip().splitlines() if ln.strip()), "")
    answer = clean_answer(first)
    return (answer, "ok") if answer else ("", "empty" if not output.strip() else "unparseable")


register_parser("answer_is", parse_answer_is)


def documents(passages) -> str:
    return "\n".join(f"Passage: {p.text}" for p in passages)


class Refeed(Reader):
    name = "refeed"
    prompt_version = f"{PROMPT_VERSION}+k{FEEDBACK_K}"  # the default feedback depth changes the calls too
    rounds = 2
    needs_logprobs = True

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if round_no == 1:  # greedy, closed book
            return [Call("initial", CLOSED_SYSTEM, fill(CLOSED_USER, question=item.question), (), temperature=0.0,
                         logprobs=True, parser="answer_is")]
        initial = next((g for g in history if g.role == "initial"), None)
        if initial is None or settings.retrieve is None:
            return []  # closed-book cell: nothing to retrieve with
        query = f"{item.question} {initial.parsed_answer}".strip()
        passages = settings.retrieve(query, settings.feedback_k or FEEDBACK_K)
        if not passages:
            return []
        initial_answer = initial.parsed_answer or "unknown"
        prompt = fill(OPEN_USER, question=item.question, documents=documents(passages), initial=initial_answer)
        return [Call("refine", OPEN_SYSTEM, prompt, tuple(p.pid for p in passages), temperature=0.0, logprobs=True,
                     parser="answer_is")]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        initial = next((g for g in history if g.role == "initial"), None)
        refined = next((g for g in history if g.role == "refine"), None)
        if initial is None:
            return Decision("refeed-no-generation", (), (), "unknown")
        if refined is None:
            return Decision("refeed-no-feedback", (initial.parsed_answer,), (_lp(initial),), initial.parsed_answer or "unknown")
        cands = (initial.parsed_answer, refined.parsed_answer)
        scores = (_lp(initial), _lp(refined))
        if math.isnan(scores[0]) or math.isnan(scores[1]):
            return Decision("refeed-no-logprobs", cands, scores, refined.parsed_answer or "unknown")
        # seed 003: keep the initial output only when its probability is higher than after feedback
        chosen = initial.parsed_answer if scores[0] > scores[1] else refined.parsed_answer
        return Decision("refeed-logprob", cands, scores, chosen or "unknown")


class RefeedRefined(Refeed):
    """REFEED without MODULE-2 (seed 003 Table 4 ablation): always the refined answer."""

    name = "refeed_refined"

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        d = super().decide(item, history)
        if d.method in ("refeed-logprob", "refeed-no-logprobs"):
            return Decision("refeed-refined", d.candidates, d.scores, d.candidates[1] or "unknown")
        return d


def _lp(g: Generation) -> float:
    return math.nan if g.mean_logprob is None else float(g.mean_logprob)
