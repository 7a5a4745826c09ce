"""`gold(X,position)`: seed 001's "with gold passage" setting and its gold-position ablation (§4.1, §4.5).

For datasets that know each question's gold paragraph (SQuAD: `Question.gold_pids`), X's top-k gets the gold
paragraph when it lacks it, so the reader sees it exactly as stored in the RetrievalRecords:

- `random` (default; seed 001 Tables 1 and 6 "retrieval order"): only when X's top-k misses the gold paragraph,
  it is inserted at a random position, seeded by the question id (the same position on every run and shard);
  a top-k that already holds it is left as retrieved.
- `first` / `last` (§4.5, Fig. 6): the gold paragraph is always at the start / the end of the list, moved there
  when X retrieved it, inserted otherwise.

The list keeps X's length: an inserted gold paragraph displaces X's lowest-ranked hit (with an empty list the
gold paragraph is the only passage). An inserted paragraph has no retrieval score (null); a moved one keeps its
own. Queries without gold ids (REFEED's feedback queries) pass through unchanged.
"""

from __future__ import annotations

import random
from pathlib import Path

from tasks.retrievers.base import Corpus, Hit, LLMFn, Query, Retriever
from tracking.events import stable_hash

POSITIONS = ("random", "first", "last")
GOLD_VERSION = "gold-1"


def insert_gold(hits: list[Hit], gold: Hit, position: str, seed_key: str) -> list[Hit]:
    """X's hits with the gold passage placed as `position` says (see the module docstring). Pure and seeded."""
    if position not in POSITIONS:
        raise ValueError(f"gold position must be one of {', '.join(POSITIONS)}, got {position!r}")
    found = next((h for h in hits if h.pid == gold.pid), None)
    if position == "random" and found is not None:
        return list(hits)
    k = max(len(hits), 1)
    if found is not None:  # first/last: move it
        rest = [h for h in hits if h.pid != gold.pid]
        gold = found
    else:  # insert it in place of the lowest-ranked hit
        rest = list(hits[: k - 1])
    if position == "first":
        return [gold, *rest]
    if position == "last":
        return [*rest, gold]
    at = random.Random(stable_hash("gold-position", seed_key)).randrange(k)
    return [*rest[:at], gold, *rest[at:]]


class GoldInsert(Retriever):
    def __init__(self, name: str, inner: Retriever, position: str = "random"):
        super().__init__(name)
        if position not in POSITIONS:
            raise ValueError(f"gold(...): the position must be one of {', '.join(POSITIONS)}, got {position!r}")
        self.inner, self.position = inner, position
        self.code_version = f"{GOLD_VERSION}:{position}({inner.code_version})"
        self.needs_corpus = True  # the gold paragraph's text comes from the corpus
        self.needs_llm = inner.needs_llm
        self._corpus: Corpus | None = None

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.inner.prepare(corpus, index_root, log=log)
        self._corpus = corpus

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        if self._corpus is None:
            raise RuntimeError(f"retriever {self.name!r}: prepare() it with the corpus before retrieving")
        inner = self.inner.retrieve(queries, llm)
        texts = self._corpus.reader_texts()
        out: dict[str, list[Hit]] = {}
        for q in queries:
            hits = inner.get(q.qid, [])
            gold_pids = [p for p in q.gold_pids if p]
            if not gold_pids:
                out[q.qid] = hits
                continue
            pid = next((p for p in gold_pids if p in texts), None)
            if pid is None:
                raise ValueError(f"retriever {self.name!r}: the gold paragraph {gold_pids[0]!r} of question {q.qid!r} is not "
                                 "in the corpus (corpus.paths must include the dataset's own file)")
            title, text = texts[pid]
            out[q.qid] = insert_gold(hits, Hit(pid, None, title, text), self.position, q.qid)
        return out
