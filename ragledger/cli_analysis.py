"""CLI commands over stored records: query, errors, flips, hardest, across, analyze, trace.

They read the event store (and run manifests) only; none calls a model. Registered on the main
Typer app by `register(app)` so ragledger/cli.py stays small.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ragledger.cli_common import DEFAULT_STORE, checked_store, console, err, fail, output_file, output_folder
from ragledger.cli_share import MlflowPullOpt, over_records

FORMATS = ("table", "csv", "json", "parquet")
ERROR_TYPE_HELP = "correct, lucky_guess, retrieval_failure, extraction_error, hallucination_error or abstention"

StoreOpt = Annotated[str, typer.Option("--store", help="event store directory")]
FormatOpt = Annotated[str, typer.Option("--format", help="table | csv | json | parquet (parquet needs --output)")]
OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", callback=output_file,
                                                help="write the result to this file (in a folder that exists)")]


def emit(df, fmt: str, output: Path | None = None, title: str | None = None, max_width: int = 60) -> None:
    """Print or write a DataFrame in the requested format."""
    import pandas as pd

    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "parquet":
        if output is None:
            fail("--format parquet needs --output FILE")
        with _writing(output):
            df.to_parquet(output, index=False)
        err.print(f"{len(df)} row(s) written to {output}")
        return
    if fmt == "csv":
        text = df.to_csv(index=False)
    elif fmt == "json":
        text = df.to_json(orient="records", force_ascii=False, date_format="iso", default_handler=str)
    else:
        table = Table(title=title, show_lines=False)
        for c in df.columns:
            table.add_column(str(c), overflow="fold", max_width=max_width)
        for row in df.itertuples(index=False):
            cells = []
            for v in row:
                if isinstance(v, float):
                    cells.append("" if pd.isna(v) else f"{v:.4g}")
                elif hasattr(v, "tolist") and not isinstance(v, str):
                    cells.append(escape(json.dumps(v.tolist(), default=str, ensure_ascii=False)))
                else:
                    cells.append(escape(str(v)))
            table.add_row(*cells)
        if output is not None:
            with _writing(output), output.open("w", encoding="utf-8") as fh:
                Console(file=fh, width=200).print(table)
        else:
            console.print(table)
            console.print(f"{len(df)} row(s)", style="dim")
        return
    if output is not None:
        with _writing(output):
            output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


@contextlib.contextmanager
def _writing(output: Path) -> Iterator[None]:
    """A write to --output that fails after its check (the disk full, the folder removed meanwhile) is one error
    line too, and a file it had begun is removed."""
    existed = output.exists()
    try:
        yield
    except OSError as exc:
        if not existed:
            output.unlink(missing_ok=True)
        fail(f"--output: cannot write {output}: {exc.strerror or exc}")


@over_records
def query_cmd(
    sql: Annotated[str, typer.Argument(help="SQL over the views questions, retrievals, generations, votes, outcomes")],
    store: StoreOpt = DEFAULT_STORE,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
    experiment: Annotated[str | None, typer.Option(help="only this experiment's segments")] = None,
    mlflow_uri: MlflowPullOpt = None,
) -> None:
    """Run SQL (DuckDB) over the event store's views."""
    import duckdb

    from schemas.kinds import RECORD_KINDS
    from tracking.store.ledger import Ledger

    ledger = Ledger(store)
    # a mistyped --experiment gave empty views, so an empty table and exit 0; one with records of any kind is queried
    # (a run stopped before its outcomes still has questions and retrievals)
    if experiment and not any(ledger.store.segments(kind, experiment) for kind in RECORD_KINDS):
        raise ledger.no_outcomes(experiment)  # one line, worded as errors, hardest and analyze word it
    try:
        df = ledger.sql(sql, experiment)
    except duckdb.Error as exc:
        fail(f"SQL: {str(exc).splitlines()[0]}")
    emit(df, fmt, output)


@over_records
def errors_cmd(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: StoreOpt = DEFAULT_STORE,
    cell: Annotated[str | None, typer.Option(help="only this cell (exact name or words naming one cell)")] = None,
    error_type: Annotated[str | None, typer.Option("--error-type", help=ERROR_TYPE_HELP)] = None,
    include_correct: Annotated[bool, typer.Option(help="also list correct answers")] = False,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
    mlflow_uri: MlflowPullOpt = None,
) -> None:
    """Per-example error breakdown of an experiment's latest execution (seed 002's error types)."""
    from tracking.analysis.examples import error_examples

    out = error_examples(store, experiment, cell, error_type, include_correct)
    emit(out, fmt, output, title=f"{experiment}: per-example errors")
    if fmt == "table":
        counts = out["error_type"].value_counts()
        console.print("  ".join(f"{k}: {v}" for k, v in counts.items()) or "no rows")


@over_records
def flips_cmd(
    cell_a: Annotated[str, typer.Argument(help="cell A (exact name or words naming one cell)")],
    cell_b: Annotated[str, typer.Argument(help="cell B")],
    experiment: Annotated[str | None, typer.Option(help="experiment (default: the one holding both cells)")] = None,
    store: StoreOpt = DEFAULT_STORE,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
    mlflow_uri: MlflowPullOpt = None,
) -> None:
    """Paired comparison of two cells: flip table, exact McNemar p, paired-bootstrap CI of ΔEM, flipped questions."""
    from tracking.analysis.examples import cell_pair
    from tracking.analysis.stats import compare_cells, flipped_questions

    e, df, a, b = cell_pair(store, cell_a, cell_b, experiment)
    r = compare_cells(df, a, b)
    console.print(f"[bold]{escape(e)}[/]: A = {escape(a)}   B = {escape(b)}   ({r.questions} shared questions)")
    t = Table(show_header=True)
    for c in ("", "B right", "B wrong"):
        t.add_column(c, justify="right")
    t.add_row("A right", str(r.both_right), f"{r.won} (A won)")
    t.add_row("A wrong", f"{r.lost} (A lost)", str(r.both_wrong))
    console.print(t)
    console.print(f"EM A {100 * r.em_a:.1f}  EM B {100 * r.em_b:.1f}  ΔEM {100 * r.diff:+.1f} "
                  f"[95% paired bootstrap CI {100 * r.diff_lo:+.1f}, {100 * r.diff_hi:+.1f}]  "
                  f"exact McNemar p = {r.mcnemar_p:.4g}")
    flips = flipped_questions(df, a, b)
    if len(flips):
        emit(flips, fmt, output, title="flipped questions")


@over_records
def hardest_cmd(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: StoreOpt = DEFAULT_STORE,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
    mlflow_uri: MlflowPullOpt = None,
) -> None:
    """Questions every cell of the latest execution gets wrong (EM), with each cell's error type."""
    from tracking.analysis.examples import hardest_questions

    out, questions, n_cells = hardest_questions(store, experiment)
    emit(out, fmt, output, title=f"{experiment}: {len(out)} of {questions} questions failed by all {n_cells} cells")


@over_records(writes=True)
def analyze_cmd(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: StoreOpt = DEFAULT_STORE,
    out: Annotated[Path | None, typer.Option(help="also keep the files here (default <store>/analysis/<experiment>)",
                                             callback=output_folder)] = None,
    eor: Annotated[bool, typer.Option(help="fit and evaluate EoR (seed 002) over the retriever-cells")] = True,
    mlflow: Annotated[bool, typer.Option(help="log to the MLflow parent run of the latest execution")] = True,
    metric: Annotated[str, typer.Option(help="correctness for RWR/MRLR: em, or semantic (the BEM stand-in)")] = "em",
    eor_train: Annotated[str | None, typer.Option(help="fit EoR on this experiment's outcomes (default: a hashed-qid "
                                                       "split of this experiment's questions)")] = None,
    eor_pooling: Annotated[str, typer.Option("--eor-pooling", help="EoR pooling: mean (seed 002's), max, majority, "
                                             "plurality, or search (the best of the four on training accuracy)")] = "mean",
    across: Annotated[list[str] | None, typer.Option("--across", help="another experiment (a sweep's other dataset) "
                                                     "for seed 002's corpus-level figure; repeat for more")] = None,
    mlflow_uri: MlflowPullOpt = None,
) -> None:
    """Run the analysis flow: RWR/MRLR, error decomposition, statistics, EoR; plots + tables + report to MLflow."""
    from ragledger.prefect_env import configure_prefect_home

    configure_prefect_home(Path.cwd())
    from flows.analyze import analyze_flow
    from tracking.analysis.eor import POOLING_CHOICES
    from tracking.store.objects import StorageError
    from tracking.store.remote import push_up

    if eor_pooling not in POOLING_CHOICES:
        fail(f"--eor-pooling must be one of {', '.join(POOLING_CHOICES)}, got {eor_pooling!r}")
    r = analyze_flow(store, experiment, str(out) if out else None, metric, eor, mlflow, eor_train, eor_pooling,
                     tuple(across or ()))
    try:
        push_up(store)  # a store at an s3:// URL: the EoR records and analysis outputs go to the bucket
    except StorageError as exc:
        fail(str(exc))
    print_analysis(r)


@over_records
def trace_cmd(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    qid: Annotated[str, typer.Argument(help="question id")],
    store: StoreOpt = DEFAULT_STORE,
    cell: Annotated[str | None, typer.Option(help="only this cell")] = None,
    max_chars: Annotated[int, typer.Option(help="truncate prompts and passages to this many characters (0: no limit)")] = 0,
    mlflow_uri: MlflowPullOpt = None,
) -> None:
    """Lineage of one question: passages, every generation (role, prompt, raw output), the vote, the outcome."""
    from ragledger.trace import render_trace

    try:
        render_trace(console, store, experiment, qid, cell, max_chars)
    except ValueError as exc:  # TraceError, LedgerError, a --cell naming no cell or several
        fail(str(exc))


def across_cmd(
    experiments: Annotated[list[str], typer.Argument(help="experiment names; cells are sorted by the first's accuracy")],
    store: StoreOpt = DEFAULT_STORE,
    metric: Annotated[str, typer.Option(help="correctness: em, or semantic (the BEM stand-in)")] = "em",
    plot: Annotated[Path | None, typer.Option(help="write the figure (PNG) here")] = None,
    fmt: FormatOpt = "table",
    output: OutputOpt = None,
) -> None:
    """Each cell's accuracy in several experiments (a sweep's datasets), sorted by the first: seed 002's
    corpus-level figure as a table, and as a plot with --plot. EoR cells (stored by analyze) are left out."""
    from tracking.analysis.across import accuracy_across
    from tracking.store.ledger import LedgerError

    store = checked_store(store)
    if plot is not None and not plot.parent.is_dir():
        fail(f"--plot {plot}: no such directory {plot.parent}")
    try:
        table = accuracy_across(store, experiments, metric)
    except LedgerError as exc:
        fail(str(exc))
    if plot is not None:
        from core.atomic import atomic_write_bytes
        from tracking.report import plots

        atomic_write_bytes(plot, plots.accuracy_across(table, experiments, metric))
        err.print(f"figure written to {plot}")
    emit(table, fmt, output, title=f"accuracy % ({metric}) of each cell, sorted by {experiments[0]}")


# every command over stored records: (name, function); `register` adds them to the main app
COMMANDS: list[tuple[str, Callable[..., None]]] = [
    ("query", query_cmd),
    ("errors", errors_cmd),
    ("flips", flips_cmd),
    ("hardest", hardest_cmd),
    ("across", across_cmd),
    ("analyze", analyze_cmd),
    ("trace", trace_cmd),
]


def register(app: typer.Typer) -> None:
    for name, command in COMMANDS:
        app.command(name)(command)


def print_analysis(r: dict) -> None:
    """The analysis flow's result: every analysis of the registry's sections (tracking/analysis/registry.py), then
    where its files went."""
    console.print(f"[bold]{escape(r['experiment'])}[/] — {r['questions']} questions; RWR / MRLR compare retrievers within "
                  "each (reader, model) group (seed 002 holds the reader and the LM fixed)", soft_wrap=True)
    if r.get("dropped_questions"):
        console.print(f"{r['dropped_questions']} question(s) not answered by every cell were left out")
    for section in r["sections"]:
        if section["report_only"]:
            continue
        # the heading is printed, not a table title: rich wraps titles to the table's width
        console.print(f"\n[bold]{escape(section['title'])}[/]", soft_wrap=True)
        for line in section["lines"]:
            console.print(escape(line), soft_wrap=True, highlight=False)
        if section["rows"]:
            t = Table()
            for k, c in enumerate(section["columns"]):
                t.add_column(escape(c), justify="left" if k == 0 else "right")
            for row in section["rows"]:
                t.add_row(*map(escape, row))
            console.print(t)
    where = f"MLflow parent run {r['parent_run_id']} ({r['tracking_uri']})" if r.get("parent_run_id") else "no MLflow run"
    under = Path(r["files"][0]).parent if r["files"] else "-"
    console.print(f"\n{len(r['files'])} file(s) written under {under}; logged to {where}")
