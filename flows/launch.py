"""`ragledger run` below the command line: one entry from a parsed spec to its run summary.

It checks the spec's inputs (nothing is written before), then takes one of four routes, planning the run once
whichever it takes:
- answered from the store (flows/cached.py) when this exact run is there already: nothing starts;
- direct (flows/direct.py), when the command may record the run after printing its answer: one experiment on the
  thread runner into a store in a folder runs without Prefect, and a process of its own records it in Prefect and
  MLflow afterwards (ragledger/recorder.py);
- begun ahead (flows/head_start.py) while the Prefect API starts, then the flow, which runs the run begun;
- the flow alone: a sweep, the closed-book filter, the Dask runner (flows/sweep.py `run_spec`).
A rerun is planned here to ask the store, and that plan is the one the head start and the flow run; a first run is
planned by its head start, beside the search engines' start. What belongs to the command (its terminal, run log and
the Prefect API server it starts) comes in as a `Host`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flows.prepare import PreparedRun
    from schemas.spec import AnySpec, CorpusSpec, ExperimentSpec


@dataclass(frozen=True)
class RunOptions:
    """What the command line adds to a spec for one run (each None: the spec's own)."""

    store_root: str
    base_url: str | None = None
    runner: str | None = None
    workers: int | None = None
    scheduler: str | None = None
    # the run's Prefect flow run and MLflow logging may be made after its answer, by a process of its own
    # (flows/direct.py): `ragledger run` unless --foreground; not `ragledger.run`, whose result names the MLflow run
    record_after: bool = False
    source: str | None = None  # the name the spec's errors go by (its file), which begins an input's error


class Host(Protocol):
    """What the command running the spec provides (ragledger/cli.py)."""

    def say(self, line: str) -> None:
        """A line for the user while the inputs are checked (a corpus read the first time takes a while)."""

    def running(self, spec: AnySpec) -> AbstractContextManager[None]:
        """Entered once the run goes to the flow, before anything starts: the run log, Prefect's home, progress."""

    def prefect_api(self, meanwhile: Callable[[], None]) -> AbstractContextManager[str]:
        """The Prefect API for the flow; `meanwhile` runs while its server starts."""

    def start_recorder(self, store_root: str, tracking_uri: str, manifest: str | None = None,
                       spec_json: str | None = None) -> int:
        """A process of its own that records a run made without Prefect's flow (flows/direct.py) in Prefect and
        MLflow, or without `manifest` logs the store's pending executions for `tracking_uri`; its pid."""


def launch(spec: AnySpec, options: RunOptions, host: Host) -> dict[str, Any]:
    """The run summary of `spec` (a sweep's: one per experiment), answered from the store or run. Raises the
    errors of the inputs (before anything is written) and of the run."""
    if _takes_direct_route(spec, options):  # a first run's JVM and call process start beside the checks and imports
        from flows.head_start import started_ahead_of_a_first_run

        started_ahead_of_a_first_run(spec, options.store_root, options.base_url)  # type: ignore[arg-type]
    preflight(spec, host.say, options.source)
    from tracking.store.remote import pushed

    # a store at an s3:// URL: manifests, packs, catalog, calls (none for a folder); the segments too when no worker
    # of another process reads them during the run
    one_process = spec.execution.runner_taken(options.runner) == "thread"
    with pushed(options.store_root, segments_at_end=one_process):
        return _launched(spec, options, host)


def _launched(spec: AnySpec, options: RunOptions, host: Host) -> dict[str, Any]:
    started = time.perf_counter()
    planned = _planned_rerun(spec, options)
    if planned is not None:
        from flows.cached import answered

        answer = answered(planned.plan, started)
        if answer is not None:
            return _with_pending_logged(answer, options, host)
    if _takes_direct_route(spec, options):
        return _run_direct(spec, options, host, planned)
    from flows.head_start import HeadStart

    with host.running(spec):
        head_start = HeadStart.begin(spec, options.store_root, options.runner, options.base_url, planned)
        _preload_mlflow(spec)
        with host.prefect_api(_import_flow_modules):
            from flows.sweep import run_spec

            return run_spec(spec, options.store_root, base_url=options.base_url, runner=options.runner,
                            workers=options.workers, scheduler_address=options.scheduler, head_start=head_start)


def _takes_direct_route(spec: AnySpec, options: RunOptions) -> bool:
    """Whether the run goes without Prefect, recorded after its answer (flows/direct.py): when the command allows
    it, for one experiment on the thread runner into a store in a folder (a store at a URL, a sweep and the Dask
    runner go through the flow)."""
    from schemas.spec import ExperimentSpec
    from tracking.store.mirrored import origin_url

    return (options.record_after and isinstance(spec, ExperimentSpec)
            and spec.execution.runner_taken(options.runner) == "thread" and not spec.execution.scheduler_address
            and origin_url(Path(options.store_root)) is None)


def _run_direct(spec: ExperimentSpec, options: RunOptions, host: Host, planned: PreparedRun | None) -> dict[str, Any]:
    """The run without Prefect, then its recorder started (ragledger/recorder.py): its pid in the summary."""
    from flows.direct import run_direct

    with host.running(spec):
        summary = run_direct(spec, options.store_root, options.base_url, planned)
    summary["recorder_pid"] = host.start_recorder(options.store_root, summary["tracking_uri"], summary["manifest"],
                                                  spec.model_dump_json())
    return summary


def _with_pending_logged(answer: dict[str, Any], options: RunOptions, host: Host) -> dict[str, Any]:
    """A cached answer; when some execution's MLflow logging is pending (only a command that records after its
    answer is answered then), a recorder started to log it (`Host.start_recorder`), its pid in the answer."""
    from tracking.mlflow.sync import pending_markers

    if options.record_after and pending_markers(options.store_root):
        answer["recorder_pid"] = host.start_recorder(options.store_root, answer["tracking_uri"])
    return answer


def _planned_rerun(spec: AnySpec, options: RunOptions) -> PreparedRun | None:
    """The run planned, when the store may already hold it; None (nothing planned here) for a first run, whose head
    start plans it beside the search engines' start. The cached answer is an optimisation: in any doubt the flow
    plans and reports the error itself."""
    if not _may_be_answered(spec, options):
        return None
    from flows.prepare import plan_run

    try:
        return plan_run(spec, options.store_root)  # type: ignore[arg-type]  (an experiment: _may_be_answered)
    except Exception:
        return None


def _may_be_answered(spec: AnySpec, options: RunOptions) -> bool:
    """Whether the store may answer this run, told without planning it or importing pandas: not with a run option
    that changes what it would answer (the endpoint, the runner), not for a sweep, nor for a spec with the closed-book
    filter (which questions it drops is known only from its model answers), nor on a first run (no manifest yet),
    nor while some execution's MLflow logging is pending, unless the command records after its answer (the flow
    logs it; or a recorder: `_with_pending_logged`); RAGLEDGER_CACHED_ANSWER=0: never."""
    import os

    from core.paths import StoreLayout
    from schemas.spec import ExperimentSpec

    if options.base_url is not None or options.runner is not None or os.environ.get("RAGLEDGER_CACHED_ANSWER") == "0":
        return False
    if not isinstance(spec, ExperimentSpec) or spec.dataset.closed_book_filter:
        return False
    if not StoreLayout.of(options.store_root).manifests(spec.name):
        return False
    if options.record_after:
        return True
    from tracking.mlflow.sync import pending_markers

    try:
        return not pending_markers(options.store_root)
    except OSError:
        return False


def _import_flow_modules() -> None:
    """The flow modules' imports (Prefect, pandas, pandera: seconds on a cold start), done while Prefect's temporary
    server starts in its own process. Nothing heavier is imported before the first model call: torch, transformers
    and sentence-transformers never, MLflow inside the functions that use it (tests/test_cold_start_imports.py)."""
    import flows.sweep  # noqa: F401


def _preload_mlflow(spec: AnySpec) -> None:
    """MLflow imported and its tracking store opened in a thread from now on (seconds), beside the start of Prefect's
    temporary server in its own process (or the flow's first tasks): a small run's end waited for it otherwise, its
    calls too few to hide it (docs/performance.md, "The fixed cost of a small run"). After the head start's first
    calls have left, not before them."""
    import threading

    from tracking.mlflow.log import preload, resolve_tracking_uri

    threading.Thread(target=preload, args=(resolve_tracking_uri(spec.tracking.mlflow_uri),), daemon=True,
                     name="ragledger-mlflow-preload").start()


def preflight(spec: AnySpec, say: Callable[[str], None] | None = None, source: str | None = None) -> None:
    """Check every input before anything is written or any model is called: the API key (then scrubbed from whatever
    is shown: core/secrets.py), the embedded model, every dataset of a sweep, the corpus, the MLflow URI the run would
    use. An error of the spec's inputs names the field, after `source` (the spec's file) when given."""
    import os

    from core.datasets import DatasetError
    from core.secrets import mark_secret_env, refuse_credentials
    from engines.llm_types import BackendError
    from engines.models import ModelFetchError

    try:
        _check_spec_inputs(spec, say)
    except (BackendError, ModelFetchError, DatasetError) as exc:  # DatasetError: a corpus's CorpusError too
        if source is None:
            raise
        raise type(exc)(f"{source}: {exc}") from None
    if not spec.tracking.mlflow_uri:  # the URI the run would use instead (the spec's own is checked with the spec)
        refuse_credentials(os.environ.get("MLFLOW_TRACKING_URI"), "MLFLOW_TRACKING_URI", "MLflow reads them from "
                           "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (an MLflow server) or PGPASSWORD (PostgreSQL)")
    mark_secret_env(spec.model.api_key_env)


def _check_spec_inputs(spec: AnySpec, say: Callable[[str], None] | None) -> None:
    """`preflight`'s checks of what the spec names, each error naming the spec's field."""
    from core.datasets import DatasetError, check_questions
    from schemas.spec import SweepSpec
    from strategies.retrievers import parse_retriever

    if spec.model.backend == "openai":
        from engines.llm import api_key_from_env

        api_key_from_env(spec.model.api_key_env)  # its message names model.api_key_env
    else:
        from engines.models import ModelFetchError, bundled_model

        try:
            bundled_model(spec.model.embedded_model)  # a former name is told the current one
        except ModelFetchError as exc:
            raise ModelFetchError(f"model.embedded_model: {exc}") from None
    for i, experiment in enumerate(spec.expand()):
        try:
            check_questions(experiment.dataset.name, experiment.dataset.path)
        except DatasetError as exc:
            where = f"dataset[{i}]" if isinstance(spec, SweepSpec) else "dataset"
            raise DatasetError(f"{where}.path: {exc}") from None
    if any(parse_retriever(r).needs_corpus for r in spec.retrievers):  # last: a first read of a large corpus takes minutes
        check_corpus(spec.corpus, say)  # its messages name corpus.paths or corpus.faiss


def check_corpus(spec: CorpusSpec, say: Callable[[str], None] | None = None) -> None:
    """The corpus as given: its files read and hashed (once per file, strategies/retrievers/corpus.py), or its index
    opened and its stored documents checked; and its FAISS directory, when it names one."""
    from strategies.retrievers.corpus import Corpus

    corpus = Corpus.of_spec(spec, log=say)
    if not corpus.built_here:
        from strategies.retrievers.lucene import PassageStore

        PassageStore.given(corpus)
