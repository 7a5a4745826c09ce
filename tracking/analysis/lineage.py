"""Lineage of a question through one cell: the records that led to its outcome (retrieved passages, every
generation, the vote), read from the latest execution's segments. `ragledger trace` (ragledger/trace.py) renders
it on the terminal and the report's drill-down (tracking/report/report.py) as HTML; both take it from here, so they show
the same chain."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from core.cell import is_ensemble_retriever
from tracking.store.ledger import Ledger

CHAIN_KINDS = ("retrievals", "generations", "votes")


def chain_records(store_root: str | Path, experiment: str, qids: list[str]) -> dict[str, pd.DataFrame]:
    """Retrievals, generations and votes of the given questions, from the latest execution's segments
    (every segment of the experiment when there is no run manifest naming some)."""
    ledger = Ledger(store_root)
    execution = ledger.latest_execution(experiment)
    execution = execution if execution and execution.get("segments") else None
    return {kind: ledger.records(kind, experiment, execution=execution, qids=qids) for kind in CHAIN_KINDS}


def passage_has_gold(text: str, golds: list[str]) -> bool:
    """Whether a passage contains a (non-blank) gold answer, case-insensitively."""
    low = str(text).lower()
    return any(g.strip() and g.lower() in low for g in golds)


@dataclass(frozen=True)
class CellChain:
    """One cell's chain for one question. An EoR cell chose among its members' answers: no records of its own."""

    outcome: Any  # the outcome row (attributes qid, cell, retriever, reader, prediction, em, f1, ...)
    is_ensemble: bool
    passages: pd.DataFrame  # by rank, each rank once
    generations: pd.DataFrame  # by round, call, sample; each call once
    votes: pd.DataFrame  # each vote event once

    @property
    def correct(self) -> bool:
        return float(self.outcome.em) >= 1.0


def cell_chain(outcome: Any, records: dict[str, pd.DataFrame]) -> CellChain:
    """The chain behind `outcome` (an itertuples row of an outcome frame) from `chain_records`' frames."""
    qid, retriever, reader = outcome.qid, str(outcome.retriever), str(outcome.reader)
    empty = {k: records[k].iloc[0:0] for k in CHAIN_KINDS}
    if is_ensemble_retriever(retriever):
        return CellChain(outcome, True, empty["retrievals"], empty["generations"], empty["votes"])
    r = records["retrievals"]
    r = r[(r["qid"] == qid) & (r["retriever"] == retriever)].drop_duplicates("rank").sort_values("rank")
    g = records["generations"]
    g = g[(g["qid"] == qid) & (g["retriever"] == retriever) & (g["reader"] == reader)]
    g = g.drop_duplicates("call_id").sort_values(["round", "call_index", "sample_index"])
    v = records["votes"]
    v = v[(v["qid"] == qid) & (v["retriever"] == retriever) & (v["reader"] == reader)].drop_duplicates("event_id")
    return CellChain(outcome, False, r, g, v)
