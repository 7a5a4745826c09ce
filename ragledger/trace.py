"""Lineage of one question through every cell of an experiment's latest execution: question, gold
answers, retrieved passages (gold answers highlighted), each generation (role, prompt, raw output),
the vote and the outcome with its error type. Reads stored records only."""

from __future__ import annotations

import json

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from core.answers import gold_spans
from core.cell import resolve_cell
from tracking.analysis.lineage import CellChain, cell_chain, chain_records, passage_has_gold
from tracking.store.ledger import Ledger


class TraceError(ValueError):
    """The question or experiment is not in the store."""


def highlight(text: str, golds: list[str]) -> str:
    """Rich markup of text with every (case-insensitive) occurrence of a gold answer in reverse video."""
    return "".join(f"[bold reverse green]{escape(piece)}[/]" if gold else escape(piece)
                   for piece, gold in gold_spans(text, golds))


def _cut(text: str, n: int) -> str:
    return text if n <= 0 or len(text) <= n else text[:n] + f" … [{len(text) - n} more chars]"


def render_trace(console: Console, store_root: str, experiment: str, qid: str, cell: str | None = None,
                 max_chars: int = 0) -> None:
    q = stored_question(store_root, experiment, qid)
    golds = [str(a) for a in q["answers"]]
    outcomes = Ledger(store_root).experiment_outcomes(experiment)
    outcomes = outcomes[outcomes["qid"] == qid]
    cells = sorted(outcomes["cell"].unique())
    if cell:
        cells = [resolve_cell(cell, cells)]
    console.print(Panel(f"[bold]{escape(str(q['question']))}[/]\ngold: {escape(' | '.join(golds))}",
                        title=f"{escape(experiment)} / {escape(qid)}", expand=False))
    records = chain_records(store_root, experiment, [qid])
    by_cell = {o.cell: o for o in outcomes.itertuples()}
    for c in cells:
        console.rule(f"[bold cyan]{escape(c)}")
        _print_chain(console, cell_chain(by_cell[c], records), golds, max_chars)


def stored_question(store_root: str, experiment: str, qid: str) -> pd.Series:
    questions = Ledger(store_root).questions(experiment)
    if questions.empty:
        raise TraceError(f"experiment {experiment!r}: no questions in {store_root}")
    if qid not in questions.index:
        raise TraceError(f"experiment {experiment!r}: no question with id {qid!r}")
    return questions.loc[qid]


def _print_chain(console: Console, chain: CellChain, golds: list[str], max_chars: int) -> None:
    o = chain.outcome
    if chain.is_ensemble:
        console.print("EoR cell: the answer was chosen among its member cells' answers by the fitted voter "
                      "(see analysis/eor.json); trace a member cell for its passages and generations.")
    else:
        if chain.passages.empty:
            console.print("[dim]no passages (closed book)[/]")
        for p in chain.passages.itertuples():
            hit = passage_has_gold(str(p.text), golds)
            console.print(f"[bold]passage {p.rank}[/] {escape(str(p.pid))} {escape(str(p.title))}"
                          f"{' [green](gold answer)[/]' if hit else ''}  score {p.score}")
            console.print(highlight(_cut(str(p.text), max_chars), golds))
        for gen in chain.generations.itertuples():
            console.print(f"[bold magenta]generation[/] round {gen.round} · role {escape(str(gen.role))} · call "
                          f"{gen.call_index} · sample {gen.sample_index} · {escape(str(gen.model))} · "
                          f"{'cache' if gen.from_cache else 'model'} · {gen.tokens_in}→{gen.tokens_out} tokens")
            if str(gen.system_prompt):
                console.print(f"[dim]system:[/] {escape(_cut(str(gen.system_prompt), max_chars))}")
            console.print(f"[dim]prompt:[/]\n{escape(_cut(str(gen.prompt), max_chars))}")
            console.print(f"[dim]raw output:[/] {escape(str(gen.output))}")
            console.print(f"[dim]parsed:[/] {escape(str(gen.parsed_answer))} ({gen.parse_status})")
        for vote in chain.votes.itertuples():
            cands = [str(x) for x in vote.candidates]
            scores = [float(x) for x in vote.scores] if vote.scores is not None else []
            console.print(f"[bold yellow]vote[/] {escape(str(vote.method))}: candidates "
                          f"{escape(json.dumps(cands, ensure_ascii=False))} scores {scores} → "
                          f"[bold]{escape(str(vote.chosen))}[/]")
    console.print(f"[bold]outcome[/] prediction {escape(repr(str(o.prediction)))} · EM {o.em:.0f} · F1 {o.f1:.2f} · "
                  f"gold in context {bool(o.gold_in_context)} · error type "
                  f"[{'green' if chain.correct else 'red'}]{escape(str(o.error_type))}[/]")
