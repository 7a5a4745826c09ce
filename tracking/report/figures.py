"""The figures of seed 002's analyses (tracking/analysis/seed002.py), drawn from the tables every analysis shares
(tracking/analysis/tables.py `compute`): the RWR heatmaps (one panel per comparable (reader, model) group, and one
figure per error class), the error-share bars and the EoR weights. The analysis flow (flows/analyze.py) writes them
beside the analyses' files; the report (tracking/report/report.py) shows them."""

from __future__ import annotations

import pandas as pd

from tracking.analysis.inconsistency import PER_ERRORS, AnalysisResult, RetrieverGroup
from tracking.report import plots

# the figures' names for the classes where ragledger's differs from seed 002's literal one
ERROR_LABELS = {"HE": "HE, abstentions apart (seed 002's HE also counts an abstention with the answer in context)"}


def figures(res: AnalysisResult) -> dict[str, bytes]:
    """Every figure of `res`, by file name, in the registry's order of the analyses they show."""
    out: dict[str, bytes] = {}
    comparable = [g for g in res.groups if g.comparable]
    if comparable:  # one panel per (reader, model) group, axes labelled by retriever (the panel names the group)
        acc = res.inconsistency.set_index("cell")["accuracy"]

        def by_retriever(g: RetrieverGroup, matrix: pd.DataFrame) -> pd.DataFrame:
            return matrix.set_axis(g.retrievers, axis=0).set_axis(g.retrievers, axis=1)

        out["rwr_heatmap.png"] = plots.rwr_heatmaps(
            [(g.label, by_retriever(g, g.rwr), acc.loc[g.cells].set_axis(g.retrievers)) for g in comparable],
            f"{res.experiment}: RWR(i→j) within each reader and model, retrievers by accuracy")
        for e in PER_ERRORS:
            out[f"rwr_{e}.png"] = plots.rwr_heatmaps(
                [(g.label, by_retriever(g, g.per_error_rwr[e]), None) for g in comparable],
                f"{res.experiment}: RWR for error {ERROR_LABELS.get(e, e)} (share of i's {e} that j avoids)")
    out["error_shares.png"] = plots.error_share_bars(res.shares, res.cells)
    if res.eor.get("weights_table"):
        out["eor_weights.png"] = plots.eor_weights(pd.DataFrame(res.eor["weights_table"]))
    return out
