"""What a retriever is: its queries, its hits, and the hook that opens the corpus it searches."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strategies.retrievers.corpus import Corpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hit:
    pid: str
    score: float | None
    title: str
    text: str  # exactly as the reader will see it


@dataclass(frozen=True)
class Query:
    qid: str
    text: str
    gold_pids: tuple[str, ...] = ()  # the question's gold paragraphs, where the dataset knows them (`gold(...)`)
    answers: tuple[str, ...] = ()  # its gold answers: `gold(...)` inserts when none occurs in the retrieved text


@dataclass(frozen=True)
class LLMPrompt:
    """One model call a retriever needs (compression, GenRead); sampling comes from the spec."""

    system: str
    prompt: str
    max_tokens: int


# Runs a batch of prompts on the experiment's model (cached, concurrent) and returns the outputs in order.
LLMFn = Callable[[list[LLMPrompt]], list[str]]


def reader_text(title: str, text: str) -> str:
    """The passage text a reader sees: its title, then its paragraph."""
    return f"{title}: {text}" if title else text


class Retriever(ABC):
    """A named retriever. `name` is the spec string (e.g. `bm25@5`), which also labels its cell."""

    code_version: str = "1"
    needs_corpus: bool = True  # False: closed book, parametric (no index to build)
    needs_llm: bool = False  # True: retrieve() must be given an LLMFn (compression, parametric)
    # True: a query's hits do not depend on the other queries of the batch (a lexical index; not an encoder, whose
    # batch padding moves scores in the last bits), so a shard may be retrieved in parts (flows/head_start.py)
    per_query: bool = False

    def __init__(self, name: str):
        self.name = name

    def start_engine(self) -> None:  # noqa: B027 (optional hook)
        """Start what searching needs before the corpus and its index are known (BM25: the JVM and Anserini's searcher
        class, ~1 s). A run's head start calls it in a thread of its own while it reads the dataset (flows/head_start.py)."""

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:  # noqa: B027 (optional hook)
        """Build or open whatever index this retriever needs (cached by corpus hash)."""

    @abstractmethod
    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        """Top hits per query id, best first. `llm` is required when `needs_llm`."""
