"""Seed 002's analyses as entries of the registry (tracking/analysis/registry.py), each saying what it writes, shows
and logs from the tables every analysis shares (tracking/analysis/tables.py `compute`): RWR / MRWR / MRLR per
(reader, model) group, the error decomposition with its identity check, paired comparisons, and EoR."""

from __future__ import annotations

import json

import pandas as pd

from tracking.analysis.inconsistency import (
    ERROR_INDICATORS,
    AnalysisResult,
    Outputs,
    Section,
    per_error_long,
    rwr_long,
)

DECOMPOSITION_COLUMNS = ["experiment", "cell", "qid", "retriever", "reader", "model", "prediction", "em", "f1",
                         "error_type", *ERROR_INDICATORS, "correct", "fail"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def mrlr(res: AnalysisResult) -> Outputs:
    """inconsistency.parquet and the RWR matrices (long); a table per group; MRLR per cell and its mean per group as
    metrics. Its heatmaps are drawn by tracking/report/figures.py."""
    files: dict = {"inconsistency.parquet": res.inconsistency, "rwr.parquet": rwr_long(res.groups),
                   "per_error_rwr.parquet": per_error_long(res.groups)}
    comparable = [g for g in res.groups if g.comparable]
    metrics = {f"analysis.mrlr.{r.cell}": float(r.MRLR) for r in res.inconsistency.itertuples()}
    # seed 002 Figure: MRLR averaged over a group's retrievers
    metrics |= {f"analysis.mean_mrlr.{g.reader} · {g.model}": float(g.table["MRLR"].mean()) for g in comparable}
    return Outputs(files, mrlr_sections(res), metrics)


def mrlr_sections(res: AnalysisResult, heading: str = "MRLR table, ") -> list[Section]:
    """A table per (reader, model) group (seed 002 fixes the reader and the LM; tracking/analysis/inconsistency.py);
    a retriever alone in its group gets a sentence."""
    t = res.inconsistency.set_index("cell")
    out = []
    for g in res.groups:
        rows = t.loc[g.cells]
        if not g.comparable:
            r = rows.iloc[0]
            out.append(Section(f"{g.label}: one retriever only ({g.retrievers[0]}: acc {_pct(r.accuracy)} % "
                               f"[{_pct(r.acc_lo)}, {_pct(r.acc_hi)}], F1 {_pct(r.f1)} %) — no inconsistency table: "
                               "RWR needs two retrievers under the same reader and model"))
            continue
        table = pd.DataFrame({"retriever": g.retrievers, "accuracy %": rows["accuracy"].map(_pct).tolist(),
                              "95% CI": [f"[{_pct(lo)}, {_pct(hi)}]" for lo, hi in zip(rows.acc_lo, rows.acc_hi, strict=True)],
                              **{f"{c} %": rows[c].map(_pct).tolist() for c in ("f1", "MRLR", "MRWR", "MRLR_RE", "MRLR_HE")}})
        table = table.rename(columns={"f1 %": "F1 %"})
        out.append(Section(f"{heading}{g.label}: {len(g.cells)} retrievers, mean MRLR {_pct(rows['MRLR'].mean())} % "
                           f"(sorted by accuracy; {res.metric})", table=table, kind="inconsistency",
                           row_titles=tuple(g.cells)))
    return out


def decomposition(res: AnalysisResult) -> Outputs:
    """The decomposition per (question, cell), the error shares with their CIs (a table and bars) and the identity
    check, whose largest residual is a metric. Its bars are drawn by tracking/report/figures.py."""
    files: dict = {"decomposition.parquet": res.decomposition[[c for c in DECOMPOSITION_COLUMNS
                                                                if c in res.decomposition.columns]],
                   "error_shares.parquet": res.shares, "identity.parquet": res.identity}
    worst = float(res.identity[["residual_literal", "residual_own_class"]].abs().to_numpy().max())
    holds = "holds" if bool(res.identity["holds"].all()) else "VIOLATED"
    shares = res.shares.set_index(["cell", "error_type"])
    classes = list(dict.fromkeys(res.shares["error_type"]))
    table = pd.DataFrame([[cell, *(f"{_pct(shares.at[(cell, c), 'share'])} [{100 * shares.at[(cell, c), 'lo']:.0f}-"
                                   f"{100 * shares.at[(cell, c), 'hi']:.0f}]" for c in classes)] for cell in res.cells],
                         columns=["cell", *(c.replace("_", " ") for c in classes)])
    return Outputs(files, [
        Section(f"identity P(fail) = P(RE) − P(LG) + P(EE) + P(HE): {holds} for every cell, both accountings of "
                f"abstentions (max |residual| {worst:.1e})"),
        Section("error shares % [95% bootstrap CI] (abstentions as their own class)", table=table, kind="shares")],
        {"analysis.identity_max_abs_residual": worst})


def paired(res: AnalysisResult) -> Outputs:
    """Every pair of cells: flips, ΔEM with its paired-bootstrap CI, exact McNemar p (in the report only: the pairs
    grow as the square of the cells)."""
    if res.paired.empty:
        return Outputs()
    p = res.paired
    table = pd.DataFrame({"A": p.cell_a, "B": p.cell_b, "A won": p.won, "A lost": p.lost, "both right": p.both_right,
                          "both wrong": p.both_wrong, "ΔEM %": p["diff"].map(_pct),
                          "95% CI": [f"[{_pct(lo)}, {_pct(hi)}]" for lo, hi in zip(p.diff_lo, p.diff_hi, strict=True)],
                          "McNemar p": p.mcnemar_p.map(lambda v: f"{v:.3g}")})
    return Outputs({"paired.parquet": p}, [Section("Paired comparisons", table=table, kind="paired", report_only=True)])


def eor(res: AnalysisResult) -> Outputs:
    """The Ensemble of Retrievers fitted by the analysis flow (flows/analyze.py, tracking/analysis/eor_cells.py):
    its weights (a table; tracking/report/figures.py draws them) and fit (eor.json), each EoR cell against the best
    single retriever of its reader on the held-out questions, and its cell's tables beside its members."""
    info = res.eor
    if not info:
        return Outputs()
    files: dict = {}
    if info.get("weights_table"):
        files = {"eor_weights.parquet": pd.DataFrame(info["weights_table"])}
    files["eor.json"] = json.dumps({k: v for k, v in info.items() if k not in ("weights_table", "train_qids", "test_qids")},
                                   indent=2, default=str)
    lines = []
    for cell, sm in (info.get("summaries") or {}).items():
        fit = info["fits"][cell]
        searched = " (searched on training accuracy)" if fit.get("pooling_option") == "search" else ""
        lines.append(f"EoR {cell} on {sm['held_out_questions']} held-out questions (split: {info.get('split')}): EM "
                     f"{_pct(sm['eor_em'])}, F1 {_pct(sm['eor_f1'])}, MRLR {_pct(sm['eor_mrlr'])} vs best single "
                     f"{sm['best_single']}: EM {_pct(sm['best_single_em'])}, F1 {_pct(sm['best_single_f1'])}, MRLR "
                     f"{_pct(sm['best_single_mrlr'])}; pooling {fit['pooling']}{searched}, training accuracy "
                     f"{_pct(fit['train_accuracy'])} % on {fit['train']} questions, "
                     f"w {json.dumps({k: round(v, 3) for k, v in fit['w'].items()})}, "
                     f"β {json.dumps({k: round(v, 3) for k, v in fit['beta'].items()})}, dropped (β < 0.1) {fit['dropped']}")
    lines += [f"EoR not fitted for {skipped}" for skipped in info.get("skipped", [])]
    sections = [Section("Ensemble of Retrievers (held-out questions)", tuple(lines))]
    for cell, eres in res.eor_results.items():
        beside = mrlr_sections(eres, f"{cell} beside its members: ")
        sections += [Section(s.title, s.lines, s.table, s.kind, s.row_titles, eres.pngs if k == 0 else {}, True)
                     for k, s in enumerate(beside)]
    metrics = {f"analysis.{k}": float(info[k])
               for k in ("eor_em", "eor_f1", "eor_mrlr", "best_single_em", "best_single_mrlr") if k in info}
    return Outputs(files, sections, metrics)
