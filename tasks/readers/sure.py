"""SuRe (seed 004): Summarized Retrieval, with K = 2 answer candidates.

Round 1: one call, Listing 1, yields candidates "(a) xx, (b) yy" (parsed robustly).
Round 2: one candidate-conditioned summary per candidate (Listing 2).
Round 3: instance-wise validity per summary (Listing 3: True/False) and pair-wise ranking of the two
summaries asked in both orders (Listing 4); r_pair = 1 / 0 / 0.5 for anything else, averaged over
the two orders (the official implementation averages the orders to cancel position bias).
Decision: argmax_k v(s_k) + r(s_k); ties go to the earlier candidate. 1 + 2 + 2 + 2 = 7 calls per
question; when the candidate output yields fewer than two distinct candidates there is nothing to
choose between and rounds 2-3 make no call (the one candidate, or "unknown", is the answer).
`sure_base` is the paper's Base (Listing 5): the passages and a 3-word answer instruction, one call.
"""

# ruff: noqa: E501  (the prompt templates are the paper's text, kept on their original lines)
from __future__ import annotations

import re

from ragledger.answers import is_unknown, normalize_answer
from tasks.readers.base import (
    Call,
    Decision,
    Generation,
    Passage,
    Reader,
    ReaderInput,
    ReaderSettings,
    clean_answer,
    fill,
    register_parser,
)

PROMPT_VERSION = "004-listings1-5-v3"  # v2: candidate parser unwraps "(xx)"; v3: reads "(1) xx" labels
K = 2

CANDIDATES_USER = """Below are {n} passages related to the question at the end. After reading the passages, provide two correct candidates for the answer to the question at the end. Each answer should be in the form: (a) xx, (b) yy, and should not exceed 3 words for each candidate.
{passages}

Question:
{question}

Answer:"""

SUMMARY_USER = """{passages}

Your job is to act as a professional writer. You will write a good-quality passage that can support the given prediction about the question only based on the information in the provided supporting passages.

Now, let's start. After you write, please write [DONE] to indicate you are done. Do not write a prefix (e.g., "Response:") while writing a passage.

Question: {question}
Choices: {choices}
Prediction: {prediction}
Passage:"""

VALIDITY_USER = """Question:
{question}

Prediction:
{prediction}

Passage:
{summary}

Does the passage correctly support the prediction? Choices: [True, False]. Answer:"""

RANK_USER = """Question: Given the following passages, determine which one provides a more informative answer to the subsequent question.

Passage 1:
{summary1}

Passage 2:
{summary2}

Target Question:
{question}

Your Task:
Identify which passage (Passage 1 or Passage 2) is more relevant and informative to answer the question at hand. Choices: [Passage 1, Passage 2].

Answer:"""

BASE_USER = """{passages}

Task description: predict the answer to the following question. Do not exceed 3 words.
Question: {question}
Answer:"""

SYSTEM = ""  # the paper's prompts are single user messages
SUMMARY_MAX_TOKENS = 200
LABEL_MAX_TOKENS = 8


def passages_block(passages: tuple[Passage, ...]) -> str:
    out = []
    for i, p in enumerate(passages, 1):
        out.append(f"\nPassage #{i} Title: {p.title}\nPassage #{i} Text: {p.body}")  # Listing 1 shows them apart
    return "\n".join(out)


# ---- parsers: never raise; anything unexpected is 'unparseable' -----------------------------------

# "(a)", "a)", and numbered "(1)" (digits only in brackets: "2)" may end a number); the 0.5B model writes "(1) xx"
_MARK = re.compile(r"(?:^|[\s,;(\[])(?:\(?([a-eA-E])\)|\(([1-5])\))\s*")
_LINE_MARK = re.compile(r"(?m)^\s*(?:[-*•]|\(?[a-eA-E1-5][).:])\s*")


def _clean_candidate(s: str) -> str:
    s = clean_answer(s.strip().strip(",;").strip())
    s = re.sub(r"\s*\[DONE\]\s*$", "", s).strip(" ,;.")
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:  # "(2000)": the whole candidate in brackets
        s = s[1:-1].strip()
    return s


def parse_candidates(output: str, k: int = K) -> list[str]:
    """Distinct candidates from "(a) xx, (b) yy" and the usual variants ("a) xx", lines "1. xx",
    "xx or yy", "xx, yy"), in order, at most k."""
    text = (output or "").strip()
    text = re.sub(r"^\s*(?:answers?|candidates?)\s*[:：]\s*", "", text, flags=re.IGNORECASE)
    parts: list[str] = []
    marks = list(_MARK.finditer(text))
    if len(marks) >= 2:
        for m, nxt in zip(marks, [*marks[1:], None], strict=True):
            parts.append(text[m.end() : nxt.start() if nxt else len(text)])
    elif len(_LINE_MARK.findall(text)) >= 2:
        parts = [ln for ln in _LINE_MARK.split(text) if ln.strip()]
    elif marks:  # a single "(a) xx" possibly followed by another separator
        parts = re.split(r",|;|\bor\b|\n", text[marks[0].end() :])
    elif len(text.split()) <= 8:  # no markers: only a short list ("xx, yy", "xx or yy") is read as candidates
        parts = re.split(r",|;|\bor\b|\n", text)
    out, seen = [], set()
    for p in parts:
        c = _clean_candidate(p.splitlines()[0] if p.strip() else "")
        key = normalize_answer(c)
        # the prompt asks for at most 3 words; a sentence or an abstention is not a candidate
        if c and key and key not in seen and len(c.split()) <= 6 and not is_unknown(c):
            seen.add(key)
            out.append(c)
    return out[:k]


def _parse_candidates_output(output: str) -> tuple[str, str]:
    cands = parse_candidates(output)
    return (" | ".join(cands), "ok") if cands else ("", "unparseable")


def _parse_summary(output: str) -> tuple[str, str]:
    text = output.split("[DONE]")[0].strip()
    text = re.sub(r"^\s*(?:passage|response)\s*[:：]\s*", "", text, flags=re.IGNORECASE).strip()
    return (text, "ok") if text else ("", "empty")


def _parse_true_false(output: str) -> tuple[str, str]:
    found = re.findall(r"\b(true|false)\b", output, re.IGNORECASE)
    if not found:
        return "", "unparseable"
    return found[0].capitalize(), "ok"  # the first verdict given


def _parse_passage_choice(output: str) -> tuple[str, str]:
    found = {m for m in re.findall(r"passage\s*#?\s*([12])\b", output, re.IGNORECASE)}
    if len(found) == 1:
        return found.pop(), "ok"
    bare = re.fullmatch(r"\W*([12])\W*", output.strip())
    if bare:
        return bare.group(1), "ok"
    return "", "unparseable"  # neither or both: r_pair = 0.5 for this order


register_parser("sure_candidates", _parse_candidates_output)
register_parser("sure_summary", _parse_summary)
register_parser("true_false", _parse_true_false)
register_parser("passage_choice", _parse_passage_choice)


def candidates_from(history: list[Generation]) -> list[str]:
    """The candidates of a question's round-1 (`candidates`) generation; [] if there is none."""
    g = next((g for g in history if g.role == "candidates"), None)
    return parse_candidates(g.output) if g is not None else []


def candidates_call(item: ReaderInput) -> Call:
    """SuRe's round 1 (Listing 1): K candidate answers from the passages. sure_mcq makes the same call, so
    the LLM-call cache serves it once to both."""
    prompt = fill(CANDIDATES_USER, n=str(len(item.passages)), passages=passages_block(item.passages), question=item.question)
    return Call("candidates", SYSTEM, prompt, tuple(p.pid for p in item.passages), parser="sure_candidates")


class SuRe(Reader):
    name = "sure"
    prompt_version = PROMPT_VERSION
    rounds = 3

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        pids = tuple(p.pid for p in item.passages)
        q = item.question
        if round_no == 1:
            return [candidates_call(item)]
        cands = candidates_from(history)
        if len(cands) < K:
            return []
        if round_no == 2:
            choices = " ".join(f"({chr(97 + i)}) {c}" for i, c in enumerate(cands))
            return [
                Call("summary", SYSTEM, fill(SUMMARY_USER, passages=passages_block(item.passages), question=q, choices=choices,
                                             prediction=f"({chr(97 + i)}) {c}"),
                     pids, sample_index=0, max_tokens=SUMMARY_MAX_TOKENS, parser="sure_summary")
                for i, c in enumerate(cands)
            ]  # fmt: skip
        summaries = [g.parsed_answer for g in history if g.role == "summary"]
        if len(summaries) < K:
            return []
        calls = [
            Call("validity", SYSTEM, fill(VALIDITY_USER, question=q, prediction=c, summary=s), (),
                 max_tokens=LABEL_MAX_TOKENS, parser="true_false")
            for c, s in zip(cands, summaries, strict=True)
        ]  # fmt: skip
        for first, second in ((0, 1), (1, 0)):  # both orders
            calls.append(Call("rank", SYSTEM, fill(RANK_USER, summary1=summaries[first], summary2=summaries[second], question=q),
                              (), max_tokens=LABEL_MAX_TOKENS, parser="passage_choice"))
        return calls

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        cands = candidates_from(history)
        if not cands:
            return Decision("sure-unparseable", (), (), "unknown")
        validity = [g for g in history if g.role == "validity"]
        ranks = [g for g in history if g.role == "rank"]
        if len(cands) < K or len(validity) < K or len(ranks) < 2:
            scores = tuple(1.0 if i == 0 else 0.0 for i in range(len(cands)))
            return Decision("sure-single-candidate", tuple(cands), scores, cands[0])
        return sure_decision(cands, validity, ranks)


def sure_decision(cands: list[str], validity: list[Generation], ranks: list[Generation]) -> Decision:
    """v_k + r_k with ties to the earlier candidate. ranks[0] shows (s_1, s_2), ranks[1] shows (s_2, s_1)."""
    v = [1.0 if g.parse_status == "ok" and g.parsed_answer == "True" else 0.0 for g in validity]
    r = [0.0, 0.0]
    for g, order in zip(ranks, ((0, 1), (1, 0)), strict=True):
        if g.parse_status == "ok" and g.parsed_answer in ("1", "2"):
            winner = order[int(g.parsed_answer) - 1]
            r[winner] += 1.0 / len(ranks)
        else:  # anything else: 0.5 each
            r[0] += 0.5 / len(ranks)
            r[1] += 0.5 / len(ranks)
    scores = tuple(v[i] + r[i] for i in range(len(cands)))
    best = max(range(len(cands)), key=lambda i: (scores[i], -i))
    return Decision("sure", tuple(cands), scores, cands[best])


class SuReBase(Reader):
    """SuRe's Base (seed 004 Listing 5): retrieved passages plus "predict the answer ... Do not exceed 3 words".
    With the `none` retriever it is the paper's no-retrieval baseline (N = 0)."""

    name = "sure_base"
    prompt_version = PROMPT_VERSION
    rounds = 1

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        prompt = fill(BASE_USER, passages=passages_block(item.passages), question=item.question).lstrip()
        return [Call("answer", SYSTEM, prompt, tuple(p.pid for p in item.passages))]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        g = next((g for g in history if g.role == "answer"), None)
        answer = g.parsed_answer if g is not None else ""
        return Decision("single", (answer,), (1.0,), answer or "unknown")
