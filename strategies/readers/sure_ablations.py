"""SuRe ablations of seed 004 Table 3 ("Ablation and more analyses").

The rows, as §4.3 defines them: (1) Base (`sure_base`); (2) Conditional summarizations, "additionally appends all
the conditional summarizations" (`sure_summaries`); (3) + Pair-wise ranking, "selects the summarization with only
ranking" (`sure_ranking`; the paper cites Eq. 4 there, the validity equation, but the ranking is Eq. 5);
(4) + Instance-wise validity, i.e. SuRe (`sure`); (5) MCQ prompt (`sure_mcq`); (6) Sum-and-pred (Gen)
(`sure_generic`). The official repository (GitHub bbuing9/ICLR24_SuRe) has code for (1), (4) and the two prompts
of (6) (pref_eval.ipynb: §4.3 compares SuRe with the "Generic summarization used in Table 3"), none for (2), (3), (5).

`sure_ranking` — rounds 1-2 of `sure` and its two ranking calls (all served from the LLM-call cache when `sure`
runs too); the answer is argmax r (the official postprocess_rank scores, `strategies.readers.sure.rank_scores`), ties
to the earlier candidate. 5 calls per question, 1 with fewer than two candidates.

`sure_summaries` — rounds 1-2 of `sure`, then one prediction: the Base prompt (official get_query_baseline) with
the conditional summaries appended after the passages, written "Summary #k: ..." (a reconstruction: the paper
prints no prompt for this row). With fewer than two candidates there are no summaries and the prediction is
Base's own call. 4 calls per question (2 with fewer than two candidates).

`sure_generic` — *Sum-and-pred (Gen)*: one generic summary of the passages (Listing 6; pref_eval.ipynb
summarize), then a prediction from that summary alone with pref_eval.ipynb's prediction prompt ("Below is the
passage related to the question at the end. ..."; the notebook formats the one-element list the API returned,
["..."], into it: the summary text is used here). 2 calls per question (1 when the summary comes back empty).

`sure_mcq` — *MCQ prompt* (Listing 7): the answer candidates of SuRe's round 1 (Listing 1; the same call, so it
is served from the LLM-call cache when `sure` runs too) offered as multiple choices on the Base prompt; the model
picks one. Listing 7's text was lost in extraction and the official code has no MCQ prompt; the paper describes
it as Listing 5 plus "the conditioning with multiple choices part", so a line `Choices: (a) xx (b) yy` (Listing 2's
choices) follows the question (a reconstruction). An answer naming a choice (by letter or by text) is that
candidate; any other answer is kept as given (method `mcq-off-choices`). 2 calls per question; 1 when round 1
yields fewer than two candidates (then, as in `sure`, there is nothing to choose between).
"""

# ruff: noqa: E501  (the prompt templates are the official code's strings, kept on their original lines)
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from core.answers import normalize_answer
from strategies.readers.base import Call, Decision, Generation, Reader, ReaderInput, ReaderSettings, clean_answer, fill
from strategies.readers.sure import (
    BASE_USER,
    LABEL_MAX_TOKENS,
    SUMMARY_MAX_TOKENS,
    SYSTEM,
    VOTE_VERSION,
    K,
    argmax_first,
    base_passages_block,
    base_prompt,
    candidates_call,
    candidates_from,
    choices_text,
    first_two_rounds,
    passages_block,
    rank_calls,
    rank_scores,
    single_candidate,
    summaries_from,
)
from strategies.readers.sure import PROMPT_VERSION as SURE_VERSION

# v2: the official prompts for Sum-and-pred (pref_eval.ipynb), the MCQ prompt on the official Base layout, Table 3
# rows (2) and (3)
PROMPT_VERSION = f"{SURE_VERSION}+004-listings6-7-v2"

# pref_eval.ipynb summarize
GENERIC_SUMMARY_USER = """{passages}

Your job is to act as a professional writer. You will write a good-quality passage that can support the prediction about the question only based on the information in the provided supporting passages.

Now, let's start. After you write, please write [DONE] to indicate you are done. Do not write a prefix (e.g., "Response:") while writing a passage.

Question: {question}
Passage: """

# pref_eval.ipynb prediction
PREDICT_FROM_SUMMARY_USER = """Below is the passage related to the question at the end. After reading the passage, provide correct answer to the question at the end. Answer should not exceed 3 words.

Passage:
{summary}

Question:
{question}

Answer: """

# Listing 7 (reconstructed): get_query_baseline plus the candidates as multiple choices
MCQ_USER = "{passages}Task description: predict the answer to the following question. Do not exceed 3 words.\n\nQuestion: {question}.\n\nChoices: {choices}\n\nAnswer: "

MCQ_MAX_TOKENS = max(LABEL_MAX_TOKENS, 16)


def summaries_block(summaries: list[str]) -> str:
    """Table 3 row (2) (reconstructed): the conditional summaries after the passages, in candidate order."""
    return "".join(f"Summary #{k}: {s}\n\n" for k, s in enumerate(summaries, 1))


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


class SuReRanking(Reader):
    """+ Pair-wise ranking, seed 004 Table 3 (3): SuRe's summaries chosen by the ranking alone."""

    name = "sure_ranking"
    prompt_version = PROMPT_VERSION
    vote_version = VOTE_VERSION
    rounds = 3

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if (calls := first_two_rounds(round_no, item, history)) is not None:
            return calls
        summaries = summaries_from(history)
        return rank_calls(item, summaries) if len(candidates_from(history)) >= K and len(summaries) >= K else []

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        cands = candidates_from(history)
        if not cands:
            return Decision("sure-unparseable", (), (), "unknown")
        ranks = [g for g in history if g.role == "rank"]
        if len(cands) < K or len(ranks) < 2:
            return single_candidate(cands)
        scores = rank_scores(ranks)
        return Decision("sure-rank-only", tuple(cands), scores, cands[argmax_first(scores)])


class SuReSummaries(Reader):
    """Conditional summarizations, seed 004 Table 3 (2): Base plus all of SuRe's conditional summaries."""

    name = "sure_summaries"
    prompt_version = PROMPT_VERSION
    rounds = 3

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if (calls := first_two_rounds(round_no, item, history)) is not None:
            return calls
        summaries = [s for s in summaries_from(history) if s]
        if not summaries:  # nothing to append: Base's own call (served from the LLM-call cache when sure_base runs)
            return [Call("answer", SYSTEM, base_prompt(item.passages, item.question), tuple(p.pid for p in item.passages))]
        blocks = base_passages_block(item.passages) + summaries_block(summaries)
        prompt = fill(BASE_USER, passages=blocks, question=item.question)
        return [Call("answer", SYSTEM, prompt, tuple(p.pid for p in item.passages))]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        g = next((g for g in history if g.role == "answer"), None)
        answer = g.parsed_answer if g is not None else ""
        n = sum(1 for g in history if g.role == "summary")
        return Decision("summaries-appended" if n else "single", (answer,), (1.0,), answer or "unknown")


class SuReGeneric(Reader):
    """Sum-and-pred (Gen), seed 004 Table 3 (6)."""

    name = "sure_generic"
    prompt_version = PROMPT_VERSION
    rounds = 2

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if round_no == 1:
            prompt = fill(GENERIC_SUMMARY_USER, passages=passages_block(item.passages), question=item.question)
            return [Call("summary", SYSTEM, prompt, tuple(p.pid for p in item.passages), max_tokens=SUMMARY_MAX_TOKENS,
                         parser="sure_summary")]
        summary = next((g for g in history if g.role == "summary"), None)
        if summary is None or summary.parse_status != "ok" or not summary.parsed_answer:
            return []  # nothing to predict from
        prompt = fill(PREDICT_FROM_SUMMARY_USER, summary=summary.parsed_answer, question=item.question)
        return [Call("answer", SYSTEM, prompt, ())]

    narrows_context = True

    def final_context(self, generations: Sequence[Any], passage_text: Callable[[str], str]) -> str | None:
        """The answer call reads the generic summary alone, not the passages; without an answer call (no usable
        summary) the final round is the summary call, which read every passage."""
        if not any(g.role == "answer" for g in generations):
            return None
        return next(g.parsed_answer for g in generations if g.role == "summary")

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
        prompt = fill(MCQ_USER, passages=base_passages_block(item.passages), question=item.question, choices=choices_text(cands))
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
