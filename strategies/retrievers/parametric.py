"""`parametric`: GenRead (seed 002's parametric-knowledge source) — the base LM writes a background
document for the question, and that document is the retrieved text (pid `genread:<qid>`)."""

from __future__ import annotations

from strategies.readers.base import fill
from strategies.retrievers.base import Hit, LLMFn, LLMPrompt, Query, Retriever
from strategies.retrievers.llm_prompts import GENREAD_MAX_TOKENS, GENREAD_SYSTEM, GENREAD_USER, GENREAD_VERSION


def genread_prompt(question: str) -> LLMPrompt:
    return LLMPrompt(GENREAD_SYSTEM, fill(GENREAD_USER, query=question), GENREAD_MAX_TOKENS)


class Parametric(Retriever):
    code_version = f"parametric-1:{GENREAD_VERSION}"
    needs_corpus = False
    needs_llm = True

    def retrieve(self, queries: list[Query], llm: LLMFn | None = None) -> dict[str, list[Hit]]:
        if llm is None:
            raise ValueError(f"retriever {self.name!r} calls the model: give retrieve() an LLM")
        outputs = llm([genread_prompt(q.text) for q in queries]) if queries else []
        return {q.qid: [Hit(f"genread:{q.qid}", None, "", text.strip())] for q, text in zip(queries, outputs, strict=True)}
