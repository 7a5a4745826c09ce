"""Progress from inside tasks to whoever shows it (the CLI's rich progress bars, or plain lines in a log).

Tasks call `advance(stage, n)` as units of work finish; with no listener registered (tests) every call here does
nothing. A task in another process (a Dask worker, on this host or another) has no listener: there the task runs
`relayed` to the run's own process, which `replay`s each report into its listener (flows/dask_workers.py), so a
distributed run shows the same bars and lines as one run in threads.

A stage's total is its planned work: set at once when it is known (`set_total`: passages to embed, experiments of a
sweep), or part by part when it is planned part by part (`forecast`, then `planned`: a generate stage's model calls,
known when its task plans them; see `Forecast`).

The time left is the planned work still to do at the rate the finished work went since the stage's work began
(`seconds_left`). Units are counted (model calls), but their work may be weighed apart from them: a call's work is
its prompt's length (`call_work`), since a local model's time goes into reading prompts, and Concatenation's one call
over five passages costs about what Post-Fusion's five calls over one passage each cost, not a fifth of it.

A count of tasks that run side by side is shown untimed (`timed=False`): every shard's model calls are in flight
together, so the first of eight generate tasks ends late and the other seven soon after it; extrapolating their
count would promise many times the time actually left.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class Listener(Protocol):
    def total(self, stage: str, n: int, timed: bool = True, begun: bool = True) -> object:
        """The stage starts (again: each experiment of a sweep restarts it) with `n` units planned; its work begins
        now (`begun`), or when its first part is planned (`revise`)."""

    def revise(self, stage: str, n: int, work: float | None = None) -> object:
        """More of the stage's work is planned: its total is now `n` units (weighing `work`, when weighed)."""

    def advance(self, stage: str, n: int, work: float | None = None) -> object:
        """`n` more units are done (weighing `work`, when weighed)."""


_listener: Listener | None = None
_forecasts: dict[str, Forecast] = {}
_lock = threading.Lock()
# where this context's reports go when this process has no listener: a task's, to its run's process. A context
# variable, not a global: one worker runs tasks of several runs at once (a long-lived cluster), each to its own run
_relay: contextvars.ContextVar[Callable[[list[Any]], None] | None] = contextvars.ContextVar("progress_relay", default=None)


def set_listener(listener: Listener | None) -> None:
    global _listener
    with _lock:
        _listener = listener
        _forecasts.clear()


def listening() -> bool:
    return _listener is not None


@contextlib.contextmanager
def relayed(send: Callable[[list[Any]], None]) -> Iterator[None]:
    """Inside: this context's reports, when this process has no listener, go to `send` as plain lists (what a
    message between processes can carry), for the run's process to `replay`."""
    token = _relay.set(send)
    try:
        yield
    finally:
        _relay.reset(token)


def replay(report: list[Any]) -> None:
    """A report relayed from a task in another process, given to this process's listener as if made here."""
    kind, *args = report
    REPORTS[kind](*args)


def set_total(stage: str, total: int, timed: bool = True) -> None:
    with _lock:
        if _listener is not None:
            _listener.total(stage, total, timed)
            return
    _relay_report("set_total", stage, total, timed)


def advance(stage: str, n: int = 1, work: float | None = None) -> None:
    with _lock:
        if _listener is not None:
            _listener.advance(stage, n, work)
            return
    _relay_report("advance", stage, n, work)


def _relay_report(kind: str, *args: Any) -> None:
    send = _relay.get()
    if send is not None:
        send([kind, *args])


def forecast(stage: str, parts: Mapping[str, tuple[str, int]]) -> None:
    """The stage's work comes in `parts` (key -> (group, questions)), each planned later (`planned`); its total is
    the forecast's, from now on revised as parts are planned."""
    with _lock:
        if _listener is None:
            return
        _forecasts[stage] = f = Forecast(parts)
        _listener.total(stage, f.total(), True, begun=False)


def planned(stage: str, part: str, units: int, work: float | None = None) -> None:
    """Part `part` of the stage was planned: it is `units` units (0: none of it runs now), weighing `work` (by
    default one per unit). The forecast is the run's process's (its executor made it): a task elsewhere relays."""
    with _lock:
        f = _forecasts.get(stage)
        if _listener is not None:
            if f is not None:
                f.plan(part, units, work)
                _listener.revise(stage, f.total(), f.work())
            return
    _relay_report("planned", stage, part, units, work)


# what a task may relay (the reports a task makes; a forecast is made by the run's process itself)
REPORTS: dict[str, Callable[..., None]] = {"set_total": set_total, "advance": advance, "planned": planned}


def call_work(system: str, prompt: str) -> float:
    """A model call's weight in a stage's work: the characters of its prompt, plus a share for writing a short
    answer (about a hundred characters' worth); a call answered from the cache is not weighed (it costs nothing)."""
    return len(system) + len(prompt) + 100.0


@dataclass
class Forecast:
    """The units of a stage planned part by part: the planned parts' units, and for each part still to plan its
    questions times the units per question of the planned parts of its group (a cell's round: Post-Fusion plans one
    call per passage, Concatenation one per question), else of every planned part, else one per question. Their
    work is forecast the same way."""

    parts: Mapping[str, tuple[str, int]]  # part -> (group, questions)
    units: dict[str, int] = field(default_factory=dict)  # part -> units, once planned
    weights: dict[str, float] = field(default_factory=dict)  # part -> work, once planned

    def plan(self, part: str, units: int, work: float | None = None) -> None:
        self.units[part] = units
        self.weights[part] = float(units) if work is None else work

    def total(self) -> int:
        return round(self._forecast(self.units))

    def work(self) -> float:
        return self._forecast(self.weights)

    def _forecast(self, planned: Mapping[str, float]) -> float:
        per_group: dict[str, list[float]] = {}
        for part, amount in planned.items():
            group, questions = self.parts.get(part, ("", 0))
            sums = per_group.setdefault(group, [0, 0])
            sums[0], sums[1] = sums[0] + amount, sums[1] + questions
        everything = [sum(s[0] for s in per_group.values()), sum(s[1] for s in per_group.values())]
        expected = 0.0
        for part, (group, questions) in self.parts.items():
            if part not in planned:
                amount, asked = next(s for s in (per_group.get(group), everything, [1, 1]) if s and s[1] > 0)
                expected += questions * amount / asked
        return sum(planned.values()) + expected


def seconds_left(done: float, total: float | None, began: float | None, now: float) -> float | None:
    """The time the `total - done` units still to do take at the rate the `done` ones went since the work `began`;
    None before a unit is done (no rate yet), when the total is unknown, or once it is reached."""
    if began is None or total is None or done <= 0 or done >= total or now <= began:
        return None
    return (total - done) * (now - began) / done


@dataclass
class StageState:
    total: int | None = None
    done: int = 0
    began: float | None = None  # when its work began
    timed: bool = True
    last: float | None = None  # when a line last reported it (PlainProgress)
    work_total: float | None = None  # the planned work, when it is weighed apart from the units
    work_done: float = 0.0

    def left(self, now: float) -> float | None:
        if not self.timed:
            return None
        if self.work_total is not None:
            return seconds_left(self.work_done, self.work_total, self.began, now)
        return seconds_left(self.done, self.total, self.began, now)


class Stages:
    """Each stage's planned units, done units and start, as the listener calls report them: what a display shows."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or time.monotonic
        self.states: dict[str, StageState] = {}

    def total(self, stage: str, n: int, timed: bool = True, begun: bool = True) -> StageState:
        began = self.clock() if begun else None
        self.states[stage] = state = StageState(n, 0, began, timed, began)
        return state

    def revise(self, stage: str, n: int, work: float | None = None) -> StageState:
        state = self.states.setdefault(stage, StageState())
        state.total, state.work_total = n, work
        if state.began is None:
            state.began = self.clock()
        return state

    def advance(self, stage: str, n: int, work: float | None = None) -> StageState:
        state = self.states.get(stage)
        if state is None:  # a stage with no total: it starts at its first report
            state = self.states[stage] = StageState(began=self.clock())
        elif state.began is None:
            state.began = self.clock()
        state.done += n
        state.work_done += n if work is None else work
        return state


class PlainProgress(Stages):
    """Progress as plain lines, for output that is not a terminal (a log file of an hours-long run, CI):
    each stage's count at most every `every_s` seconds and when it completes, with elapsed time and time left."""

    def __init__(self, emit: Callable[[str], None], every_s: float = 30.0, clock: Callable[[], float] | None = None):
        super().__init__(clock)
        self.emit, self.every_s = emit, every_s

    def advance(self, stage: str, n: int, work: float | None = None) -> StageState:
        state = super().advance(stage, n, work)
        now = self.clock()
        # a forecast total may be reached before more of the stage's work is planned: said once, not at every unit
        finished = state.total is not None and state.done >= state.total > state.done - n
        if not finished and now - (state.last if state.last is not None else state.began) < self.every_s:
            return state
        state.last = now
        line = f"progress: {stage} {state.done:,}/{state.total:,}" if state.total else f"progress: {stage} {state.done:,}"
        line += f", {now - state.began:.0f} s"
        left = state.left(now)
        if left is not None:
            line += f", ~{left:.0f} s left"
        self.emit(line + (" (done)" if finished else ""))
        return state
