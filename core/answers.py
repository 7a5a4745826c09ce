"""Answer normalization and scoring with the official SQuAD v1.1 evaluation semantics.

The functions mirror the official `evaluate-v1.1.py` exactly (lowercase, drop punctuation,
drop the articles a/an/the, collapse whitespace; max over the gold answers), so scores can be
checked against it. Unknown detection and `has_answer` follow docs/papers.md ("Definitions" of seeds 001 and 002).
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from collections.abc import Iterable

_PUNCT_BYTES = string.punctuation.encode()
_ARTICLES = re.compile(r"\b(?:the|an?)\b")  # the official r"\b(a|an|the)\b": the same whole words


def normalize_answer(text: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (SQuAD v1.1)."""
    # the ASCII punctuation deleted from the UTF-8 bytes: no ASCII byte occurs inside a multi-byte character, so this
    # is the official per-character deletion, twice as fast as str.translate on a passage with any non-ASCII letter
    # (evaluation normalizes every retrieved passage; tests/test_answers.py holds it to the official wording)
    text = text.lower().encode("utf-8", "surrogatepass").translate(None, _PUNCT_BYTES).decode("utf-8", "surrogatepass")
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


# answers (gold answers, predictions) normalized once: a gold answer is normalized for EM, F1 and the gold-in-context
# check of every reader. Contexts are not kept here (each is normalized once by `normalized_context`)
_normalized_answer = functools.lru_cache(maxsize=2**15)(normalize_answer)


def exact_match(prediction: str, gold: str) -> float:
    return float(_normalized_answer(prediction) == _normalized_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    pred_tokens = _normalized_answer(prediction).split()
    gold_tokens = _normalized_answer(gold).split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def max_over_gold(metric, prediction: str, golds: Iterable[str]) -> float:
    scores = [metric(prediction, g) for g in golds]
    return max(scores) if scores else 0.0


def em_score(prediction: str, golds: Iterable[str]) -> float:
    return max_over_gold(exact_match, prediction, golds)


def f1_score(prediction: str, golds: Iterable[str]) -> float:
    return max_over_gold(token_f1, prediction, golds)


# Phrases a reader uses to abstain. Matched on the normalized prediction, as whole answers or
# as the answer's opening words ("unknown, the passage does not say").
UNKNOWN_PHRASES = (
    "unknown",
    "no answer",
    "not known",
    "cannot be determined",
    "can not be determined",
    "cannot answer",
    "i dont know",
    "i do not know",
    "not enough information",
    "no information",
    "not mentioned",
    "not provided",
    "no context",
    "insufficient information",
)


_LEADING_ABSTENTION = re.compile(
    r"^\W*(" + "|".join(re.escape(p).replace("\\ ", r"\W+") for p in ("unknown", "no answer", "cannot be determined",
                                                                     "i don't know", "i do not know", "not enough information"))
    + r")\s*[.,;:!\-–—(]", re.IGNORECASE)


def is_unknown(prediction: str | None) -> bool:
    """True when the answer is empty or abstains: "unknown" and documented variants, either as the
    whole answer or followed by punctuation and an explanation ("Unknown - the passage does not say").
    "Unknown Pleasures" is an answer, not an abstention."""
    if prediction is None:
        return True
    norm = normalize_answer(prediction)
    if not norm:
        return True
    return norm in UNKNOWN_PHRASES or bool(_LEADING_ABSTENTION.match(prediction))


def contains_token_sequence(haystack: str, needle: str) -> bool:
    """True when the normalized needle occurs as a whole-token subsequence of the normalized haystack."""
    return _contains(normalized_context(haystack), normalize_answer(needle))


class NormalizedContext(str):
    """A context normalized and space-padded once (`normalized_context`), for several checks against it."""


def normalized_context(text: str) -> NormalizedContext:
    """`text` normalized once for several `has_answer` / `contains_token_sequence` checks (normalizing a
    five-passage context was most of evaluate's per-question cost; an already normalized one is returned as is)."""
    if isinstance(text, NormalizedContext):
        return text
    return NormalizedContext(f" {normalize_answer(text)} ")


@functools.lru_cache(maxsize=2**15)
def _normalized_passage(text: str) -> str:
    return normalize_answer(text)


def normalized_passages(texts: Iterable[str]) -> NormalizedContext:
    """`normalized_context` of the passages joined by blank lines, with each passage normalized once per process:
    a passage recurs across questions, and every reader cell of a retriever checks the same contexts. The same
    string: normalization never joins or splits tokens across the whitespace between passages."""
    return NormalizedContext(f" {' '.join(p for p in map(_normalized_passage, texts) if p)} ")


def _contains(padded_haystack: str, normalized_needle: str) -> bool:
    # normalized text is tokens joined by single spaces, so a whole-token subsequence is exactly a substring
    # bounded by spaces
    return bool(normalized_needle) and f" {normalized_needle} " in padded_haystack


def has_answer(context: str, golds: Iterable[str]) -> bool:
    """`gold_in_context`: some normalized gold answer occurs as a token subsequence of the context."""
    golds = list(golds)
    if not golds:
        return False
    padded = normalized_context(context)  # normalized once, not once per gold answer
    return any(_contains(padded, _normalized_answer(g)) for g in golds)


def gold_spans(text: str, golds: Iterable[str]) -> list[tuple[str, bool]]:
    """text cut into (piece, is_gold) runs: every case-insensitive occurrence of a gold answer (longest
    first) is its own piece, for highlighting passages in `ragledger trace` and the HTML report."""
    ordered = sorted({g for g in golds if g.strip()}, key=len, reverse=True)
    if not ordered:
        return [(text, False)]
    pattern = re.compile("|".join(re.escape(g) for g in ordered), re.IGNORECASE)
    out, last = [], 0
    for m in pattern.finditer(text):
        out += [(text[last : m.start()], False), (m.group(0), True)]
        last = m.end()
    out.append((text[last:], False))
    return [(piece, gold) for piece, gold in out if piece]
