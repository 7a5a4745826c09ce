"""REFEED (seed 003 §3.2): retrieval feedback.

Round 1 (STEP-1): a closed-book answer, greedy, with the Table 10 prompt.
Round 2 (STEP-2, STEP-3): retrieve with "question + initial answer" through the cell's retriever
(`ReaderSettings.retrieve`; k = `feedback_k`, default 10 as in the paper) and refine the answer with the
Table 11 prompt in §4.1's retrieve-read order [prompt words; passage; question]: the instruction, the documents as
"Title: ... Passage: ...", the question, "The answer is".
`shots` keeps the first N of the five printed demonstrations (0: Table 2's zero-shot setting); `show_initial`
adds the initial answer to the refine prompt (an ablation; Table 11 has no such line).
Decision (MODULE-2, `refeed`): keep the initial answer when its output's probability P = (1/t) sum_i p(y_i | ...),
the arithmetic mean of the probabilities of the output's t tokens (§3.2.2), is higher than the refined output's,
else the refined one.
Without log-probabilities from the backend the refined answer is kept and the vote's method says so
(`refeed-no-logprobs`). `refeed_refined` is the ablation without the ensemble (always the refined answer); it
shares every model call with `refeed`.

MODULE-1 (`feedback_samples: n`, seed 003 §3.2.2 and Table 7): round 1 samples n initial answers (temperature
0.7, top_p 0.9; one request per sample index, each with its own seed, since llama.cpp ignores n > 1). Round 2
retrieves with "question + answer_j" for each distinct answer, merges the lists, keeps each document once (its
best score), ranks by retrieval score and keeps the top k; the refine prompt lists all n initial answers.
MODULE-2 then compares the refined answer with the most probable initial answer.
"""

from __future__ import annotations

import math
import re

from pydantic import Field

from strategies.readers.base import (
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

PROMPT_VERSION = "003-table10-11-v3"  # v3: §4.1's order, instruction first
MODULE1_VERSION = "003-module1-v2"  # the refine template listing n initial answers, and the merge rule
SAMPLE_TEMPERATURE, SAMPLE_TOP_P = 0.7, 0.9  # seed 003 Table 7, "with diverse retrieval feedback"
FEEDBACK_K = 10  # seed 003 §3.2.2: "k = 10 for fair comparisons with baselines"

# Tables 10-11: the paper uses the first 64 QA pairs of NQ train; the extracted text prints five, which are the
# demonstrations here (`shots: N` keeps the first N; 0 is Table 2's zero-shot setting).
DEMONSTRATIONS = (
    "Question: total number of death row inmates in the us? The answer is 2,718",
    "Question: big little lies season 2 how many episodes? The answer is seven",
    "Question: who sang waiting for a girl like you? The answer is Foreigner",
    "Question: where do you cross the arctic circle in norway? The answer is Saltfjellet",
    "Question: who is the main character in green eggs and ham? The answer is Sam - I - am",
)
INSTRUCTION = "Refer to the passages below and answer the following question with just a few words."

CLOSED_USER = "Question: {question} The answer is"  # Table 10: [prompt words; question]
# Table 11 in §4.1's retrieve-read format [prompt words; passage; question]: the instruction ("the passages below"),
# the documents ("Title: ... Passage: ..."), the question, "The answer is" (GenRead's reading prompt has this order)
OPEN_USER = """{instruction}
{documents}
Question: {question}
The answer is"""
OPEN_TAIL = """
Question: {question}
The answer is"""
# The refine step conditions on the initial output (§3.2.1, p(y | d, x, y_hat)) but Table 11 shows no line for it;
# `show_initial: true` adds this one (an ablation). MODULE-1 always lists the n answers: "we provide all n
# generated outputs as well as the aforementioned top-k documents as part of the prompt" (§3.2.2).
INITIAL_LINE = "Initial answer (before reading the passages): {initial}"
INITIALS_LINE = "Initial answers (before reading the passages): {initial}"


def demonstrations(shots: int | None) -> str:
    """The system prompt: the first `shots` printed demonstrations (all five when None)."""
    return "\n".join(DEMONSTRATIONS[: len(DEMONSTRATIONS) if shots is None else shots])


def refine_prompt(question: str, passages, initial_line: str | None) -> str:
    """Table 11's open-book prompt; an initial-answer line (reconstructed) goes after the documents."""
    body = fill(OPEN_USER, question=question, documents=documents(passages), instruction=INSTRUCTION)
    if initial_line is None:
        return body
    tail = fill(OPEN_TAIL, question=question)
    return f"{body[: -len(tail)]}\n{initial_line}{tail}"


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
    """Table 11's document lines: "Title: Deadpool. Passage: ..." (the passage alone when it has no title)."""
    return "\n".join(f"Title: {p.title}. Passage: {p.body}" if p.title else f"Passage: {p.text}" for p in passages)


def merge_by_score(lists: list[list[Passage]], k: int) -> list[Passage]:
    """MODULE-1's merge: every retrieved document once (at its best score), ranked by retrieval score, top k.
    Ties keep first-seen order (query order, then rank). A retriever without scores (parametric, LLM-written
    text) cannot be ranked across queries: its lists are interleaved by rank instead."""
    if any(p.score is None for ps in lists for p in ps):
        seen: set[str] = set()
        out: list[Passage] = []
        for rank in range(max((len(ps) for ps in lists), default=0)):
            for ps in lists:
                if rank < len(ps) and ps[rank].pid not in seen:
                    seen.add(ps[rank].pid)
                    out.append(ps[rank])
        return out[:k]
    best: dict[str, tuple[float, int, Passage]] = {}
    order = 0
    for ps in lists:
        for p in ps:
            score = float(p.score)  # type: ignore[arg-type]  # checked above
            if p.pid not in best or score > best[p.pid][0]:
                best[p.pid] = (score, best[p.pid][1] if p.pid in best else order, p)
            order += 1
    ranked = sorted(best.values(), key=lambda t: (-t[0], t[1]))
    return [p for _, _, p in ranked[:k]]


_INITIAL_STARTS = (INITIAL_LINE.split("{")[0], INITIALS_LINE.split("{")[0])


def feedback_queries(question: str, answers: list[str]) -> list[str]:
    """One query per distinct initial answer ("question + answer"), in sample order."""
    out: list[str] = []
    for a in answers:
        q = f"{question} {a}".strip()
        if q not in out:
            out.append(q)
    return out


class RefeedSettings(ReaderSettings):
    feedback_k: int | None = Field(None, gt=0, le=100, description="documents retrieved with question+answer; default "
                                   f"{FEEDBACK_K} (seed 003)")
    feedback_samples: int | None = Field(None, ge=2, le=20, description="MODULE-1 (seed 003 §3.2.2): n initial answers "
                                         "sampled at temperature 0.7, top_p 0.9; one feedback retrieval each, merged "
                                         "by retrieval score to the top feedback_k")
    shots: int | None = Field(None, ge=0, le=5, description="demonstrations in the prompts, the first N of the five "
                              "printed in seed 003 Tables 10-11 (default all five); 0 is Table 2's zero-shot setting")
    show_initial: bool = Field(False, description="the refine prompt also shows the initial answer (an ablation; Table "
                               "11 shows question, documents and instruction only)")

    @property
    def initial_answers(self) -> int:
        """How many initial answers round 1 samples (MODULE-1's n; one greedy answer without it)."""
        return self.feedback_samples or 1


class ShotsSettings(ReaderSettings):
    shots: int | None = RefeedSettings.model_fields["shots"]


class Refeed(Reader):
    name = "refeed"
    prompt_version = f"{PROMPT_VERSION}+k{FEEDBACK_K}"  # the default feedback depth changes the calls too
    rounds = 2
    vote_version = "3"  # MODULE-2 by the arithmetic mean probability of all output tokens (§3.2.2)
    needs_logprobs = True
    retrieves_feedback = True
    Settings = RefeedSettings

    def version_for(self, settings: ReaderSettings) -> str:
        version = f"{self.prompt_version}+{MODULE1_VERSION}" if settings.initial_answers > 1 else self.prompt_version
        if settings.shots is not None:
            version += f"+shots{settings.shots}"
        return version + ("+initial" if settings.show_initial else "")

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        n = settings.initial_answers
        system = demonstrations(settings.shots)
        if round_no == 1:
            prompt = fill(CLOSED_USER, question=item.question)
            if n > 1:  # MODULE-1: n nucleus samples, one seeded request each
                return [Call("initial", system, prompt, (), sample_index=j, temperature=SAMPLE_TEMPERATURE,
                             top_p=SAMPLE_TOP_P, logprobs=True, parser="answer_is") for j in range(n)]
            return [Call("initial", system, prompt, (), temperature=0.0, logprobs=True, parser="answer_is")]
        initials = [g for g in history if g.role == "initial"]
        if not initials or settings.retrieve is None:
            return []  # closed-book cell: nothing to retrieve with
        k = settings.feedback_k or FEEDBACK_K
        answers = [g.parsed_answer for g in initials]
        lists = [settings.retrieve(q, k) for q in feedback_queries(item.question, answers)]
        passages = lists[0] if n == 1 else merge_by_score(lists, k)
        if not passages:
            return []
        if n > 1:
            shown = "; ".join(dict.fromkeys(a or "unknown" for a in answers))  # distinct, in sample order
            line: str | None = fill(INITIALS_LINE, initial=shown)
        else:
            line = fill(INITIAL_LINE, initial=answers[0] or "unknown") if settings.show_initial else None
        return [Call("refine", system, refine_prompt(item.question, passages, line), tuple(p.pid for p in passages),
                     temperature=0.0, logprobs=True, parser="answer_is")]

    def feedback_documents(self, question: str, role: str, prompt: str) -> str | None:
        """The documents block of a refine prompt: between the first line (the instruction) and the initial
        answer line or the closing question line."""
        if role != "refine":
            return None
        body = prompt.partition("\n")[2]
        ends = [i for i in (body.rfind("\n" + m) for m in (*_INITIAL_STARTS, fill(OPEN_TAIL, question=question)[1:]))
                if i >= 0]
        return body[: min(ends)] if ends else body

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        initials = [g for g in history if g.role == "initial"]
        refined = next((g for g in history if g.role == "refine"), None)
        if not initials:
            return Decision("refeed-no-generation", (), (), "unknown")
        # before feedback: the most probable initial answer (the only one without MODULE-1); ties to the earlier sample
        best = max(range(len(initials)), key=lambda i: (_rank_p(initials[i]), -i))
        initial = initials[best]
        if refined is None:
            return Decision("refeed-no-feedback", tuple(g.parsed_answer for g in initials), tuple(_p(g) for g in initials),
                            initial.parsed_answer or "unknown")
        cands = (*(g.parsed_answer for g in initials), refined.parsed_answer)
        scores = (*(_p(g) for g in initials), _p(refined))
        if initial.mean_logprob is None and refined.mean_logprob is None:  # the backend returned no log-probabilities
            return Decision("refeed-no-logprobs", cands, scores, refined.parsed_answer or "unknown")
        # MODULE-2 (seed 003 §3.2.2): keep the initial output only when its probability is higher than after
        # feedback; an output with no answer parsed from it (empty) loses
        chosen = initial.parsed_answer if _rank_p(initial) > _rank_p(refined) else refined.parsed_answer
        return Decision("refeed-answer-prob", cands, scores, chosen or "unknown")


class RefeedRefined(Refeed):
    """REFEED without MODULE-2 (seed 003 Table 4 ablation): always the refined answer."""

    name = "refeed_refined"

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        d = super().decide(item, history)
        if d.method in ("refeed-answer-prob", "refeed-no-logprobs"):  # the refined answer is the last candidate
            return Decision("refeed-refined", d.candidates, d.scores, d.candidates[-1] or "unknown")
        return d


class RetrieveRead(Reader):
    """Seed 003's Retrieve-Read baseline (Tables 2, 3, 5, 6; Lazaridou et al., 2022): Table 11's open-book prompt
    ([prompt words; passage; question], §4.1) over the cell's own retrieval (the question alone as the query), one
    greedy call, its answer taken as is. With no passages (a closed-book cell) it is Table 10's QA prompt. `shots`
    as for REFEED."""

    name = "retrieve_read"
    prompt_version = f"{PROMPT_VERSION}-retrieve-read"
    rounds = 1
    Settings = ShotsSettings

    def version_for(self, settings: ReaderSettings) -> str:
        return self.prompt_version + ("" if settings.shots is None else f"+shots{settings.shots}")

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        prompt = (refine_prompt(item.question, item.passages, None) if item.passages
                  else fill(CLOSED_USER, question=item.question))
        return [Call("answer", demonstrations(settings.shots), prompt, tuple(p.pid for p in item.passages),
                     temperature=0.0, parser="answer_is")]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        g = next((g for g in history if g.role == "answer"), None)
        answer = (g.parsed_answer if g is not None else "") or "unknown"
        return Decision("single", (answer,), (1.0,), answer)


def _p(g: Generation) -> float:
    """The output's mean token probability (strategies/readers/base.output_token_prob); NaN without one."""
    return math.nan if g.output_prob is None else float(g.output_prob)


def _rank_p(g: Generation) -> float:
    p = _p(g)
    return -math.inf if math.isnan(p) or not g.parsed_answer else p
