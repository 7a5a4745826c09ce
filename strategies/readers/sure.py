"""SuRe (seed 004): Summarized Retrieval, with K = 2 answer candidates (§4.1), or 3 (`candidates: 3`, Table 6).

The prompts are the strings the official implementation (GitHub bbuing9/ICLR24_SuRe, functions/*.py, the
ChatGPT code path) builds, character for character: the paper's Listings 1-4 lost their line breaks in
extraction and Listing 5 lost its text, and where the paper and the code differ the code wins (Listing 4 prints
"Target Question: {Question}", the code writes "Target Question:\\nQuestion: {question}"; Listing 2 prints
"Choices: " and "Prediction: ", the code "Choices:" and "Prediction:" with no space).

Round 1: one call (Listing 1) yields candidates "(a) xx, (b) yy", kept as the official divide_candidates /
handle_except keep them (functions/gen_candidates.py: no length limit, an abstention is a candidate too).
Round 2: one candidate-conditioned summary per candidate (Listing 2).
Round 3: instance-wise validity per summary (Listing 3: True/False) and pair-wise ranking of the two
summaries asked in both orders (Listing 4).
Decision: argmax_k v(s_k) + r(s_k) (Eq. 6), ties to the earlier candidate, with the official get_final_pred_sure
(functions/get_preds.py) and postprocess_rank (functions/verification.py) deciding what counts: see
`sure_decision`. 1 + 2 + 2 + 2 = 7 calls per question; when the candidate output yields fewer than two distinct
candidates there is nothing to choose between and rounds 2-3 make no call (the one candidate, or "unknown", is
the answer; the official code makes the two ranking calls on 'N/A' summaries and then ties to candidate 1).
With `candidates: 3` (Appendix B.2, Table 6) round 1 asks for three candidates with a reconstructed prompt (the
paper prints none for K = 3 and the official code has K = 2 only: `candidates_user`), and rounds 2-3 run over the
candidates parsed: a summary and a validity check each, every pair ranked in both orders, r(s_k) the mean over the
pairs that include s_k (Eq. 5's sum divided by K - 1, so that v and r contribute equally, §3.3, as in the official
0.5 * r + 0.5 * v with r in [0, 1]), v(s_k) = 1 for a True verdict (Eq. 4). With two candidates the rules are the
official ones above (one pair: the mean is the sum). Table 6's Oracle (a question counts when any candidate is right) is EM + %NM of the cell:
its answer pool is the candidates (`pool_has_correct`).
`sure_base` is the paper's Base (Listing 5, the official get_query_baseline): the passages and a 3-word answer
instruction, one call; with no passages it is the paper's No retrieval.
`sure_ranking` and `sure_summaries` are Table 3's "+ Pair-wise ranking" and "Conditional summarizations" rows
(strategies/readers/sure_ablations.py).
"""

# ruff: noqa: E501  (the prompt templates are the official code's strings, kept on their original lines)
from __future__ import annotations

import re

from pydantic import Field

from core.answers import normalize_answer
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

# v2: candidate parser unwraps "(xx)"; v3: reads "(1) xx" labels; v4: the official code's prompt strings and its
# candidate rules (no length or abstention filter, long unmarked outputs split on commas, up to 4 choices listed)
PROMPT_VERSION = "004-listings1-5-v4"
VOTE_VERSION = "2"  # 2: one parseable ranking order decides alone; validity counts as get_final_pred_sure counts it
K = 2  # §4.1: "we use a fixed value of K = 2 for all the experiments"
CANDIDATE_COUNTS = (2, 3)  # the K of Table 6; the prompt's form has marks for three
MAX_CHOICES = 4  # divide_candidates reads the marks (a)-(d); the summary prompt lists all of them as choices
UNMARKED_MAX_PARTS = 4  # handle_except: an unmarked output of more than 4 comma parts stays one candidate

# functions/gen_candidates.py get_query_candidate
CANDIDATES_USER = "Below are {n} passages related to the question at the end. After reading the passages, provide two correct candidates for the answer to the question at the end. Each answer should be in the form: (a) xx, (b) yy, and should not exceed 3 words for each candidate.{passages}\n\nQuestion:\n{question}\n\nAnswer: "

# K = 3 (Table 6): CANDIDATES_USER with the count and the form extended; reconstructed, the paper prints no prompt
_NUMBER_WORDS = {2: "two", 3: "three"}
_FORMS = ("xx", "yy", "zz")


def candidates_user(k: int) -> str:
    """Listing 1 for k candidates: the official string for k = 2; for k = 3 the same with "three correct candidates"
    and the form "(a) xx, (b) yy, (c) zz" (reconstructed)."""
    if k == K:
        return CANDIDATES_USER
    form = ", ".join(f"({chr(97 + i)}) {_FORMS[i]}" for i in range(k))
    return (CANDIDATES_USER.replace("provide two correct candidates", f"provide {_NUMBER_WORDS[k]} correct candidates")
            .replace("(a) xx, (b) yy", form))


# functions/gen_summary.py gen_summary_mcq
SUMMARY_USER = """{passages}

Your job is to act as a professional writer. You will write a good-quality passage that can support the given prediction about the question only based on the information in the provided supporting passages.

Now, let's start. After you write, please write [DONE] to indicate you are done. Do not write a prefix (e.g., "Response:") while writing a passage.

Question: {question}
Choices:{choices}
Prediction:{prediction}
Passage: """

# functions/verification.py verification
VALIDITY_USER = """Question:
{question}

Prediction:
{prediction}

Passage:
{summary}

Does the passage correctly support the prediction? Choices: [True, False]. Answer:"""

# functions/verification.py ranking_summary (its target question is f"Question: {question}")
RANK_USER = """Question: Given the following passages, determine which one provides a more informative answer to the subsequent question.

Passage 1:
{summary1}

Passage 2:
{summary2}

Target Question:
Question: {question}

Your Task:
Identify which passage (Passage 1 or Passage 2) is more relevant and informative to answer the question at hand. Choices: [Passage 1, Passage 2].

Answer:"""

# functions/common.py get_query_baseline ("{question}." even after a question mark; N = 0: no passages)
BASE_USER = "{passages}Task description: predict the answer to the following question. Do not exceed 3 words.\n\nQuestion: {question}.\n\nAnswer: "

SYSTEM = ""  # one user message (the official ChatGPT code sends it as the system message, its open-LLM code as the user turn)
SUMMARY_MAX_TOKENS = 200
LABEL_MAX_TOKENS = 8


def passages_block(passages: tuple[Passage, ...]) -> str:
    """The passages as get_query_candidate and gen_summary_mcq write them: each after a blank line."""
    return "".join(f"\n\nPassage #{i} Title: {p.title}\nPassage #{i} Text: {p.body}" for i, p in enumerate(passages, 1))


def base_passages_block(passages: tuple[Passage, ...]) -> str:
    """The passages as get_query_baseline writes them: each followed by " " and a blank line."""
    return "".join(f"Passage #{i} Title: {p.title}\nPassage #{i} Text: {p.body} \n\n" for i, p in enumerate(passages, 1))


def base_prompt(passages: tuple[Passage, ...], question: str) -> str:
    return fill(BASE_USER, passages=base_passages_block(passages), question=question)


def choices_text(cands: list[str]) -> str:
    """functions/gen_summary.py convert_choices_to_texts: "(a) xx (b) yy"."""
    return " ".join(f"({chr(97 + i)}) {c}" for i, c in enumerate(cands))


# ---- parsers: never raise; anything unexpected is 'unparseable' -----------------------------------

# "(a)", "a)", and numbered "(1)" (digits only in brackets: "2)" may end a number); the 0.5B model writes "(1) xx"
_MARK = re.compile(r"(?:^|[\s,;(\[])(?:\(?([a-eA-E])\)|\(([1-5])\))\s*")
_LINE_MARK = re.compile(r"(?m)^\s*(?:[-*•]|\(?[a-eA-E1-5][).:])\s*")
_SEPARATORS = r",|;|\bor\b|\n"


def _clean_candidate(s: str) -> str:
    s = clean_answer(s.strip().strip(",;").strip())
    s = re.sub(r"\s*\[DONE\]\s*$", "", s).strip(" ,;.")
    if s.startswith("(") and s.endswith(")") and s.count("(") == 1:  # "(2000)": the whole candidate in brackets
        s = s[1:-1].strip()
    return s


def parse_candidates(output: str, k: int = K) -> list[str]:
    """Distinct candidates, in order, at most k, from "(a) xx, (b) yy" and the usual variants ("a) xx", lines
    "1. xx", "xx or yy", "xx, yy").

    Whatever the official post_process_candidate (functions/gen_candidates.py) keeps is kept: a candidate of any
    length, an abstention ("unknown"), and an unmarked output of any length (split on commas into at most 4
    parts, else kept whole). Beyond it: the marks "a)" and "(1)", line lists and "xx or yy" are read too; a
    candidate is its first line (an explanation on later lines is not part of it); candidates equal after SQuAD
    normalization are one candidate (the official code drops exact duplicates only; either of two such candidates
    scores the same EM / F1)."""
    text = (output or "").strip()
    text = re.sub(r"^\s*(?:answers?|candidates?)\s*[:：]\s*", "", text, flags=re.IGNORECASE)
    parts: list[str] = []
    marks = list(_MARK.finditer(text))
    if len(marks) >= 2:
        for m, nxt in zip(marks, [*marks[1:], None], strict=True):
            parts.append(text[m.end() : nxt.start() if nxt else len(text)])
    elif len(_LINE_MARK.findall(text)) >= 2:
        parts = [ln for ln in _LINE_MARK.split(text) if ln.strip()]
    elif marks:  # a single "(a) xx": handle_except splits the rest on commas
        parts = re.split(_SEPARATORS, text[marks[0].end() :])
    elif len(text.split()) <= 8:  # a short unmarked list: "xx, yy", "xx or yy"
        parts = re.split(_SEPARATORS, text)
    else:  # a longer unmarked output: handle_except's comma split, or the whole output when it has more than 4 parts
        parts = text.split(",")
        if len(parts) > UNMARKED_MAX_PARTS:
            parts = [text]
    out, seen = [], set()
    for p in parts:
        c = _clean_candidate(next((ln for ln in p.splitlines() if ln.strip()), ""))
        key = normalize_answer(c) or c.casefold()  # "A" normalizes to "" and is still a candidate
        if c and key not in seen:
            seen.add(key)
            out.append(c)
    return out[:k]


def _parse_candidates_output(output: str, k: int = K) -> tuple[str, str]:
    cands = parse_candidates(output, k)
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
    return "", "unparseable"  # neither or both


register_parser("sure_candidates", _parse_candidates_output)
register_parser("sure_candidates3", lambda output: _parse_candidates_output(output, 3))
register_parser("sure_summary", _parse_summary)
register_parser("true_false", _parse_true_false)
register_parser("passage_choice", _parse_passage_choice)


def candidates_from(history: list[Generation], k: int = K) -> list[str]:
    """The candidates of a question's round-1 (`candidates`) generation; [] if there is none."""
    g = next((g for g in history if g.role == "candidates"), None)
    return parse_candidates(g.output, k) if g is not None else []


def candidates_call(item: ReaderInput, k: int = K) -> Call:
    """SuRe's round 1 (Listing 1): k candidate answers from the passages. sure_mcq, sure_ranking and
    sure_summaries make the same call, so the LLM-call cache serves it once to all."""
    prompt = fill(candidates_user(k), n=str(len(item.passages)), passages=passages_block(item.passages),
                  question=item.question)
    parser = "sure_candidates" if k == K else f"sure_candidates{k}"
    return Call("candidates", SYSTEM, prompt, tuple(p.pid for p in item.passages), parser=parser)


def summary_calls(item: ReaderInput, history: list[Generation], k: int = K) -> list[Call]:
    """SuRe's round 2 (Listing 2): one summary per candidate (at most k); the choices line lists every parsed
    candidate, up to 4, as gen_summary_mcq does. [] with fewer than two candidates."""
    cands = candidates_from(history, k)
    if len(cands) < 2:
        return []
    choices = choices_text(candidates_from(history, MAX_CHOICES))
    pids = tuple(p.pid for p in item.passages)
    return [
        Call("summary", SYSTEM, fill(SUMMARY_USER, passages=passages_block(item.passages), question=item.question,
                                     choices=choices, prediction=f"({chr(97 + i)}) {c}"),
             pids, sample_index=0, max_tokens=SUMMARY_MAX_TOKENS, parser="sure_summary")
        for i, c in enumerate(cands)
    ]  # fmt: skip


def summaries_from(history: list[Generation]) -> list[str]:
    return [g.parsed_answer for g in history if g.role == "summary"]


RANK_ORDERS = ((0, 1), (1, 0))  # the first ranking call shows (s_1, s_2), the second (s_2, s_1)


def rank_orders(n: int) -> list[tuple[int, int]]:
    """Every pair of n summaries in both orders, pair by pair: RANK_ORDERS for two."""
    return [order for a in range(n) for b in range(a + 1, n) for order in ((a, b), (b, a))]


def rank_calls(item: ReaderInput, summaries: list[str]) -> list[Call]:
    return [Call("rank", SYSTEM, fill(RANK_USER, summary1=summaries[a], summary2=summaries[b], question=item.question),
                 (), max_tokens=LABEL_MAX_TOKENS, parser="passage_choice") for a, b in rank_orders(len(summaries))]


class SuReSettings(ReaderSettings):
    candidates: int | None = Field(None, ge=2, le=3, description=f"K answer candidates (seed 004; default {K} as in "
                                   "§4.1); 3 is Table 6's, with a reconstructed round-1 prompt")


def candidate_count(settings: ReaderSettings | None) -> int:
    return (settings.candidates if isinstance(settings, SuReSettings) else None) or K


def first_two_rounds(round_no: int, item: ReaderInput, history: list[Generation], k: int = K) -> list[Call] | None:
    """SuRe's rounds 1-2 (candidates, then one conditional summary each), shared by `sure_ranking` and
    `sure_summaries`, whose identical calls the LLM-call cache serves once; None from round 3 on."""
    if round_no == 1:
        return [candidates_call(item, k)]
    if round_no == 2:
        return summary_calls(item, history, k)
    return None


class SuRe(Reader):
    name = "sure"
    prompt_version = PROMPT_VERSION
    vote_version = f"{VOTE_VERSION}+r-mean"  # r(s_k) averaged over its K - 1 pairs (the same for K = 2)
    rounds = 3
    Settings = SuReSettings

    def version_for(self, settings: ReaderSettings) -> str:
        k = candidate_count(settings)
        return self.prompt_version if k == K else f"{self.prompt_version}+k{k}-reconstructed"

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        k = candidate_count(settings)
        if (calls := first_two_rounds(round_no, item, history, k)) is not None:
            return calls
        cands, summaries = candidates_from(history, k), summaries_from(history)
        if len(cands) < 2 or len(summaries) < len(cands):
            return []
        calls = [
            Call("validity", SYSTEM, fill(VALIDITY_USER, question=item.question, prediction=c, summary=s), (),
                 max_tokens=LABEL_MAX_TOKENS, parser="true_false")
            for c, s in zip(cands, summaries, strict=True)
        ]  # fmt: skip
        return calls + rank_calls(item, summaries)

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        cands = candidates_from(history, candidate_count(settings))
        if not cands:
            return Decision("sure-unparseable", (), (), "unknown")
        validity = [g for g in history if g.role == "validity"]
        ranks = [g for g in history if g.role == "rank"]
        if len(cands) < 2 or len(validity) < len(cands) or len(ranks) < len(rank_orders(len(cands))):
            return single_candidate(cands)
        return sure_decision(cands, validity, ranks)


def single_candidate(cands: list[str]) -> Decision:
    scores = tuple(1.0 if i == 0 else 0.0 for i in range(len(cands)))
    return Decision("sure-single-candidate", tuple(cands), scores, cands[0])


def rank_scores(ranks: list[Generation], n: int = K) -> tuple[float, ...]:
    """r(s_1) .. r(s_n) from the ranking calls (`rank_orders(n)`): each pair's two orders scored as the official
    postprocess_rank (functions/verification.py) scores them, and r(s_k) the sum over the pairs with s_k (Eq. 5;
    one pair for two candidates). A pair: both orders name the same summary -> 1 / 0; each order names the same
    position (order bias) or neither order is readable -> 0.5 each; exactly one order readable -> that order decides
    alone (1 / 0; Eq. 5 would give its r_pair 0.5 for the other order, the code does not).
    Readable is wider than the official exact match "passage 1" / "passage 2": any output naming one passage
    (`_parse_passage_choice`, e.g. "Passage 1." which the official list of corner cases counts as an error)."""
    orders, totals = rank_orders(n), [0.0] * n
    for i in range(0, len(orders), 2):
        pair, winners = orders[i], []
        for g, order in zip(ranks[i : i + 2], orders[i : i + 2], strict=True):
            label, status = _parse_passage_choice(g.output or "")
            if status == "ok":
                winners.append(order[int(label) - 1])
        if len(set(winners)) == 1:  # one readable order, or both naming the same summary
            totals[winners[0]] += 1.0
        else:
            totals[pair[0]] += 0.5
            totals[pair[1]] += 0.5
    return tuple(totals)


_NO_VERDICT_NEGATIVE = re.compile(r"\b(?:cannot|unknown)\b", re.IGNORECASE)


def validity_verdict(g: Generation) -> str:
    """'True', 'False' or '' (no verdict). error_check_fin (functions/get_preds.py) counts an output saying
    'Cannot' or 'Unknown' as a negative verdict, like 'False'."""
    label, status = _parse_true_false(g.output or "")
    if status == "ok":
        return label
    return "False" if _NO_VERDICT_NEGATIVE.search(g.output or "") else ""


def validity_scores(validity: list[Generation]) -> tuple[float, ...]:
    """v(s_1), v(s_2) (Eq. 4) where get_final_pred_sure lets validity count: both True (1, 1), both False (0, 0),
    one True and the other False / Cannot / Unknown (1, 0). One True and the other giving no verdict: the official
    code decides by ranking alone, so (0, 0) (Eq. 4 would give (1, 0)). Three or more summaries (`candidates: 3`,
    which the official code does not have): Eq. 4 as printed, 1 for a True verdict, else 0."""
    if len(validity) != 2:
        return tuple(1.0 if validity_verdict(g) == "True" else 0.0 for g in validity)
    v1, v2 = (validity_verdict(g) for g in validity)
    if {v1, v2} == {"True", "False"} or v1 == v2 == "True":
        return (1.0 if v1 == "True" else 0.0), (1.0 if v2 == "True" else 0.0)
    return 0.0, 0.0


def argmax_first(scores: tuple[float, ...]) -> int:
    """Ties go to the earlier candidate (seed 004 §4.1; get_final_pred_sure picks candidate 1 on any tie)."""
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def sure_decision(cands: list[str], validity: list[Generation], ranks: list[Generation]) -> Decision:
    """argmax_k v_k + r_k (Eq. 6), ties to the earlier candidate. The official get_final_pred_sure computes
    0.5 * r + 0.5 * v when validity counts and r alone otherwise: the same argmax and the same ties as v + r with
    `validity_scores` (half of it in the first case; in the second v is equal for both candidates). r_k is Eq. 5's
    sum over the K - 1 pairs with s_k divided by K - 1: in [0, 1] like v, so both "equally contribute" (§3.3) at
    K = 3 too, where the sum (0-2) would let a summary judged invalid that won both its pairs beat the only valid one."""
    v, r = validity_scores(validity), rank_scores(ranks, len(cands))
    pairs = len(cands) - 1
    scores = tuple(v[i] + r[i] / pairs for i in range(len(cands)))
    return Decision("sure", tuple(cands), scores, cands[argmax_first(scores)])


class SuReBase(Reader):
    """SuRe's Base (seed 004 Listing 5, whose text the extraction lost; the official get_query_baseline):
    retrieved passages plus "predict the answer ... Do not exceed 3 words". With the `none` retriever it is the
    paper's No retrieval (N = 0: the instruction and the question only)."""

    name = "sure_base"
    prompt_version = PROMPT_VERSION
    rounds = 1

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        return [Call("answer", SYSTEM, base_prompt(item.passages, item.question), tuple(p.pid for p in item.passages))]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        g = next((g for g in history if g.role == "answer"), None)
        answer = g.parsed_answer if g is not None else ""
        return Decision("single", (answer,), (1.0,), answer or "unknown")
