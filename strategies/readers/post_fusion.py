"""Post-Fusion with majority vote (seed 001 §3.2.1, eq. 2): one call per passage, then a vote."""

from __future__ import annotations

from strategies.readers.base import (
    Call,
    Decision,
    Generation,
    PooledSettings,
    Reader,
    ReaderInput,
    ReaderSettings,
    fill,
    pool_vote,
)
from strategies.readers.prompts_001 import FIG7_SYSTEM, FIG7_USER, FIG7_VERSION


def post_fusion_calls(item: ReaderInput, settings: ReaderSettings, role: str = "answer") -> list[Call]:
    calls = []
    for p in item.passages:
        prompt = fill(FIG7_USER, retrieved_topk_context=p.text, question=item.question)
        if settings.samples > 1:  # self-consistency: p samples per passage -> p x k answers
            calls += [
                Call(role, FIG7_SYSTEM, prompt, (p.pid,), sample_index=s, temperature=settings.sample_temperature)
                for s in range(settings.samples)
            ]
        else:
            calls.append(Call(role, FIG7_SYSTEM, prompt, (p.pid,)))
    return calls


class PostFusion(Reader):
    name = "post_fusion"
    prompt_version = FIG7_VERSION
    rounds = 1
    Settings = PooledSettings

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        return post_fusion_calls(item, settings)

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        method = settings.vote if settings else "majority"
        if not history:
            return Decision(method, (), (), "unknown")
        return pool_vote([g.parsed_answer for g in history if g.role == "answer"], method)
