"""A run prepared: its questions loaded and sampled (seeded), its plan (flows/plan.py), then its questions stored once
and its indexes built or opened before shards fan out. The flow prepares its run here, or takes the run its head
start planned here before Prefect was up (flows/head_start.py) and stores it; nothing here imports Prefect."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from core.datasets import Question
from flows.plan import ExperimentPlan, plan, question_rows
from schemas.spec import ExperimentSpec
from tasks.context import retriever_for
from tasks.stages import HeadStartView, RunContext
from tracking.store.events import EventStore, new_events
from tracking.store.mirrored import origin_url


class PreparedRun(NamedTuple):
    plan: ExperimentPlan
    run: RunContext
    questions: list[Question]

    def met_by(self, head_start: HeadStartView) -> PreparedRun:
        """The same run, its tasks meeting `head_start` (one given the run planned before it began)."""
        return self._replace(run=dataclasses.replace(self.run, head_start=head_start))


def plan_run(spec: ExperimentSpec, store_root: str, head_start: HeadStartView | None = None) -> PreparedRun:
    """The run of `spec` in `store_root`, planned; nothing written yet. `head_start`: its head start, which its tasks meet."""
    questions = spec.dataset.sampled_questions()
    the_plan = plan(spec, questions, store_root=store_root)  # its questions segment named, its corpus hash read
    run = RunContext(spec, store_root, the_plan.questions_segment, uuid.uuid4().hex, head_start=head_start,
                     store_url=origin_url(Path(store_root)))  # a mirror's URL: a worker elsewhere works in its own
    return PreparedRun(the_plan, run, questions)


def store_run(prepared: PreparedRun, retrievers: Iterable[str] | None = None) -> None:
    """The planned run's questions stored (the segment its plan names) and its retrievers' indexes built or opened
    (`retrievers`: only these, whose retrievals are still to be made)."""
    _, run, questions = prepared
    store = EventStore(run.store_root)
    store.remove_abandoned_temp_files()
    written = str(store.write("questions", new_events("questions", run.spec.name, question_rows(run.spec, questions))))
    assert written == run.questions_segment, (written, run.questions_segment)  # a segment is named by its events
    for r in run.spec.retrievers if retrievers is None else retrievers:
        retriever_for(run.spec, r, run.store_root)
