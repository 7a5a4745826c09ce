"""What a run reports: its summary (RunSummary, the run manifest's `summary`), the counters its stage tasks add up
to (Accounting), and the wall time of each stage (StageClock)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from core import progress
from tasks.stages import GenerateStage, StageResult

COUNTERS = ("llm_calls", "cache_hits", "retries", "tokens_in")


@dataclass
class RunSummary:
    experiment: str
    spec_hash: str
    questions: int  # the questions the cells ran on (after the closed-book filter, when the spec asks for it)
    questions_sampled: int = 0  # the questions sampled from the dataset
    closed_book_dropped: int | None = None  # seed 001's filter: answered correctly closed book, so dropped (None: off)
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)
    llm_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens_sent: int = 0  # prompt tokens of the calls this run made (their usage.prompt_tokens)
    # of those, what the embedded server evaluated by its own count (it reuses the previous prompt's prefix from its
    # KV cache); None for other backends
    prompt_tokens_evaluated: int | None = None
    tasks_total: int = 0
    tasks_from_cache: int = 0
    task_processes: int = 0  # distinct processes that ran this run's stage tasks (1 = threads; >1 = Dask workers)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage: where the run's time went
    wall_time_s: float = 0.0
    mlflow_parent_run_id: str | None = None
    mlflow_cell_run_ids: dict[str, str] = field(default_factory=dict)
    tracking_uri: str = ""
    mlflow_experiment_id: str | None = None
    manifest: str | None = None
    mlflow_pending: str | None = None  # MLflow did not take the logging: why, and that `ragledger sync` will log it
    mlflow_synced: list[str] = field(default_factory=list)  # earlier pending executions this run logged to MLflow
    flow_run_id: str | None = None
    root_flow_run_id: str | None = None  # the scheduled parent flow run, when run as a subflow


@dataclass
class Accounting:
    """What this run's stage tasks did: a result from another run's token came from the cache; the counters of
    the tasks that ran add up to the run's model calls."""

    run_token: str
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    tasks_total: int = 0
    tasks_cached: int = 0
    pids: set[int] = field(default_factory=set)

    def add(self, stage: str, result: StageResult) -> None:
        self.tasks_total += 1
        if result.run_token != self.run_token:
            self.tasks_cached += 1
            return
        self.pids.add(result.pid)
        for k in self.counters:
            self.counters[k] += result.counters.get(k, 0)

    def add_with_progress(self, stage: str, result: StageResult) -> None:
        self.add(stage, result)
        progress.advance(stage, 1)
        if stage == GenerateStage.stage:
            self._calls_progress(result)

    def _calls_progress(self, result: StageResult) -> None:
        """A generate task persisted by an earlier run makes none of its calls now: none of the forecast's. A task
        that ran reported its calls itself, in a thread here or from a Dask worker (core/progress.py `relayed`)."""
        if result.run_token != self.run_token:
            progress.planned(GenerateStage.calls_progress, result.shard, 0)

    def fill(self, summary: RunSummary) -> None:
        summary.llm_calls, summary.cache_hits = self.counters["llm_calls"], self.counters["cache_hits"]
        summary.retries, summary.prompt_tokens_sent = self.counters["retries"], self.counters["tokens_in"]
        summary.tasks_total, summary.tasks_from_cache = self.tasks_total, self.tasks_cached
        summary.task_processes = len(self.pids)


class StageClock:
    """Wall time per stage of the flow, each from the end of the one before."""

    def __init__(self, started: float | None = None) -> None:
        """`started`: when the run's work began, if before the flow (flows/head_start.py): reported as "start-up"."""
        self._last = time.perf_counter()
        self.started = started or self._last
        self.seconds: dict[str, float] = {"start-up": round(self._last - started, 2)} if started else {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._last, 2)
        self._last = now

    def restart(self) -> None:
        self._last = time.perf_counter()

    def total(self) -> float:
        return round(time.perf_counter() - self.started, 2)
