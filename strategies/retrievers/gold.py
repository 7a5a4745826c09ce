"""`gold(X,position[,trigger])`: seed 001's "with gold passage" setting and its gold-position ablation (§4, §4.5).

For datasets that know each question's gold paragraph (SQuAD: `Question.gold_pids`), X's top-k gets the gold
paragraph, so the reader sees it exactly as stored in the RetrievalRecords:

- `random` (default; seed 001 Tables 1 and 6 "retrieval order"): inserted at a random position, seeded by the
  question id (the same position on every run and shard), only when X's top-k lacks the answer. What "lacks" means
  is the trigger:
  - `answer` (default): no gold answer string occurs in X's retrieved text — seed 001 §4.1, "If these passages
    don't contain the answer, we randomly integrate the gold passage among the Top-5 candidate passages". The test
    is Recall@k's own (`tasks/evaluate.py`: `has_answer` over `normalized_passages` of the stored texts, SQuAD
    normalization of `core/answers.py`), so a question gets the gold paragraph exactly when it is a Recall@k
    miss of X.
  - `id`: X's top-k misses the gold paragraph id (§4's setup wording, "If the gold passage is not within the top-k
    passages"), the trigger before GOLD_VERSION gold-2. It also inserts when another paragraph holds the answer.
  A top-k that already holds the gold paragraph is left as retrieved under both triggers (inserting would
  duplicate it; only a normalization mismatch can leave the answer "absent" from its own paragraph).
- `first` / `last` (§4.5, Fig. 6): the gold paragraph is always at the start / the end of the list, moved there
  when X retrieved it, inserted otherwise; no trigger (every question has it, so only its position differs).

The gold passage, answer present or not, is the dataset's gold paragraph (SQuAD: the paragraph the question was
written on), never another paragraph that happens to hold the answer. The list keeps X's length: an inserted gold
paragraph displaces X's lowest-ranked hit (with an empty list the gold paragraph is the only passage). An inserted
paragraph has no retrieval score (null); a moved one keeps its own. Queries without gold ids (REFEED's feedback
queries) pass through unchanged; a query with gold ids but no gold answers counts as "answer absent".
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from core.answers import has_answer, normalized_passages
from core.hashing import stable_hash
from strategies.retrievers.base import Hit, LLMFn, Query, Retriever
from strategies.retrievers.corpus import Corpus
from strategies.retrievers.lucene import PassageStore

POSITIONS = ("random", "first", "last")
TRIGGERS = ("answer", "id")  # what makes `random` insert: the answer string absent (default), the gold id absent
GOLD_VERSION = "gold-2"  # gold-2: `random` triggers on the answer string by default (gold-1: on the gold id only)


def answer_retrieved(hits: Sequence[Hit], answers: Sequence[str]) -> bool:
    """Whether a gold answer occurs in the hits' text, by the Recall@k definition of tasks/evaluate.py."""
    return has_answer(normalized_passages(h.text for h in hits), answers)


def gold_missing(hits: Sequence[Hit], gold_pid: str, trigger: str, answers: Sequence[str] = ()) -> bool:
    """Whether `random` inserts the gold paragraph into these hits (see the module docstring)."""
    if trigger not in TRIGGERS:
        raise ValueError(f"gold trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
    if any(h.pid == gold_pid for h in hits):
        return False
    return trigger == "id" or not answer_retrieved(hits, answers)


def insert_gold(hits: list[Hit], gold: Hit, position: str, seed_key: str, trigger: str = "answer",
                answers: Sequence[str] = ()) -> list[Hit]:
    """X's hits with the gold passage placed as `position` says (see the module docstring). Pure and seeded."""
    if position not in POSITIONS:
        raise ValueError(f"gold position must be one of {', '.join(POSITIONS)}, got {position!r}")
    if position == "random" and not gold_missing(hits, gold.pid, trigger, answers):
        return list(hits)
    found = next((h for h in hits if h.pid == gold.pid), None)
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
    def __init__(self, name: str, inner: Retriever, position: str = "random", trigger: str = "answer"):
        super().__init__(name)
        if position not in POSITIONS:
            raise ValueError(f"gold(...): the position must be one of {', '.join(POSITIONS)}, got {position!r}")
        if trigger not in TRIGGERS:
            raise ValueError(f"gold(...): the trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        self.inner, self.position, self.trigger = inner, position, trigger
        # the trigger decides only `random`'s lists; first/last place the gold paragraph on every question
        how = f"{position},{trigger}" if position == "random" else position
        self.code_version = f"{GOLD_VERSION}:{how}({inner.code_version})"
        self.per_query = inner.per_query
        self.needs_corpus = True  # the gold paragraph's text comes from the corpus
        self.needs_llm = inner.needs_llm
        self._store: PassageStore | None = None

    def start_engine(self) -> None:
        self.inner.start_engine()

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.inner.prepare(corpus, index_root, log=log)
        self._store = PassageStore.of(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        if self._store is None:
            raise RuntimeError(f"retriever {self.name!r}: prepare() it with the corpus before retrieving")
        inner = self.inner.retrieve(queries, llm)
        out: dict[str, list[Hit]] = {}
        for q in queries:
            hits = inner.get(q.qid, [])
            gold_pids = [p for p in q.gold_pids if p]
            if not gold_pids:
                out[q.qid] = hits
                continue
            found = next(((p, t) for p in gold_pids if (t := self._store.passage(p)) is not None), None)
            if found is None:
                raise ValueError(f"retriever {self.name!r}: the gold paragraph {gold_pids[0]!r} of question {q.qid!r} is not "
                                 "in the corpus (corpus.paths must include the dataset's own file)")
            pid, (title, text) = found
            out[q.qid] = insert_gold(hits, Hit(pid, None, title, text), self.position, q.qid, self.trigger, q.answers)
        return out
