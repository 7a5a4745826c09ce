"""A self-contained HTML report of an experiment's analysis (one file: tables, base64 PNG plots,
per-question drill-down), logged to the parent run as `analysis/report.html`.

The drill-down lists questions hardest first. Each opens (click, or the URL fragment `#q-<qid>`) on the
question's chain, read from the stored records of the latest execution: the question and its gold
answers, then per cell the retrieved passages (gold answers marked), each generation's role, prompt and
raw output, the vote and the outcome with its error type. A filter box narrows the list by id or text."""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from core.answers import gold_spans
from tracking.analysis.lineage import cell_chain, chain_records, passage_has_gold

if TYPE_CHECKING:
    from tracking.analysis.inconsistency import AnalysisResult, Section

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f2f2f2}
td.l,th.l{text-align:left}img{max-width:100%;border:1px solid #eee;margin:6px 0}
details{margin:2px 0}summary{cursor:pointer}.ok{color:#2e7d32}.bad{color:#c62828}
.grid{display:flex;flex-wrap:wrap;gap:12px}.grid figure{margin:0;width:460px}
details.q>summary{padding:2px 0}details.q[open]>summary{font-weight:600}
.chain{margin:4px 0 14px 18px;padding-left:10px;border-left:3px solid #ddd}.chain h4{margin:10px 0 4px}
.passages{margin:4px 0;padding-left:22px;font-size:13px}.passages li{margin:3px 0}
.passage.has-gold{background:#f3fbf3}mark.gold{background:#a5d6a7;padding:0 1px}
.gen{font-size:13px;margin:4px 0}.role{font-weight:600;color:#6a1b9a}
pre{white-space:pre-wrap;margin:2px 0;font-size:12px;background:#f7f7f7;padding:4px}
.vote{color:#8d6e00;font-size:13px}.closed{font-size:13px;font-style:italic}.outcome{font-size:13px}
#qfilter{width:420px;padding:3px;margin:6px 0}
"""

SCRIPT = """
function openFromHash(){var id=decodeURIComponent(location.hash.slice(1));
 var d=id?document.getElementById(id):null;if(d&&d.tagName==='DETAILS'){d.open=true;d.scrollIntoView();}}
function filterQuestions(v){v=v.trim().toLowerCase();
 document.querySelectorAll('details.q').forEach(function(d){d.hidden=v!==''&&d.dataset.search.indexOf(v)<0;});}
window.addEventListener('hashchange',openFromHash);document.addEventListener('DOMContentLoaded',openFromHash);
"""
CHAIN_LIMIT = 100  # questions whose full chain is embedded (a chain with prompts is a few KB per cell)
MAX_PROMPT_CHARS = 4000


def _e(x: Any) -> str:
    return html.escape(str(x))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _analysis(name: str, title: str, sections: list[Section]) -> str:
    """An analysis of the registry (tracking/analysis/registry.py) under its title: each section's heading (unless it
    is the title), sentences and table."""
    return f'<h2 id="analysis-{_e(name)}">{_e(title)}</h2>' + "".join(_section(name, s, s.title != title) for s in sections)


def _section(name: str, s: Section, headed: bool) -> str:
    out = [f"<h3>{_e(s.title)}</h3>" if headed else "", *(f"<p>{_e(line)}</p>" for line in s.lines)]
    if s.table is not None:
        titles = s.row_titles or ("",) * len(s.table)
        head = "".join(f"<th{' class=l' if k == 0 else ''}>{_e(c)}</th>" for k, c in enumerate(s.table.columns))
        rows = "".join((f'<tr title="{_e(title)}">' if title else "<tr>") + "".join(
            f"<td{' class=l' if k == 0 else ''}>{_e(v)}</td>" for k, v in enumerate(row)) + "</tr>"
            for title, row in zip(titles, s.table.itertuples(index=False), strict=True))
        out.append(f'<table class="{_e(s.kind)}" data-analysis="{_e(name)}"><tr>{head}</tr>{rows}</table>')
    return "".join(out) + (_plots(s.images) if s.images else "")


def _plots(pngs: dict[str, bytes]) -> str:
    figs = [f"<figure>{_img(png, name)}<figcaption>{_e(name)}</figcaption></figure>" for name, png in pngs.items()]
    return '<div class="grid">' + "".join(figs) + "</div>"


def highlight_html(text: str, golds: list[str]) -> str:
    """HTML-escaped text with every case-insensitive occurrence of a gold answer wrapped in <mark class=gold>."""
    return "".join(f'<mark class="gold">{_e(piece)}</mark>' if gold else _e(piece) for piece, gold in gold_spans(text, golds))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f" … [{len(text) - n} more chars]"


def anchor(qid: str) -> str:
    """The id of a question's drill-down element (also its URL fragment)."""
    return "q-" + re.sub(r"\s", "_", qid)


def _cell_chain(o: Any, golds: list[str], rec: dict[str, pd.DataFrame]) -> str:
    chain = cell_chain(o, rec)
    parts = [f'<section class="cell" data-cell="{_e(o.cell)}"><h4>{_e(o.cell)}</h4>']
    if chain.is_ensemble:
        parts.append("<p>EoR cell: the answer was chosen among its member cells' answers (see eor.json).</p>")
    else:
        parts += [_passages(chain.passages, golds), *map(_generation, chain.generations.itertuples()),
                  *map(_vote, chain.votes.itertuples())]
    parts.append(f'<p class="outcome">outcome: prediction <b>{_e(repr(str(o.prediction)))}</b> · EM {o.em:.0f} · F1 {o.f1:.2f}'
                 f" · gold in context {bool(o.gold_in_context)} · error type "
                 f'<b class="error-type {"ok" if chain.correct else "bad"}">{_e(o.error_type)}</b></p></section>')
    return "".join(parts)


def _passages(r: pd.DataFrame, golds: list[str]) -> str:
    if r.empty:
        return '<p class="closed">no passages (closed book)</p>'
    items = []
    for p in r.itertuples():
        hit = passage_has_gold(str(p.text), golds)
        score = "" if p.score is None or pd.isna(p.score) else f" · score {float(p.score):.3g}"
        items.append(f'<li class="passage{" has-gold" if hit else ""}"><b>{_e(p.pid)}</b> {_e(p.title)}{score}'
                     f'{" · <b>contains a gold answer</b>" if hit else ""}<br>{highlight_html(str(p.text), golds)}</li>')
    return f'<ol class="passages">{"".join(items)}</ol>'


def _generation(gen: Any) -> str:
    prompt = (f"[system] {gen.system_prompt}\n\n" if str(gen.system_prompt) else "") + str(gen.prompt)
    return (f'<div class="gen" data-role="{_e(gen.role)}">generation · round {gen.round} · role '
            f'<span class="role">{_e(gen.role)}</span> · call {gen.call_index} · sample {gen.sample_index} · '
            f"{_e(gen.model)} · {'cache' if gen.from_cache else 'model'} · {gen.tokens_in}→{gen.tokens_out} tokens"
            f'<details class="prompt"><summary>prompt</summary><pre>{_e(_cut(prompt, MAX_PROMPT_CHARS))}</pre></details>'
            f'raw output:<pre class="raw">{_e(gen.output)}</pre>'
            f"parsed: {_e(gen.parsed_answer)} ({_e(gen.parse_status)})</div>")


def _vote(vote: Any) -> str:
    cands = [str(x) for x in vote.candidates]
    scores = [round(float(x), 4) for x in vote.scores] if vote.scores is not None else []
    return (f'<p class="vote">vote <b>{_e(vote.method)}</b>: candidates {_e(json.dumps(cands, ensure_ascii=False))} '
            f"scores {_e(scores)} → <b>{_e(vote.chosen)}</b></p>")


def _drilldown(res: AnalysisResult, questions: pd.DataFrame | None, store_root: str | Path | None = None,
               limit: int = 2000, chain_limit: int = CHAIN_LIMIT) -> str:
    dec = res.decomposition
    qinfo = {}
    if questions is not None and not questions.empty:
        qinfo = {r.qid: (r.question, list(r.answers)) for r in questions.drop_duplicates("qid").itertuples()}
    right = dec.groupby("qid")["correct"].sum().sort_values(kind="stable")
    shown = list(right.index)[:limit]
    chained = shown[:chain_limit] if store_root is not None else []
    out = [f"<p>{dec['qid'].nunique()} questions; the first {len(shown)} shown, hardest first (fewest cells right); "
           f"the first {len(chained)} with their full chain (passages, generations, vote), the others via "
           "<code>ragledger trace</code>. Open one by clicking it or with <code>#q-&lt;question id&gt;</code> in the URL.</p>"
           '<input id="qfilter" type="search" placeholder="filter by question id or text" '
           'oninput="filterQuestions(this.value)">']
    rec = chain_records(store_root, res.experiment, chained) if chained else {}
    with_chain = set(chained)
    by_q = dict(iter(dec[dec["qid"].isin(set(shown))].groupby("qid")))  # only the questions shown
    for qid in shown:
        g = by_q[qid].sort_values("cell")
        q, golds = qinfo.get(qid, ("", []))
        golds = [str(a) for a in golds]
        head = f"{_e(qid)} — {int(right[qid])}/{len(g)} cells right — {_e(str(q)[:160])}"
        rows = "".join(
            f"<tr><td class=l>{_e(r.cell)}</td><td class=l>{_e(r.prediction)}</td><td>{r.em:.0f}</td><td>{r.f1:.2f}</td>"
            f"<td class=l>{_e(r.error_type)}</td></tr>" for r in g.itertuples())
        chain = "".join(_cell_chain(o, golds, rec) for o in g.itertuples()) if qid in with_chain else ""
        search = _e(f"{qid} {q}".lower())
        out.append(f'<details class="q" id="{_e(anchor(str(qid)))}" data-search="{search}"><summary>{head}</summary>'
                   f'<div class="chain"><p class="question"><b>question:</b> {_e(q)}</p>'
                   f'<p class="golds"><b>gold answers:</b> {_e(" | ".join(golds))}</p><table><tr><th class=l>cell</th>'
                   f"<th class=l>prediction</th><th>EM</th><th>F1</th><th class=l>error type</th></tr>{rows}</table>"
                   f"{chain}</div></details>")
    return "".join(out)


def html_report(res: AnalysisResult, store_root: str | Path | None = None) -> str:
    """The report of `res`, whose analyses' outputs are computed (flows/analyze.py write_outputs)."""
    from tracking.analysis.registry import ANALYSES

    questions = None
    if store_root is not None:
        from tracking.store.ledger import Ledger

        questions = Ledger(store_root).records("questions", res.experiment)
    analyses = "".join(_analysis(name, ANALYSES[name].title if name in ANALYSES else name, out.sections)
                       for name, out in res.outputs.items() if out.sections)
    dropped = f" ({res.dropped_questions} question(s) not answered by every cell left out)" if res.dropped_questions else ""
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>ragledger — {_e(res.experiment)}</title>"
        f"<style>{CSS}</style><script>{SCRIPT}</script></head><body><h1>{_e(res.experiment)}</h1>"
        f"<p>{res.questions} questions × {len(res.cells)} cells{dropped}. Correct = {_e(res.metric)} for RWR/MRLR and "
        "accuracy, EM for the error decomposition; CIs: percentile bootstrap, "
        "1,000 resamples over questions, seeded. Definitions: seed 002. RWR, MRWR, MRLR and "
        "per-error RWR compare retrievers within one (reader, model) group, as seed 002 holds the reader and "
        "the LM fixed: one table per group.</p>"
        f"{analyses}"
        f"<h2>Plots</h2>{_plots(res.pngs)}"
        f"<h2>Per question</h2>{_drilldown(res, questions, store_root)}</body></html>"
    )
