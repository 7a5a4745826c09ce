"""Reader strategies. Adding one = one module here plus one entry in READERS; its knobs are its `Settings` model."""

from __future__ import annotations

from strategies.readers.base import Reader
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

