"""What a reader strategy is: rounds of planned model calls, then a decision.

A reader never calls the model itself. For each round it *plans* calls from the question, its
passages and the generations of earlier rounds; the generate stage executes them (cached,
concurrently) and stores each as a GenerationRecord. After the last round the reader *decides*
the answer from all generations; the vote stage stores that as a VoteRecord. This keeps every
reader a pure, testable function of stored records.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from core.answers import is_unknown, normalize_answer

# enters the evaluate key of a reader with `narrows_context` (tasks/stages.py EvaluateStage.context)
FINAL_CONTEXT_VERSION = "final-call-1"


@dataclass(frozen=True)
class Passage:
    pid: str
    text: str  # exactly as the reader sees it
    title: str = ""  # for prompts that show title and text apart (SuRe)
    score: float | None = None  # the retriever's score, where a reader merges result lists (REFEED MODULE-1)

    @property
    def body(self) -> str:
        """The paragraph without the "title: " the reader text starts with (strategies/retrievers/base.reader_text), for
        prompts that show title and text apart."""
        prefix = f"{self.title}: "
        return self.text[len(prefix):] if self.title and self.text.startswith(prefix) else self.text


@dataclass(frozen=True)
class ReaderInput:
    qid: str
    question: str
    passages: tuple[Passage, ...]


@dataclass(frozen=True)
class Call:
    role: str
    system: str
    prompt: str
    passage_ids: tuple[str, ...] = ()
    sample_index: int = 0
    temperature: float | None = None  # None: the spec's sampling settings
    top_p: float | None = None
    max_tokens: int | None = None
    logprobs: bool = False
    parser: str = "short"  # how `parse_output` reads the answer


@dataclass(frozen=True)
class Generation:
    round: int
    role: str
    sample_index: int
    passage_ids: tuple[str, ...]
    output: str
    parsed_answer: str
    parse_status: str
    mean_logprob: float | None = None  # mean token log-probability of the whole output
    answer_prob: float | None = None  # arithmetic mean token probability of the parsed answer (answer_token_prob)
    output_prob: float | None = None  # arithmetic mean token probability of the whole output (output_token_prob)


@dataclass(frozen=True)
class Decision:
    method: str
    candidates: tuple[str, ...]
    scores: tuple[float, ...]
    chosen: str


class ReaderSettings(BaseModel):
    """A reader's settings from the spec: each reader declares its own subclass (`Reader.Settings`), whose fields are
    the knobs a spec's reader entry may set. Every field changes the reader's model calls (it enters the generate
    cache keys) unless named in `decides_only` (it then enters the vote key only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    decides_only: ClassVar[frozenset[str]] = frozenset()
    # feedback retrieval, provided by the generate stage from the cell's retriever (`with_retrieval`): (query text,
    # k or None for the cell's k) -> passages, best first; None without one. A run's tool, not a setting.
    _retrieve: Callable[[str, int | None], list[Passage]] | None = PrivateAttr(None)

    @property
    def retrieve(self) -> Callable[[str, int | None], list[Passage]] | None:
        return self._retrieve

    def with_retrieval(self, retrieve: Callable[[str, int | None], list[Passage]] | None) -> ReaderSettings:
        out = self.model_copy()
        out._retrieve = retrieve
        return out


class SampledSettings(ReaderSettings):
    """Self-consistency (seed 001 §4.4): the reader's calls are sampled `samples` times."""

    samples: int = Field(1, ge=1, le=64, description="self-consistency: p samples per call (seed 001 §4.4)")
    sample_temperature: float = Field(0.7, ge=0, le=2, description="temperature of the p samples")


class PooledSettings(SampledSettings):
    """A reader that decides over an answer pool: self-consistency, and how the pool becomes one answer."""

    decides_only: ClassVar[frozenset[str]] = frozenset({"vote"})
    vote: Literal["majority", "first"] = Field("majority", description="how the answer pool becomes one answer: "
                                               "majority (001 eq. 2) or first non-unknown by passage rank; changes no "
                                               "model call")


class Reader(ABC):
    name: str
    prompt_version: str  # enters the generate cache keys: a prompt change re-runs generation
    vote_version: str = "1"  # enters the vote cache keys only: a new decision rule re-runs no model call
    rounds: int = 1
    needs_logprobs: bool = False  # the embedded server then keeps all logits (slower prompts, more memory)
    Settings: ClassVar[type[ReaderSettings]] = ReaderSettings  # the knobs a spec's reader entry may set
    retrieves_feedback: bool = False  # retrieves again with its own queries (`settings.retrieve`)
    narrows_context: bool = False  # its final call may read less than the cell's retrieval (`final_context`)

    def version_for(self, settings: ReaderSettings) -> str:
        """The prompt version of this reader under these settings (enters the generate cache keys and the
        GenerationRecords); a setting that switches to another template adds that template's version."""
        return self.prompt_version

    def feedback_documents(self, question: str, role: str, prompt: str) -> str | None:
        """The feedback documents of one of this reader's stored prompts (REFEED's refine call), as text, or
        None when the call carries none. Evaluation scores Recall@k of feedback retrieval from it."""
        return None

    def final_context(self, generations: Sequence[Any], passage_text: Callable[[str], str]) -> str | None:
        """What this reader's final call read, as text, when that is not the cell's retrieval (seed 002's error
        decomposition asks whether the gold answer was in the context the reader saw); None for the retrieval.
        `generations` are one question's stored generation rows (role, round, passage_ids, parsed_answer, ...);
        `passage_text(pid)` is a retrieved passage's text. Only called when `narrows_context` is set."""
        return None

    @abstractmethod
    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        """The calls of round `round_no` (1-based) for one question; [] when this question needs none."""

    @abstractmethod
    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        """The final answer from all of this question's generations (no model call: votes are re-run freely)."""


# ---- prompt filling and output parsing -----------------------------------------------------------

_FIELD = re.compile(r"\{(\w+)\}")


def fill(template: str, **values: str) -> str:
    """Fill `{name}` fields in one pass. Values are inserted verbatim and never re-scanned, so a
    passage containing `{question}` or stray braces cannot break or inject into the prompt."""

    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        return values[key] if key in values else m.group(0)

    return _FIELD.sub(sub, template)


# a sentence ends at . ! ? after a lower-case letter or digit, so "U.S. Census" stays one sentence
_SENTENCE_END = re.compile(r"(?<=[a-z0-9%)\]][.!?])\s+(?=[A-Z\"“])")
COT_SHORT_ANSWER_WORDS = 5  # seed 001 Fig. 8-9: "a short factoid answer, often between 1 and 5 words"
_ANSWER_PREFIX = re.compile(r"^\s*(final\s+)?answer\s*[:：]\s*", re.IGNORECASE)


def clean_answer(text: str) -> str:
    text = _ANSWER_PREFIX.sub("", text.strip())
    text = text.strip().strip('"“”\'`*').strip()
    if text.endswith(".") and not re.search(r"\b[A-Z]\.$", text):
        text = text[:-1].rstrip()
    return text


def parse_output(output: str, parser: str = "short") -> tuple[str, str]:
    """Return (answer, parse_status). Never raises: messy outputs become 'unparseable' or 'empty'."""
    if output is None or not output.strip():
        return "", "empty"
    if parser == "short":
        first = next((ln for ln in output.strip().splitlines() if ln.strip()), "")
        answer = clean_answer(first)
        return (answer, "ok") if answer else ("", "empty")
    if parser == "final_answer":  # CoT prompts: the text after the last "Answer:"
        matches = list(re.finditer(r"answer\s*[:：]", output, re.IGNORECASE))
        if not matches:
            # a real model often skips the rationale and writes the answer alone ("2,000,000 base pairs"): an output
            # of one line within the format's "short factoid answer, often between 1 and 5 words" is that answer
            lines = [ln for ln in output.strip().splitlines() if ln.strip()]
            short = clean_answer(lines[0]) if len(lines) == 1 else ""
            if re.search(r"\w", short) and len(short.split()) <= COT_SHORT_ANSWER_WORDS:
                return short, "ok"
            # or it answers in prose with no "Answer:" ("The mayor of San Francisco is Ed Lee."): its last sentence
            # is the answer as written, flagged 'unmarked' (F1 credits it in part; %parse-fail counts it)
            answer = clean_answer(_SENTENCE_END.split(lines[-1].strip())[-1])
            return (answer, "unmarked") if re.search(r"\w", answer) else ("", "unparseable")
        tail = output[matches[-1].end() :].strip()
        first = next((ln for ln in tail.splitlines() if ln.strip()), "")
        answer = clean_answer(first)
        return (answer, "ok") if answer else ("", "unparseable")
    if parser in PARSERS:
        try:
            return PARSERS[parser](output)
        except Exception:  # a reader's parser must never crash the stage: the output is kept as-is
            return "", "error"
    raise ValueError(f"unknown parser {parser!r}")


# Reader-specific parsers, registered by the reader's module: output -> (answer, parse_status).
PARSERS: dict[str, Callable[[str], tuple[str, str]]] = {}


def register_parser(name: str, fn: Callable[[str], tuple[str, str]]) -> None:
    PARSERS[name] = fn


def first_answer_vote(answers: list[str]) -> Decision:
    """The answer of the highest-ranked passage that is not "unknown" (the pool is in passage rank order):
    a rank-trusting alternative to the majority, for vote ablations."""
    scores = tuple(0.0 for _ in answers)
    chosen = next((a for a in answers if not is_unknown(a)), "unknown")
    return Decision("first", tuple(answers), scores, chosen)


def pool_vote(answers: list[str], method: str = "majority") -> Decision:
    try:
        return POOL_VOTES[method](answers)
    except KeyError:
        raise ValueError(f"unknown vote method {method!r}; known: {', '.join(POOL_VOTES)}") from None


def majority_vote(answers: list[str]) -> Decision:
    """Majority vote over an answer pool (Post-Fusion, seed 001 eq. 2).

    Answers are grouped by their SQuAD-normalized form; "unknown" answers abstain and only win
    when every answer abstains. Ties go to the group whose first answer came earliest (the
    higher-ranked passage). The chosen surface form is the group's first answer.
    """
    groups: dict[str, list[int]] = {}
    for i, a in enumerate(answers):
        if not is_unknown(a):
            groups.setdefault(normalize_answer(a), []).append(i)
    candidates = tuple(answers)
    if not groups:
        return Decision("majority", candidates, tuple(0.0 for _ in answers), "unknown")
    best = max(groups.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
    counts = {k: len(v) for k, v in groups.items()}
    scores = tuple(float(counts.get(normalize_answer(a), 0)) if not is_unknown(a) else 0.0 for a in answers)
    return Decision("majority", candidates, scores, answers[best[1][0]])


POOL_VOTES: dict[str, Callable[[list[str]], Decision]] = {"majority": majority_vote, "first": first_answer_vote}


def output_token_prob(token_logprobs) -> float | None:
    """Seed 003 §3.2.2's P(y | x) = (1/t) * sum_i p(y_i | y_<i, x): the arithmetic mean of the probabilities of
    all t output tokens (the server's end-of-sequence token is not among them). None without log-probabilities."""
    if not token_logprobs:
        return None
    return sum(math.exp(float(lp)) for _, lp in token_logprobs) / len(token_logprobs)


def answer_token_prob(output: str, token_logprobs, answer: str) -> float | None:
    """The answer's probability as seed 003 defines it for MODULE-2: P = (1/t) * sum_i p(y_i | y_<i, ...), the
    arithmetic mean of the probabilities of the answer's t tokens. The answer's tokens are those whose characters
    overlap the parsed answer's span in the output (its last occurrence after the last "The answer is", else its last
    occurrence); tokens before it (a rationale, "The answer is") or after it (a trailing period, a new line) do
    not count. None without token log-probabilities or when the answer is not found in the output."""
    if not token_logprobs or not answer:
        return None
    spans, pos = [], 0
    for token, logprob in token_logprobs:
        at = output.find(token, pos) if token else pos
        at = pos if at < 0 else at  # a token the text does not spell the same way (bytes of one character)
        spans.append((at, at + len(token), float(logprob)))
        pos = at + len(token)
    lowered = output.lower()
    marker = max((m.end() for m in re.finditer(r"the\s+answer\s+is", lowered)), default=0)
    start = lowered.rfind(answer.lower(), marker)
    if start < 0:
        start = lowered.rfind(answer.lower())
    if start < 0:
        return None
    end = start + len(answer)
    probs = [math.exp(lp) for a, b, lp in spans if a < end and b > start and output[a:b].strip()]
    return sum(probs) / len(probs) if probs else None
