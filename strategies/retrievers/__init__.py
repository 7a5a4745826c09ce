"""Retrievers, named as in seed 002 and composed by a small grammar. Adding a retriever = one module
+ one entry in `SOURCES` (a base retriever taking `@k`), `PLAIN` (no k) or `WRAPPERS` (a function
of other retrievers).

    name     := plain | source '@' K | base '@rr@' K | fn '(' args ')'
    plain    := 'none' | 'parametric'
    source   := 'bm25' | 'dense'
    base     := source                      (its top RERANK_CANDIDATES = 50 are reranked)
              | name                        (whatever that retriever returns is reranked)
    fn(args) := 'hybrid(' name (',' name)+ ')'     concatenate, dedup by pid, first wins
              | 'compress(' name ')'               the LLM summarizes name's text for the question
              | 'trunc(' name ',' N ')'            word budget: at most N words in total
              | 'gold(' name [',' position [',' trigger]] ')'
                                                   seed 001: the gold paragraph in name's list
                                                   position: random (default) | first | last
                                                   trigger (random only): answer (default; inserted
                                                   when no gold answer occurs in name's text) | id
                                                   (inserted when name misses the gold paragraph id)

Examples: `bm25@10`, `dense@10`, `bm25@rr@10`, `hybrid(bm25@5,dense@5)`, `compress(bm25@10)`,
`trunc(parametric,100)`, `hybrid(bm25@25,dense@25)@rr@10`, `gold(bm25@5,random)`, `gold(bm25@5,random,id)`,
`gold(bm25@5,last)`, `parametric`, `none`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from strategies.retrievers.base import Hit, LLMFn, LLMPrompt, Query, Retriever
from strategies.retrievers.bm25 import BM25
from strategies.retrievers.closed_book import ClosedBook
from strategies.retrievers.compress import Compress
from strategies.retrievers.corpus import Corpus
from strategies.retrievers.dense import Dense
from strategies.retrievers.gold import POSITIONS, TRIGGERS, GoldInsert
from strategies.retrievers.hybrid import Hybrid
from strategies.retrievers.parametric import Parametric
from strategies.retrievers.rerank import RERANK_CANDIDATES, Rerank
from strategies.retrievers.truncate import Truncate

SOURCES: dict[str, Callable[[str, int], Retriever]] = {
    "bm25": lambda name, k: BM25(name, k),
    "dense": lambda name, k: Dense(name, k),
}
PLAIN: dict[str, Callable[[str], Retriever]] = {
    "none": lambda name: ClosedBook(name),
    "parametric": lambda name: Parametric(name),
}


def _hybrid(name: str, args: list[str], parse: Callable[[str], Retriever]) -> Retriever:
    if len(args) < 2:
        raise ValueError(f"hybrid(...) needs at least two retrievers, got {len(args)}")
    return Hybrid(name, [parse(a) for a in args])


def _compress(name: str, args: list[str], parse: Callable[[str], Retriever]) -> Retriever:
    if len(args) != 1:
        raise ValueError(f"compress(...) takes exactly one retriever, got {len(args)}")
    return Compress(name, parse(args[0]))


def _trunc(name: str, args: list[str], parse: Callable[[str], Retriever]) -> Retriever:
    if len(args) != 2:
        raise ValueError(f"trunc(...) takes a retriever and a word budget, e.g. trunc(bm25@10,500); got {len(args)} argument(s)")
    if not re.fullmatch(r"-?\d+", args[1]):
        raise ValueError(f"trunc(...): the word budget must be an integer, got {args[1]!r}")
    words = int(args[1])
    if words <= 0:
        raise ValueError(f"trunc(...): the word budget must be positive, got {words}")
    return Truncate(name, parse(args[0]), words)


def _gold(name: str, args: list[str], parse: Callable[[str], Retriever]) -> Retriever:
    if len(args) not in (1, 2, 3):
        raise ValueError("gold(...) takes a retriever, an optional position and, for random, an optional trigger, e.g. "
                         f"gold(bm25@5,random) or gold(bm25@5,random,id); got {len(args)} argument(s)")
    position = args[1] if len(args) >= 2 else "random"
    if position not in POSITIONS:
        raise ValueError(f"gold(...): the position must be one of {', '.join(POSITIONS)}, got {position!r}")
    trigger = args[2] if len(args) == 3 else "answer"
    if trigger not in TRIGGERS:
        raise ValueError(f"gold(...): the trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
    if len(args) == 3 and position != "random":
        # first/last put the gold paragraph on every question (strategies/retrievers/gold.py): a trigger would change
        # nothing but the cell's name
        raise ValueError(f"gold(...): a trigger applies to position random only; {position} always places the gold "
                         "paragraph")
    return GoldInsert(name, parse(args[0]), position, trigger)


def uses_gold(name: str) -> bool:
    """Whether a retriever name inserts gold paragraphs somewhere (it then needs a dataset that knows them)."""
    return re.search(r"(?:^|[(,@])gold\(", name.replace(" ", "")) is not None


WRAPPERS: dict[str, Callable[[str, list[str], Callable[[str], Retriever]], Retriever]] = {
    "hybrid": _hybrid,
    "compress": _compress,
    "trunc": _trunc,
    "gold": _gold,
}

_SOURCE_AT_K = re.compile(r"^(?P<src>[a-z0-9_]+)@(?P<k>[^@]*)$")
_RERANK = re.compile(r"^(?P<inner>.+)@rr@(?P<k>[^@()]*)$")
_CALL = re.compile(r"^(?P<fn>[a-z_]+)\((?P<args>.*)\)$", re.DOTALL)


def _positive_k(text: str, what: str) -> int:
    if not re.fullmatch(r"-?\d+", text.strip()):
        raise ValueError(f"{what}: k must be a positive integer, got {text!r}")
    k = int(text)
    if k <= 0:
        raise ValueError(f"{what}: k must be a positive integer, got {k}")
    return k


def _split_args(args: str) -> list[str]:
    """Split at top-level commas (commas inside nested parentheses belong to the nested name)."""
    parts, depth, current = [], 0, []
    for ch in args:
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        depth += ch == "("
        depth -= ch == ")"
        current.append(ch)
    parts.append("".join(current).strip())
    return parts


def _check_balanced(name: str) -> None:
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            raise ValueError(f"unbalanced parentheses: unexpected ')' at position {i + 1}")
    if depth:
        raise ValueError("unbalanced parentheses: missing ')'")


def _known() -> str:
    return (f"sources {sorted(SOURCES)} as '<source>@<k>' or '<source>@rr@<k>', plain {sorted(PLAIN)}, "
            f"wrappers {[f'{w}(...)' for w in sorted(WRAPPERS)]}")


def _parse(name: str) -> Retriever:
    if not name:
        raise ValueError("empty retriever name")
    if name in PLAIN:
        return PLAIN[name](name)
    m = _RERANK.match(name)
    if m:
        inner, k = m.group("inner").strip(), _positive_k(m.group("k"), f"{name!r}")
        base = SOURCES[inner](f"{inner}@{RERANK_CANDIDATES}", RERANK_CANDIDATES) if inner in SOURCES else _parse(inner)
        return Rerank(name, base, k)
    m = _CALL.match(name)
    if m:
        fn = m.group("fn")
        if fn not in WRAPPERS:
            raise ValueError(f"unknown wrapper {fn}(...) in {name!r}; known: {', '.join(sorted(WRAPPERS))}")
        args = _split_args(m.group("args"))
        if any(not a for a in args):
            raise ValueError(f"{fn}(...) in {name!r} has an empty argument")
        return WRAPPERS[fn](name, args, _parse)
    m = _SOURCE_AT_K.match(name)
    if m:
        src = m.group("src")
        if src in PLAIN:
            raise ValueError(f"{src!r} takes no '@k' (in {name!r})")
        if src not in SOURCES:
            raise ValueError(f"unknown retriever {src!r} in {name!r}; known: {_known()}")
        return SOURCES[src](name, _positive_k(m.group("k"), f"{name!r}"))
    if name in SOURCES:
        raise ValueError(f"{name!r} needs a depth: '{name}@<k>', e.g. '{name}@10'")
    raise ValueError(f"cannot parse {name!r}; known: {_known()}")


def parse_retriever(name: str) -> Retriever:
    """Build a retriever from its name, or raise ValueError saying what is wrong with the name."""
    if not isinstance(name, str):
        raise ValueError(f"retriever name must be a string, got {type(name).__name__}")
    name = name.strip()
    try:
        _check_balanced(name)
        return _parse(name)
    except ValueError as exc:
        problem = str(exc).removeprefix(f"{name!r}: ")  # a top-level problem names the retriever once
        raise ValueError(f"retriever {name!r}: {problem}") from None


__all__ = ["Corpus", "Hit", "LLMFn", "LLMPrompt", "Query", "Retriever", "parse_retriever", "uses_gold"]
