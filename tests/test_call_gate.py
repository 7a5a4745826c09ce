"""The endpoint's call gate: the bound on calls in flight, and with one slot the longest-shared-prefix order."""

from __future__ import annotations

import asyncio
import json

import pytest

from engines.call_gate import CallGate, common_prefix_len


def test_common_prefix_len():
    assert common_prefix_len("", "abc") == 0
    assert common_prefix_len("abc", "abc") == 3
    assert common_prefix_len("abcd", "abxd") == 2
    assert common_prefix_len("passages q1 (a)", "passages q1 (b)") == len("passages q1 (")
    assert common_prefix_len("x" * 5000 + "a", "x" * 5000 + "b") == 5000


async def _admission_order(gate: CallGate, first: str, queued: list[str]) -> list[str]:
    """Hold the slot with `first`, queue the rest in order, then let each go: the order they were admitted."""
    order: list[str] = []
    release_first = asyncio.Event()

    async def call(text: str, hold: asyncio.Event | None = None) -> None:
        async with gate.slot(text):
            order.append(text)
            if hold is not None:
                await hold.wait()
            await asyncio.sleep(0)

    head = asyncio.create_task(call(first, release_first))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(call(t)) for t in queued]
    await asyncio.sleep(0.01)  # every queued call is waiting now
    release_first.set()
    await asyncio.gather(head, *rest)
    return order


def test_one_slot_admits_the_longest_shared_prefix_next():
    sys_ = "Answer the question.\x00"
    q1 = sys_ + "Passages: [1] Denver won Super Bowl 50. Question: who won?"
    q2 = sys_ + "Passages: [1] Beyonce headlined the halftime show. Question: who sang?"
    queued = [q2, q1 + " sample 2", "Other system\x00x", q1 + " sample 1", q2 + " sample 1"]
    order = asyncio.run(_admission_order(CallGate(1, min_shared=1), q1, queued))
    # after q1: its two samples (ties: the one that waited longest), then q2 and its sample, then the stranger
    assert order == [q1, q1 + " sample 2", q1 + " sample 1", q2, q2 + " sample 1", "Other system\x00x"]


def test_first_come_first_served_without_prefix_order_or_with_more_slots():
    queued = ["b", "a1", "c", "a2"]
    assert asyncio.run(_admission_order(CallGate(1, prefix_order=False), "a", queued)) == ["a", *queued]
    gate = CallGate(2)
    assert not gate.prefix_order  # a batching server: arrival order


def test_the_bound_holds_and_a_cancelled_waiter_passes_its_slot_on():
    async def scenario() -> tuple[int, list[str]]:
        gate, in_flight, peak, done = CallGate(2), 0, 0, []

        async def call(name: str, seconds: float) -> None:
            nonlocal in_flight, peak
            async with gate.slot(name):
                in_flight += 1
                peak = max(peak, in_flight)
                await asyncio.sleep(seconds)
                in_flight -= 1
                done.append(name)

        tasks = [asyncio.create_task(call(f"c{i}", 0.02)) for i in range(6)]
        await asyncio.sleep(0.005)
        tasks[4].cancel()  # waiting: it must leave the queue without taking a slot
        await asyncio.gather(*tasks, return_exceptions=True)
        return peak, done

    peak, done = asyncio.run(scenario())
    assert peak == 2
    assert sorted(done) == ["c0", "c1", "c2", "c3", "c5"]


def test_a_gate_needs_a_slot():
    with pytest.raises(ValueError, match="at least one slot"):
        CallGate(0)


def test_each_admission_is_reported_with_the_queue_and_the_shared_prefix():
    admissions: list[dict] = []
    q1 = "sys\x00Passages: A. Question: one"
    queued = ["sys\x00Passages: B. Question: two", q1 + " (b)"]
    order = asyncio.run(_admission_order(CallGate(1, on_admit=admissions.append, min_shared=1), q1, queued))
    assert order == [q1, q1 + " (b)", queued[0]]
    # the first found the slot free; the second was chosen from 2 waiting and shares all of q1; the last waited alone
    assert [(a["queued"], a["shared"], a["chars"]) for a in admissions] == [
        (0, 0, len(q1)), (2, len(q1), len(q1) + 4), (1, len("sys\x00Passages: "), len(queued[0]))]
    assert {a["order"] for a in admissions} == {"prefix"} and len({a["digest"] for a in admissions}) == 3


def test_the_admission_log_appends_json_lines_to_the_file_named_by_the_environment(tmp_path, monkeypatch):
    from engines.call_gate import admission_log_from_env

    monkeypatch.delenv("RAGLEDGER_GATE_LOG", raising=False)
    assert admission_log_from_env() is None
    log = tmp_path / "gate.jsonl"
    monkeypatch.setenv("RAGLEDGER_GATE_LOG", str(log))
    asyncio.run(_admission_order(CallGate(1, prefix_order=False, on_admit=admission_log_from_env()), "a", ["b"]))
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["order"], e["queued"]) for e in lines] == [("arrival", 0), ("arrival", 1)]


def test_each_server_behind_one_gate_is_matched_against_its_own_previous_prompt():
    """The embedded backend's log-probability server shares the main server's slot: a call to the main server
    after a log-probability call still goes by what the main server's KV cache holds."""

    async def scenario() -> list[str]:
        gate, order, hold = CallGate(1, min_shared=1), [], asyncio.Event()

        async def call(text: str, server: str, wait: asyncio.Event | None = None) -> None:
            async with gate.slot(text, server):
                order.append(f"{server}:{text}")
                if wait is not None:
                    await wait.wait()

        await call("q1 passages main", "main")  # what the main server holds
        head = asyncio.create_task(call("q9 feedback", "logprobs", hold))
        await asyncio.sleep(0)
        rest = [asyncio.create_task(call(t, "main")) for t in ("q9 other", "q1 passages main (b)")]
        await asyncio.sleep(0.01)
        hold.set()
        await asyncio.gather(head, *rest)
        return order

    # after the log-probability call, q9's main-server call shares "q9 " with it, but the main server holds q1's prompt
    assert asyncio.run(scenario()) == ["main:q1 passages main", "logprobs:q9 feedback", "main:q1 passages main (b)",
                                       "main:q9 other"]


def test_a_short_shared_prefix_counts_as_none_and_calls_with_more_rounds_after_them_go_first():
    """SuRe's round-1 call goes before Base's and the generic summary's: its next round's calls then find them
    still waiting (they share the passages) instead of arriving after they have gone."""
    header = "<|im_start|>system\n"  # what every prompt of a chat template starts with: not worth waiting for
    passages = "Passage #1 Title: Super Bowl 50\nPassage #1 Text: " + "The Broncos defeated the Panthers. " * 20

    async def scenario() -> list[str]:
        gate, order, hold = CallGate(1), [], asyncio.Event()

        async def call(name: str, text: str, rounds_after: int, wait: asyncio.Event | None = None) -> None:
            async with gate.slot(text, "", rounds_after):
                order.append(name)
                if wait is not None:
                    await wait.wait()
                if name == "candidates":  # its answer plans SuRe's next round, which shares Base's passages
                    tasks.append(asyncio.create_task(call("mcq", header + passages + "Choices: (a) Broncos", 0)))

        tasks: list[asyncio.Task] = []
        head = asyncio.create_task(call("other question", header + "Context: something else entirely", 0, hold))
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(call(n, header + t, r)) for n, t, r in (
            ("base", passages + "Answer:", 0), ("generic", "\n\n" + passages + "Summary:", 1),
            ("candidates", "Below are 5 passages." + passages, 2))]
        await asyncio.sleep(0.01)
        hold.set()
        await head
        while not all(t.done() for t in tasks):
            await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["other question", "candidates", "generic", "base", "mcq"]
