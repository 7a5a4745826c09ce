"""A self-contained HTML report of an experiment's analysis (one file: tables, base64 PNG plots,
per-question drill-down), logged to the parent run as `analysis/report.html`."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from flows.analyze import AnalysisResult

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}
td.l,th.l{text-align:left}img{max-width:100%;border:1px solid #eee;margin:6px 0}
details{margin:2px 0}summary{cursor:pointer}.ok{color:#2e7d32}.bad{color:#c62828}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid figure{margin:0;width:460px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _headline(res: AnalysisResult) -> str:
    rows = ["<table><tr><th class=l>cell</th><th>accuracy %</th><th>95% CI</th><th>F1 %</th><th>MRLR %</th><th>MRWR %</th>"
            "<th>failures</th></tr>"]
    for r in res.inconsistency.itertuples():
        rows.append(f"<tr><td class=l>{_e(r.cell)}</td><td>{_pct(r.accuracy)}</td><td>[{_pct(r.acc_lo)}, {_pct(r.acc_hi)}]</td>"
                    f"<td>{_pct(r.f1)}</td><td>{_pct(r.MRLR)}</td><td>{_pct(r.MRWR)}</td><td>{r.failures}</td></tr>")
    return "".join(rows) + "</table>"


def _shares(res: AnalysisResult) -> str:
    classes = list(dict.fromkeys(res.shares["error_type"]))
    out = ["<table><tr><th class=l>cell</th>" + "".join(f"<th>{_e(c)} % [95% CI]</th>" for c in classes) + "</tr>"]
    for cell in res.cells:
        s = res.shares[res.shares["cell"] == cell].set_index("error_type")
        out.append(f"<tr><td class=l>{_e(cell)}</td>" + "".join(
            f"<td>{_pct(s.at[c, 'share'])} [{_pct(s.at[c, 'lo'])}, {_pct(s.at[c, 'hi'])}]</td>" for c in classes) + "</tr>")
    return "".join(out) + "</table>"


def _identity(res: AnalysisResult) -> str:
    ok = bool(res.identity["holds"].all())
    worst = float(res.identity[["residual_literal", "residual_own_class"]].abs().to_numpy().max())
    return (f"<p class={'ok' if ok else 'bad'}>P(fail) = P(RE) − P(LG) + P(EE) + P(HE): "
            f"{'holds' if ok else 'VIOLATED'} for every cell under both accountings of abstentions "
            f"(largest |residual| {worst:.2e}).</p>")


def _paired(res: AnalysisResult) -> str:
    if res.paired.empty:
        return ""
    out = ["<table><tr><th class=l>A</th><th class=l>B</th><th>A won</th><th>A lost</th><th>both right</th>"
           "<th>both wrong</th><th>ΔEM %</th><th>95% CI</th><th>McNemar p</th></tr>"]
    for r in res.paired.itertuples():
        out.append(f"<tr><td class=l>{_e(r.cell_a)}</td><td class=l>{_e(r.cell_b)}</td><td>{r.won}</td><td>{r.lost}</td>"
                   f"<td>{r.both_right}</td><td>{r.both_wrong}</td><td>{_pct(r.diff)}</td>"
                   f"<td>[{_pct(r.diff_lo)}, {_pct(r.diff_hi)}]</td><td>{r.mcnemar_p:.3g}</td></tr>")
    return "".join(out) + "</table>"


def _plots(pngs: dict[str, bytes]) -> str:
    figs = [f"<figure>{_img(png, name)}<figcaption>{_e(name)}</figcaption></figure>" for name, png in pngs.items()]
    return '<div class="grid">' + "".join(figs) + "</div>"


def _drilldown(res: AnalysisResult, questions: pd.DataFrame | None, limit: int = 2000) -> str:
    dec = res.decomposition
    qinfo = {}
    if questions is not None and not questions.empty:
        qinfo = {r.qid: (r.question, list(r.answers)) for r in questions.drop_duplicates("qid").itertuples()}
    out = [f"<p>{dec['qid'].nunique()} questions; the first {limit} shown, hardest first "
           "(fewest cells right).</p>"]
    right = dec.groupby("qid")["correct"].sum().sort_values(kind="stable")
    shown = list(right.index)[:limit]
    by_q = dict(iter(dec[dec["qid"].isin(set(shown))].groupby("qid")))  # only the questions shown
    for qid in shown:
        g = by_q[qid]
        q, golds = qinfo.get(qid, ("", []))
        head = f"{_e(qid)} — {int(right[qid])}/{len(g)} cells right — {_e(q)[:160]}"
        rows = "".join(
            f"<tr><td class=l>{_e(r.cell)}</td><td class=l>{_e(r.prediction)}</td><td>{r.em:.0f}</td><td>{r.f1:.2f}</td>"
            f"<td class=l>{_e(r.error_type)}</td></tr>" for r in g.sort_values("cell").itertuples())
        out.append(f"<details><summary>{head}</summary><p>gold: {_e(' | '.join(golds))}</p><table><tr><th class=l>cell</th>"
                   f"<th class=l>prediction</th><th>EM</th><th>F1</th><th class=l>error type</th></tr>{rows}</table></details>")
    return "".join(out)


def _eor(res: AnalysisResult) -> str:
    if not res.eor:
        return ""
    info = res.eor
    out = ["<h2>Ensemble of Retrievers (held-out questions)</h2>"]
    for cell, sm in (info.get("summaries") or {}).items():
        out.append(f"<p>{_e(cell)}: EM {_pct(sm['eor_em'])} %, F1 {_pct(sm['eor_f1'])} %, MRLR "
                   f"{_pct(sm['eor_mrlr'])} % — best single retriever {_e(sm['best_single'])}: EM "
                   f"{_pct(sm['best_single_em'])} %, F1 {_pct(sm['best_single_f1'])} %, "
                   f"MRLR {_pct(sm['best_single_mrlr'])} % "
                   f"on {sm['held_out_questions']} held-out questions (split: {_e(info.get('split'))}).</p>")
    for cell, fit in info.get("fits", {}).items():
        out.append(f"<p><b>{_e(cell)}</b>: pooling {_e(fit['pooling'])}, training accuracy {_pct(fit['train_accuracy'])} % "
                   f"on {fit['train']} questions; w = {_e({k: round(v, 3) for k, v in fit['w'].items()})}; "
                   f"β = {_e({k: round(v, 3) for k, v in fit['beta'].items()})}; dropped (β < 0.1): {_e(fit['dropped'])}</p>")
    for skipped in info.get("skipped", []):
        out.append(f"<p>not fitted: {_e(skipped)}</p>")
    for cell, eres in res.eor_results.items():
        out.append(f"<h3>{_e(cell)} beside its members</h3>{_headline(eres)}{_plots(eres.pngs)}")
    return "".join(out)


def html_report(res: AnalysisResult, store_root: str | Path | None = None) -> str:
    questions = None
    if store_root is not None:
        from tracking.events import EventStore

        questions = EventStore(store_root).read("questions", res.experiment)
    dropped = f" ({res.dropped_questions} question(s) not answered by every cell left out)" if res.dropped_questions else ""
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>ragledger — {_e(res.experiment)}</title>"
        f"<style>{CSS}</style></head><body><h1>{_e(res.experiment)}</h1>"
        f"<p>{res.questions} questions × {len(res.cells)} cells{dropped}. Correct = {_e(res.metric)} for RWR/MRLR and "
        "accuracy, EM for the error decomposition; CIs: percentile bootstrap, "
        "1,000 resamples over questions, seeded. Definitions: seed 002 (see DESIGN.md).</p>"
        f"<h2>Headline</h2>{_headline(res)}<h2>Error decomposition</h2>{_identity(res)}{_shares(res)}"
        f"<h2>Plots</h2>{_plots(res.pngs)}<h2>Paired comparisons</h2>{_paired(res)}{_eor(res)}"
        f"<h2>Per question</h2>{_drilldown(res, questions)}</body></html>"
    )
