"""Retrievers, named as in seed 002: `bm25@10`, `none`, ... Adding one = one module + one entry in
`SOURCES` (a base retriever taking `@k`) or `PLAIN` (a retriever without k)."""

from __future__ import annotations

import re
from collections.abc import Callable

from tasks.retrievers.base import Corpus, Hit, Query, Retriever
from tasks.retrievers.bm25 import BM25
from tasks.retrievers.closed_book import ClosedBook

SOURCES: dict[str, Callable[[str, int], Retriever]] = {
    "bm25": lambda name, k: BM25(name, k),
}
PLAIN: dict[str, Callable[[str], Retriever]] = {
    "none": lambda name: ClosedBook(name),
}

_SOURCE_AT_K = re.compile(r"^(?P<src>[a-z0-9_]+)@(?P<k>-?\d+)$")


def parse_retriever(name: str) -> Retriever:
    """Build a retriever from its name, or raise ValueError saying what is wrong with the name."""
    name = name.strip()
    if name in PLAIN:
        return PLAIN[name](name)
    m = _SOURCE_AT_K.match(name)
    if m:
        src, k = m.group("src"), int(m.group("k"))
        if src not in SOURCES:
            raise ValueError(f"unknown retriever {src!r} in {name!r}; known: {', '.join(sorted([*SOURCES, *PLAIN]))}")
        if k <= 0:
            raise ValueError(f"retriever {name!r}: k must be a positive integer, got {k}")
        return SOURCES[src](name, k)
    raise ValueError(
        f"unknown retriever {name!r}; expected '<source>@<k>' with source in {sorted(SOURCES)} or one of {sorted(PLAIN)}"
    )


__all__ = ["Corpus", "Hit", "Query", "Retriever", "parse_retriever"]
