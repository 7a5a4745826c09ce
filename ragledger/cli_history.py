"""CLI commands across experiments: history (one question in every experiment), leaderboard (cells across
experiments and datasets, with CIs), diff (what changed between two executions of one experiment).

They read the event store only (tracking/analysis/history.py); none calls a model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.markup import escape

from ragledger.cli_analysis import FormatOpt, OutputOpt, StoreOpt, emit
from ragledger.cli_common import DEFAULT_STORE, checked_store, console, fail

ExperimentsOpt = Annotated[list[str] | None, typer.Option(
    "--experiment", "-e", help="only experiments matching this name or shell pattern (`nq-*`); repeat for more. Only "
    "their files are opened")]


def _experiments(store: str, patterns: list[str] | None) -> tuple[str, list[str]]:
    """The folder to read (an s3:// store's mirror) and the experiments with outcomes matching `patterns`."""
    from tracking.store.ledger import Ledger

    given, store = store, checked_store(store)
    names = Ledger(store).experiments(patterns)
    if not names:
        fail(f"no experiment with outcomes in {given}" + (f" matches {', '.join(patterns)}" if patterns else ""))
    return store, names


def history_cmd(
    qid: Annotated[str, typer.Argument(help="question id")],
    store: StoreOpt = DEFAULT_STORE,
    experiments: ExperimentsOpt = None,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
) -> None:
    """One question's history: its outcome in every cell of every experiment that asked it, oldest first."""
    from tracking.store.ledger import Ledger

    store, names = _experiments(store, experiments)
    df = Ledger(store).question_history(qid, names)
    if df.empty:
        fail(f"question {qid!r}: no outcome in {len(names)} experiment(s) of {store}")
    text = Ledger(store).question(qid, sorted(df["experiment"].unique()))
    if text is not None and fmt == "table":
        console.print(f"[bold]{escape(qid)}[/]: {escape(text[0])}  gold: {escape(' | '.join(text[1]))}")
    right = int((df["em"] >= 1).sum())
    emit(df, fmt, output, title=f"{qid}: right in {right} of {len(df)} outcome(s), "
                                f"{df['experiment'].nunique()} experiment(s)")


def leaderboard_cmd(
    store: StoreOpt = DEFAULT_STORE,
    experiments: ExperimentsOpt = None,
    dataset: Annotated[str | None, typer.Option(help="only this dataset")] = None,
    top: Annotated[int, typer.Option(help="rows per dataset (0: all)", min=0)] = 10,
    metric: Annotated[str, typer.Option(help="rank by em or f1")] = "em",
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
) -> None:
    """Cells of every experiment ranked within each dataset, with the 95% bootstrap CI of EM."""
    from tracking.analysis.history import leaderboard
    from tracking.store.ledger import LedgerError

    store, names = _experiments(store, experiments)
    try:
        df = leaderboard(store, names, dataset, top or None, metric)
    except LedgerError as exc:
        fail(str(exc))
    if df.empty:
        fail(f"no outcome of dataset {dataset!r} in {store}")
    emit(df, fmt, output, title=f"leaderboard by {metric} over {len(names)} experiment(s)")


def diff_cmd(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: StoreOpt = DEFAULT_STORE,
    before: Annotated[str | None, typer.Option(help="the earlier execution (its manifest's name or a prefix); "
                                                    "default: the second latest")] = None,
    after: Annotated[str | None, typer.Option(help="the later execution; default: the latest")] = None,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
) -> None:
    """What changed between two executions of one experiment: per cell EM before and after, questions fixed and
    broken, exact McNemar p; then the flipped questions (with --format csv/json/parquet: the flipped questions)."""
    from tracking.analysis.history import execution_diff
    from tracking.store.ledger import LedgerError

    store = checked_store(store)
    try:
        summary, flips, (a, b) = execution_diff(store, experiment, before, after)
    except LedgerError as exc:
        fail(str(exc))
    if fmt != "table":  # a file or a pipe gets the flipped questions, one row each
        emit(flips, fmt, output)
        return
    emit(summary, fmt, title=f"{experiment}: {a} -> {b}")
    if len(flips):
        emit(flips, fmt, output, title=f"{len(flips)} flipped (cell, question) pair(s)")


COMMANDS: list[tuple[str, Callable[..., None]]] = [
    ("history", history_cmd),
    ("leaderboard", leaderboard_cmd),
    ("diff", diff_cmd),
]


def register(app: typer.Typer) -> None:
    for name, command in COMMANDS:
        app.command(name)(command)
