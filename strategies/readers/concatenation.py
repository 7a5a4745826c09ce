"""Concatenation (seed 001 §3.2.1, eq. 1): one call with the question and all top-k passages."""

from __future__ import annotations

from strategies.readers.base import Call, Decision, Generation, Reader, ReaderInput, ReaderSettings, SampledSettings, fill
from strategies.readers.prompts_001 import FIG7_SYSTEM, FIG7_USER, FIG7_VERSION, majority_vote_or_single


def join_passages(passages) -> str:
    return "\n\n".join(p.text for p in passages)


class Concatenation(Reader):
    name = "concatenation"
    prompt_version = FIG7_VERSION
    rounds = 1
    Settings = SampledSettings

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        prompt = fill(FIG7_USER, retrieved_topk_context=join_passages(item.passages), question=item.question)
        pids = tuple(p.pid for p in item.passages)
        if settings.samples > 1:  # self-consistency: p sampled outputs, then a majority vote
            return [
                Call("answer", FIG7_SYSTEM, prompt, pids, sample_index=s, temperature=settings.sample_temperature)
                for s in range(settings.samples)
            ]
        return [Call("answer", FIG7_SYSTEM, prompt, pids)]

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        return majority_vote_or_single([g.parsed_answer for g in history if g.role == "answer"])
