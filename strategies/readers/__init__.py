"""Reader strategies. Adding one = one module here plus one entry in READERS."""

from __future__ import annotations

from strategies.readers.base import Reader, ReaderSettings
from strategies.readers.concatenation import Concatenation
from strategies.readers.cot_001 import PruningPrompt, SummaryPrompt
from strategies.readers.fallback_001 import ConcatThenPF, PFThenConcat
from strategies.readers.post_fusion import PostFusion
from strategies.readers.refeed import Refeed, RefeedRefined, RetrieveRead
from strategies.readers.sure import SuRe, SuReBase
from strategies.readers.sure_ablations import SuReGeneric, SuReMCQ, SuReRanking, SuReSummaries

READERS: dict[str, type[Reader]] = {
    Concatenation.name: Concatenation,
    PostFusion.name: PostFusion,
    PruningPrompt.name: PruningPrompt,
    SummaryPrompt.name: SummaryPrompt,
    ConcatThenPF.name: ConcatThenPF,
    PFThenConcat.name: PFThenConcat,
    Refeed.name: Refeed,
    RefeedRefined.name: RefeedRefined,
    RetrieveRead.name: RetrieveRead,
    SuRe.name: SuRe,
    SuReBase.name: SuReBase,
    SuReGeneric.name: SuReGeneric,
    SuReMCQ.name: SuReMCQ,
    SuReRanking.name: SuReRanking,
    SuReSummaries.name: SuReSummaries,
}


def get_reader(name: str) -> Reader:
    try:
        return READERS[name]()
    except KeyError:
        raise ValueError(f"unknown reader strategy {name!r}; known: {', '.join(sorted(READERS))}") from None


def settings_for(entry, retrieve=None) -> ReaderSettings:
    """ReaderSettings from a spec reader entry (schemas.spec.ReaderEntry)."""
    return ReaderSettings(samples=entry.samples, sample_temperature=entry.sample_temperature,
                          retrieve=retrieve, feedback_k=entry.feedback_k,
                          feedback_samples=entry.feedback_samples or 1, vote=entry.vote, shots=entry.shots,
                          show_initial=entry.show_initial, candidates=entry.candidates)
