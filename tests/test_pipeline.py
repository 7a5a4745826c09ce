"""flows.pipeline: tasks submitted as their upstream finishes, with real Prefect tasks on the thread pool."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from prefect import flow, task

from flows.pipeline import Pipeline
from tasks.context import StageResult

WAIT_S = 30


def result(stage: str, shard: str, segment: str | None = None) -> StageResult:
    return StageResult(stage, "cell", shard, segment, 1, "token", {})


@pytest.fixture
def chained_flow(prefect_harness):
    """Two shards, each `slow -> fast`. Shard 1's slow task finishes only after shard 0's fast task ran, so a
    runner that waits for every `slow` task before starting any `fast` one (stage layers) never gets there."""
    fast_of_shard_0_ran = threading.Event()
    order: list[str] = []

    @task
    def slow(shard: str) -> StageResult:
        if shard == "1" and not fast_of_shard_0_ran.wait(WAIT_S):
            raise TimeoutError("shard 1's first stage waited in vain for shard 0's second stage")
        order.append(f"slow {shard}")
        return result("slow", shard)

    @task
    def fast(shard: str) -> StageResult:
        order.append(f"fast {shard}")
        if shard == "0":
            fast_of_shard_0_ran.set()
        return result("fast", shard)

    @flow
    def run() -> dict:
        seen: list[tuple[str, str]] = []
        pipeline = Pipeline(on_result=lambda stage, r: seen.append((stage, r.shard)))
        for shard in ("0", "1"):
            pipeline.submit("slow", slow, {"shard": shard}, lambda r: pipeline.submit("fast", fast, {"shard": r.shard},
                                                                                        lambda r: None))
        pipeline.run()
        return {"seen": seen, "spans": pipeline.stage_spans(["slow", "fast"]), "last": pipeline.last_done}

    return run, order


def test_a_shard_moves_on_while_another_shard_is_still_in_its_first_stage(chained_flow):
    run, order = chained_flow
    out = run()
    assert order == ["slow 0", "fast 0", "slow 1", "fast 1"]
    # every result reached on_result once (fast 0 and slow 1 finish close together: their order may vary)
    assert sorted(out["seen"]) == [("fast", "0"), ("fast", "1"), ("slow", "0"), ("slow", "1")]
    spans = out["spans"]
    # the spans split the pipeline's wall time at each stage's last finish: they add up to the last finish
    assert sum(spans.values()) == pytest.approx(max(out["last"].values()), abs=0.02)
    assert all(v >= 0 for v in spans.values())


def test_a_result_whose_segment_vanished_is_recomputed_without_the_cache(prefect_harness, tmp_path: Path):
    segment = tmp_path / "segment.parquet"
    calls: list[bool] = []

    @task(cache_key_fn=lambda ctx, params: "pipeline-vanished-segment-" + str(tmp_path), persist_result=True)
    def write_segment() -> StageResult:
        segment.write_text("rows")
        calls.append(True)
        return result("write", "0", str(segment))

    @flow
    def run() -> list[str]:
        got: list[str] = []
        pipeline = Pipeline()
        pipeline.submit("write", write_segment, {}, lambda r: got.append(r.segment))
        pipeline.run()
        return got

    assert run() == [str(segment)] and len(calls) == 1
    assert run() == [str(segment)] and len(calls) == 1  # the cached result: its segment is there
    os.remove(segment)
    assert run() == [str(segment)] and len(calls) == 2  # the cached result points at nothing: ran again
    assert segment.exists()


def test_a_failing_task_ends_the_run_with_its_error(prefect_harness):
    @task
    def broken(shard: str) -> StageResult:
        raise ValueError(f"shard {shard}: bad row 7, field 'answers'")

    @flow
    def run() -> None:
        pipeline = Pipeline()
        pipeline.submit("broken", broken, {"shard": "3"}, lambda r: None)
        pipeline.run()

    with pytest.raises(ValueError, match="shard 3: bad row 7, field 'answers'"):
        run()


def test_stage_spans_partition_the_wall_time_in_chain_order():
    p = Pipeline()
    p.last_done = {"retrieve": 2.0, "generate": 20.0, "vote": 20.5, "evaluate": 21.0}
    assert p.stage_spans(["retrieve", "generate", "vote", "evaluate"]) == {
        "retrieve": 2.0, "generate": 18.0, "vote": 0.5, "evaluate": 0.5}
    p.last_done = {"generate": 5.0}  # a stage with no task takes no time; none goes backwards
    assert p.stage_spans(["retrieve", "generate", "vote"]) == {"retrieve": 0.0, "generate": 5.0, "vote": 0.0}
