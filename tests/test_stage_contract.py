"""tasks/stages.py: each stage declares its task name, inputs and key in one place; the Prefect task caches under
that key and every stage returns the one result type."""

from __future__ import annotations

import pickle
import pickletools

import pytest

from core.cell import Cell
from tasks.stages import (
    EvaluateStage,
    FilterStage,
    GenerateStage,
    RetrieveStage,
    RunContext,
    StageResult,
    VoteStage,
)

CELL = Cell("bm25@2", "post_fusion", "m")
STAGES = [
    FilterStage("d", "m", "fig7-1", "m", ("q1",)),
    RetrieveStage("d", "c", "bm25@2", "1", ("q1",), "/store"),
    GenerateStage("r", CELL, 1, "pf-1", "m", (), ("q1",)),
    VoteStage("g", CELL, "1", "majority", ("q1",)),
    EvaluateStage("v", CELL, ("q1",)),
]


def task_of(stage):
    from tasks.prefect_tasks import closed_book_filter_task, evaluate_task, generate_round_task, retrieve_task, vote_task

    return {FilterStage: closed_book_filter_task, RetrieveStage: retrieve_task, GenerateStage: generate_round_task,
            VoteStage: vote_task, EvaluateStage: evaluate_task}[type(stage)]


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: type(s).__name__)
def test_the_task_is_named_and_cached_by_its_stage(stage):
    task = task_of(stage)
    assert task.name == stage.task_name
    assert task.cache_key_fn(None, {"stage": stage}) == stage.key


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: type(s).__name__)
def test_one_result_type(stage):
    run = RunContext(None, "/store", "/store/questions/x/seg.parquet", "token")
    result = stage.result(run, None, 0)
    assert isinstance(result, StageResult)
    assert (result.shard, result.run_token, result.segment, result.counters) == (stage.key, "token", None, {})
    assert result.stage == ("generate round 1" if isinstance(stage, GenerateStage) else stage.stage)


def test_cell_labels():
    assert [s.cell_label for s in STAGES] == ["none · closed_book_filter · m", "bm25@2", CELL.name, CELL.name, CELL.name]
    assert [s.calls_model for s in STAGES] == [True, False, True, False, False]
    assert RetrieveStage("d", "c", "compress(bm25@2)", "1", ("q1",), "/store", model_key="m").calls_model


def test_a_stage_is_a_value_and_pickles():
    """Dask workers get their stage by pickle; equal inputs are the same stage."""
    stage = STAGES[2]
    assert pickle.loads(pickle.dumps(stage)) == stage and pickle.loads(pickle.dumps(stage)).key == stage.key
    with pytest.raises(AttributeError):
        stage.round_no = 2  # type: ignore[misc]


def test_results_persisted_under_the_old_module_name_still_load(monkeypatch):
    """Prefect persisted StageResults as tasks.context.StageResult before the class moved to tasks/stages.py."""
    import tasks.context

    result = StageResult("vote", "c", "k", None, 1, "t", {})
    monkeypatch.setattr(StageResult, "__module__", "tasks.context")
    old = pickle.dumps(result)
    monkeypatch.undo()
    assert any(arg == "tasks.context" for _, arg, _ in pickletools.genops(old))
    assert tasks.context.StageResult is StageResult and pickle.loads(old) == result
