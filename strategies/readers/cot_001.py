"""Pruning prompt and Summary prompt (seed 001 §3.2.2, Fig. 8-9): one-shot chain of thought over all
top-k passages in one call; the answer is the text after the last "Answer:". With self-consistency
(`samples` > 1) the p sampled answers go to a majority vote."""

from __future__ import annotations

from strategies.readers.base import Call, Decision, Generation, Reader, ReaderInput, ReaderSettings, SampledSettings, fill
from strategies.readers.prompts_001 import (
    COT_MAX_TOKENS,
    COT_USER,
    COT_VERSION,
    FIG8_SYSTEM,
    FIG9_SYSTEM,
    majority_vote_or_single,
    numbered_context,
)


class _CoTPrompt(Reader):
    system: str
    prompt_version = COT_VERSION
    rounds = 1
    Settings = SampledSettings

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        prompt = fill(COT_USER, retrieved_topk_context=numbered_context(item.passages), question=item.question)
        pids = tuple(p.pid for p in item.passages)
        if settings.samples > 1:
            return [
                Call("answer", self.system, prompt, pids, sample_index=s, temperature=settings.sample_temperature,
                     max_tokens=COT_MAX_TOKENS, parser="final_answer")
                for s in range(settings.samples)
            ]  # fmt: skip
        return [Call("answer", self.system, prompt, pids, max_tokens=COT_MAX_TOKENS, parser="final_answer")]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        answers = [g.parsed_answer for g in history if g.role == "answer"]
        return majority_vote_or_single(answers) if answers else Decision("single", (), (), "unknown")


class PruningPrompt(_CoTPrompt):
    name = "pruning"
    system = FIG8_SYSTEM


class SummaryPrompt(_CoTPrompt):
    name = "summary"
    system = FIG9_SYSTEM
