"""Lineage of one question through every cell of an experiment's latest execution: question, gold
answers, retrieved passages (gold answers highlighted), each generation (role, prompt, raw output),
the vote and the outcome with its error type. Reads stored records only."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from ragledger.answers import gold_spans
from tracking.events import EventStore


class TraceError(ValueError):
    """The question or experiment is not in the store."""


def highlight(text: str, golds: list[str]) -> str:
    """Rich markup of text with every (case-insensitive) occurrence of a gold answer in reverse video."""
    return "".join(f"[bold reverse green]{escape(piece)}[/]" if gold else escape(piece)
                   for piece, gold in gold_spans(text, golds))


def _cut(text: str, n: int) -> str:
    return text if n <= 0 or len(text) <= n else text[:n] + f" … [{len(text) - n} more chars]"


def _records(store: EventStore, kind: str, experiment: str, qid: str, paths: list[str] | None) -> pd.DataFrame:
    df = store.read(kind, paths=[Path(p) for p in paths if Path(p).exists()]) if paths else store.read(kind, experiment)
    return df[df["qid"] == qid] if not df.empty else df


def render_trace(console: Console, store_root: str, experiment: str, qid: str, cell: str | None = None,
                 max_chars: int = 0) -> None:
    from ragledger.cli_analysis import experiment_outcomes, resolve_cell
    from tracking.executions import latest_execution

    store = EventStore(store_root)
    questions = store.read("questions", experiment)
    if questions.empty:
        raise TraceError(f"experiment {experiment!r}: no questions in {store_root}")
    q = questions[questions["qid"] == qid]
    if q.empty:
        raise TraceError(f"experiment {experiment!r}: no question with id {qid!r}")
    q = q.sort_values("created_at").iloc[-1]
    golds = [str(a) for a in q["answers"]]
    execution = latest_execution(store_root, experiment)
    segs = (execution or {}).get("segments", {})
    outcomes = experiment_outcomes(store_root, experiment)
    outcomes = outcomes[outcomes["qid"] == qid]
    cells = sorted(outcomes["cell"].unique())
    if cell:
        cells = [resolve_cell(cell, cells)]
    console.print(Panel(f"[bold]{escape(str(q['question']))}[/]\ngold: {escape(' | '.join(golds))}",
                        title=f"{escape(experiment)} / {escape(qid)}", expand=False))

    def all_paths(kind: str) -> list[str] | None:
        if not segs:
            return None
        return sorted({p for s in segs.values() for p in s.get(kind, [])})

    retrievals = _records(store, "retrievals", experiment, qid, all_paths("retrievals"))
    generations = _records(store, "generations", experiment, qid, all_paths("generations"))
    votes = _records(store, "votes", experiment, qid, all_paths("votes"))
    for c in cells:
        o = outcomes[outcomes["cell"] == c].iloc[0]
        retriever, strategy = str(o["retriever"]), str(o["strategy"])
        console.rule(f"[bold cyan]{escape(c)}")
        if retriever.startswith("eor("):
            console.print("EoR cell: the answer was chosen among its member cells' answers by the fitted voter "
                          "(see analysis/eor.json); trace a member cell for its passages and generations.")
        else:
            r = retrievals[retrievals["retriever"] == retriever].drop_duplicates("rank").sort_values("rank")
            if r.empty:
                console.print("[dim]no passages (closed book)[/]")
            for p in r.itertuples():
                hit = any(g.lower() in str(p.text).lower() for g in golds)
                console.print(f"[bold]passage {p.rank}[/] {escape(str(p.pid))} {escape(str(p.title))}"
                              f"{' [green](gold answer)[/]' if hit else ''}  score {p.score}")
                console.print(highlight(_cut(str(p.text), max_chars), golds))
            g = generations[(generations["retriever"] == retriever) & (generations["strategy"] == strategy)]
            g = g.drop_duplicates("call_id").sort_values(["round", "call_index", "sample_index"])
            for gen in g.itertuples():
                console.print(f"[bold magenta]generation[/] round {gen.round} · role {escape(str(gen.role))} · call "
                              f"{gen.call_index} · sample {gen.sample_index} · {escape(str(gen.model))} · "
                              f"{'cache' if gen.from_cache else 'model'} · {gen.tokens_in}→{gen.tokens_out} tokens")
                if str(gen.system_prompt):
                    console.print(f"[dim]system:[/] {escape(_cut(str(gen.system_prompt), max_chars))}")
                console.print(f"[dim]prompt:[/]\n{escape(_cut(str(gen.prompt), max_chars))}")
                console.print(f"[dim]raw output:[/] {escape(str(gen.output))}")
                console.print(f"[dim]parsed:[/] {escape(str(gen.parsed_answer))} ({gen.parse_status})")
            v = votes[(votes["retriever"] == retriever) & (votes["strategy"] == strategy)]
            for vote in v.drop_duplicates("event_id").itertuples():
                cands = [str(x) for x in vote.candidates]
                scores = [float(x) for x in vote.scores] if vote.scores is not None else []
                console.print(f"[bold yellow]vote[/] {escape(str(vote.method))}: candidates "
                              f"{escape(json.dumps(cands, ensure_ascii=False))} scores {scores} → "
                              f"[bold]{escape(str(vote.chosen))}[/]")
        ok = float(o["em"]) >= 1.0
        console.print(f"[bold]outcome[/] prediction {escape(repr(str(o['prediction'])))} · EM {o['em']:.0f} · F1 {o['f1']:.2f} · "
                      f"gold in context {bool(o['gold_in_context'])} · error type "
                      f"[{'green' if ok else 'red'}]{escape(str(o['error_type']))}[/]")
