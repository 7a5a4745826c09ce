"""`compress(X)`: seed 002's compression — the base LM summarizes X's text for the question.

The retriever returns one hit per question whose text is the model's summary, exactly as the
reader will see it (pid `compress:<qid>`; no score). The call goes through the experiment's cached
LLM client, so re-running makes no repeated call, and its prompt is fixed by COMPRESS_VERSION.
Questions whose X returned nothing get no hit (nothing to compress) and cost no call.
"""

from __future__ import annotations

from pathlib import Path

from strategies.readers.base import fill
from strategies.retrievers.base import Hit, LLMFn, LLMPrompt, Query, Retriever
from strategies.retrievers.corpus import Corpus
from strategies.retrievers.llm_prompts import COMPRESS_MAX_TOKENS, COMPRESS_SYSTEM, COMPRESS_USER, COMPRESS_VERSION


def compression_prompt(question: str, hits: list[Hit]) -> LLMPrompt:
    document = "\n\n".join(h.text for h in hits)
    return LLMPrompt(COMPRESS_SYSTEM, fill(COMPRESS_USER, query=question, document=document), COMPRESS_MAX_TOKENS)


class Compress(Retriever):
    needs_llm = True

    def __init__(self, name: str, inner: Retriever):
        super().__init__(name)
        self.inner = inner
        self.code_version = f"compress-1:{COMPRESS_VERSION}({inner.code_version})"
        self.needs_corpus = inner.needs_corpus

    def prepare(self, corpus: Corpus, index_root: Path, log=print) -> None:
        self.inner.prepare(corpus, index_root, log=log)

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        if llm is None:
            raise ValueError(f"retriever {self.name!r} calls the model: give retrieve() an LLM")
        inner = self.inner.retrieve(queries, llm)
        todo = [q for q in queries if inner.get(q.qid)]
        outputs = llm([compression_prompt(q.text, inner[q.qid]) for q in todo]) if todo else []
        out: dict[str, list[Hit]] = {q.qid: [] for q in queries}
        for q, text in zip(todo, outputs, strict=True):
            out[q.qid] = [Hit(f"compress:{q.qid}", None, "", text.strip())]
        return out
