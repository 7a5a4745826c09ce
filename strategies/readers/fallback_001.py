"""The two multi-round strategies of seed 001 §3.3 (Fig. 2).

- Concat+PF (Post-Fusion as the Fallback): round 1 Concatenation; round 2 Post-Fusion only for the
  questions whose round-1 answer is "unknown" (or unparseable); the PF pool is majority-voted.
- PF+Concat (Concatenation as the Distiller): round 1 Post-Fusion; passages whose PF answer is
  "unknown" are dropped; round 2 concatenates the remaining passages with the question and the
  round-1 candidate answers, and the model's answer is final.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from core.answers import is_unknown, normalize_answer
from strategies.readers.base import (
    Call,
    Decision,
    Generation,
    PooledSettings,
    Reader,
    ReaderInput,
    ReaderSettings,
    SampledSettings,
    fill,
    pool_vote,
)
from strategies.readers.concatenation import Concatenation, join_passages
from strategies.readers.post_fusion import post_fusion_calls
from strategies.readers.prompts_001 import DISTILL_USER, DISTILL_VERSION, FIG7_SYSTEM, FIG7_VERSION, majority_vote_or_single


def _answers(history: list[Generation], round_no: int) -> list[str]:
    return [g.parsed_answer for g in history if g.round == round_no]


class ConcatThenPF(Reader):
    name = "concat_pf"
    prompt_version = FIG7_VERSION
    rounds = 2
    Settings = PooledSettings  # the Post-Fusion fallback's pool

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if round_no == 1:
            return Concatenation().plan(1, item, [], settings)
        first = majority_vote_or_single(_answers(history, 1)) if _answers(history, 1) else None
        if first is not None and not is_unknown(first.chosen):
            return []  # Concatenation answered: no fallback
        return post_fusion_calls(item, settings, role="fallback")

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        fallback = _answers(history, 2)
        if fallback:
            d = pool_vote(fallback, settings.vote if settings else "majority")
            return Decision(f"fallback-{d.method}", d.candidates, d.scores, d.chosen)
        first = _answers(history, 1)
        return majority_vote_or_single(first) if first else Decision("single", (), (), "unknown")


class PFThenConcat(Reader):
    name = "pf_concat"
    prompt_version = f"{FIG7_VERSION}+{DISTILL_VERSION}"
    rounds = 2
    Settings = SampledSettings

    @staticmethod
    def kept(item: ReaderInput, history: list[Generation]) -> tuple[list, list[str]]:
        """Passages with at least one non-unknown PF answer (rank order), and the distinct candidates."""
        answered: dict[str, list[str]] = {}
        for g in history:
            if g.round == 1 and not is_unknown(g.parsed_answer):
                answered.setdefault(g.passage_ids[0], []).append(g.parsed_answer)
        passages = [p for p in item.passages if p.pid in answered]
        candidates, seen = [], set()
        for p in passages:
            for a in answered[p.pid]:
                if normalize_answer(a) not in seen:
                    seen.add(normalize_answer(a))
                    candidates.append(a)
        return passages, candidates

    def plan(self, round_no: int, item: ReaderInput, history: list[Generation], settings: ReaderSettings) -> list[Call]:
        if round_no == 1:
            return post_fusion_calls(item, settings)
        passages, candidates = self.kept(item, history)
        if not passages:
            return []  # every passage said unknown: nothing to distil
        prompt = fill(DISTILL_USER, retrieved_topk_context=join_passages(passages),
                      candidates="\n".join(f"- {c}" for c in candidates), question=item.question)
        pids = tuple(p.pid for p in passages)
        if settings.samples > 1:
            return [Call("distill", FIG7_SYSTEM, prompt, pids, sample_index=s, temperature=settings.sample_temperature)
                    for s in range(settings.samples)]
        return [Call("distill", FIG7_SYSTEM, prompt, pids)]

    narrows_context = True

    def final_context(self, generations: Sequence[Any], passage_text: Callable[[str], str]) -> str | None:
        """The distil call reads only the passages Post-Fusion kept (those with a non-unknown answer); without a
        distil call the final round is Post-Fusion's, which read every passage."""
        distil = next((g for g in generations if g.round == 2), None)
        return None if distil is None else "\n\n".join(passage_text(pid) for pid in distil.passage_ids)

    def decide(self, item: ReaderInput, history: list[Generation], settings: ReaderSettings | None = None) -> Decision:
        pool = tuple(_answers(history, 1))  # the PF answer pool: %NM asks whether distilling lost a correct one
        final = _answers(history, 2)
        if not final:
            return Decision("distill", pool, tuple(0.0 for _ in pool), "unknown")
        chosen = majority_vote_or_single(final).chosen
        key = normalize_answer(chosen)
        return Decision("distill", pool, tuple(float(normalize_answer(a) == key) for a in pool), chosen)
