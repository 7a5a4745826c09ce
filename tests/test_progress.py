"""Progress: plain lines for long runs whose output goes to a file (no terminal for progress bars), and the time
left from the planned work (core/progress.py)."""

from core import progress
from core.progress import Forecast, PlainProgress, Stages, seconds_left


def test_plain_progress_reports_at_most_every_interval_and_at_completion():
    now = [0.0]
    lines: list[str] = []
    p = PlainProgress(lines.append, every_s=30, clock=lambda: now[0])
    p.total("generate calls", 100)
    for _ in range(100):
        now[0] += 1.0  # one call a second
        p.advance("generate calls", 1)
    # a line at 30 s, 60 s and 90 s, and one when the stage completes (100 s)
    assert lines == [
        "progress: generate calls 30/100, 30 s, ~70 s left",
        "progress: generate calls 60/100, 60 s, ~40 s left",
        "progress: generate calls 90/100, 90 s, ~10 s left",
        "progress: generate calls 100/100, 100 s (done)",
    ]


def test_plain_progress_without_a_known_total():
    now = [0.0]
    lines: list[str] = []
    p = PlainProgress(lines.append, every_s=10, clock=lambda: now[0])
    for _ in range(25):
        now[0] += 1.0
        p.advance("dense index", 512)
    # the stage starts at its first report (t = 1 s): lines at 11 s and 21 s
    assert lines == ["progress: dense index 5,632, 10 s", "progress: dense index 10,752, 20 s"]


def test_each_experiment_of_a_sweep_restarts_a_stage():
    now = [0.0]
    lines: list[str] = []
    p = PlainProgress(lines.append, every_s=30, clock=lambda: now[0])
    for _experiment in range(2):
        p.total("vote", 2)
        for _ in range(2):
            now[0] += 1.0
            p.advance("vote", 1)
    assert lines == ["progress: vote 2/2, 2 s (done)", "progress: vote 2/2, 2 s (done)"]  # not 4/2 the second time


# A demo-like run: Concatenation (one call per question) and Post-Fusion (one call per passage, k = 5) over two shards
# of 5 questions: 4 generate stages, 60 model calls.
PARTS = {"concat-1": ("concat round 1", 5), "pf-1": ("pf round 1", 5),
         "concat-2": ("concat round 1", 5), "pf-2": ("pf round 1", 5)}


def test_the_forecast_counts_planned_calls_and_estimates_the_rest_by_questions():
    f = Forecast(PARTS)
    assert f.total() == 20  # nothing planned: one call per question
    f.plan("concat-1", 5)
    assert f.total() == 20  # 5 planned, 15 questions at the 1 call per question planned so far
    f.plan("pf-1", 25)
    assert f.total() == 60  # 30 planned; concat-2 at concat's 1/question, pf-2 at Post-Fusion's 5/question
    f.plan("concat-2", 5)
    f.plan("pf-2", 25)
    assert f.total() == 60
    rounds = Forecast({"a": ("fallback round 1", 4), "b": ("fallback round 2", 4)})
    rounds.plan("a", 4)
    assert rounds.total() == 8  # round 2 not planned yet: at the 1 call per question planned so far
    rounds.plan("b", 0)  # every first answer was kept: no fallback call
    assert rounds.total() == 4


def test_seconds_left_is_the_planned_work_left_at_the_rate_so_far():
    assert seconds_left(0, 60, began=10.0, now=20.0) is None  # no call done: no rate yet
    assert seconds_left(15, 60, began=10.0, now=40.0) == 90.0  # 15 calls in 30 s: 45 left take 90 s
    assert seconds_left(60, 60, began=10.0, now=130.0) is None
    assert seconds_left(5, None, began=10.0, now=20.0) is None


def test_an_estimate_from_a_schedule_of_call_completions():
    """The calls of both cells' shards are in flight together (the model answers one at a time, 2 s each); the work
    begins when the first stage plans its calls (t = 10 s), the estimate is the planned calls left at the rate so far.
    The count of generate tasks says nothing: none ends before most calls are done."""
    now = [0.0]
    lines: list[str] = []
    plain = PlainProgress(lines.append, every_s=30, clock=lambda: now[0])
    progress.set_listener(plain)
    try:
        progress.set_total("generate", 4, timed=False)
        progress.forecast("generate calls", PARTS)
        now[0] = 10.0
        for part, calls in (("concat-1", 5), ("pf-1", 25), ("concat-2", 5), ("pf-2", 25)):
            progress.planned("generate calls", part, calls)
        for _ in range(60):
            now[0] += 2.0
            progress.advance("generate calls")
            if now[0] == 126.0:  # a shard's tasks end near the end
                progress.advance("generate", 2)
        progress.advance("generate", 2)
    finally:
        progress.set_listener(None)
    # time actually left at 40 s: 90 s; at 70 s: 60 s; at 100 s: 30 s
    assert lines == [
        "progress: generate calls 15/60, 30 s, ~90 s left",
        "progress: generate calls 30/60, 60 s, ~60 s left",
        "progress: generate calls 45/60, 90 s, ~30 s left",
        "progress: generate 2/4, 126 s",
        "progress: generate calls 60/60, 120 s (done)",
        "progress: generate 4/4, 130 s (done)",
    ]


def test_the_terminal_bars_show_the_same_estimate():
    import io

    from rich.console import Console
    from rich.progress import Progress, TextColumn

    from ragledger.cli_common import _Bars

    now = [0.0]
    with Progress(TextColumn("{task.fields[left]}"), console=Console(file=io.StringIO()), auto_refresh=False) as bars:
        listener = _Bars(bars)
        listener.clock = lambda: now[0]
        progress.set_listener(listener)
        try:
            progress.set_total("generate", 4, timed=False)
            progress.forecast("generate calls", PARTS)
            now[0] = 10.0
            for part, calls in (("concat-1", 5), ("pf-1", 25)):
                progress.planned("generate calls", part, calls)
            for _ in range(15):
                now[0] += 2.0
                progress.advance("generate calls")
            progress.advance("generate", 1)
        finally:
            progress.set_listener(None)
        shown = {t.description: (t.completed, t.total, t.fields["left"]) for t in bars.tasks}
    assert shown == {"generate": (1, 4, ""), "generate calls": (15, 60, "~90 s left")}


def test_calls_weighed_by_their_prompts_give_the_time_left_when_calls_differ():
    """Concatenation's 5 calls read five passages each (work 5 per call), Post-Fusion's 25 calls one each (work 1);
    the model reads 1 work unit in 2 s, one call at a time, Concatenation's first. At t = 60 s the five long calls are
    done: half of the work, in 50 s, so 50 s are left (exactly what is left). Counted in calls (5 of 30 done) the
    same moment would say 250 s."""
    now = [0.0]
    stages = Stages(clock=lambda: now[0])
    progress.set_listener(stages)
    try:
        progress.forecast("generate calls", {"concat": ("concat round 1", 5), "pf": ("pf round 1", 5)})
        now[0] = 10.0
        progress.planned("generate calls", "concat", 5, work=25.0)
        progress.planned("generate calls", "pf", 25, work=25.0)
        for _ in range(5):
            now[0] += 10.0
            progress.advance("generate calls", 1, work=5.0)
        state = stages.states["generate calls"]
        assert (state.done, state.total, now[0]) == (5, 30, 60.0)
        assert state.left(now[0]) == 50.0
        assert seconds_left(state.done, state.total, state.began, now[0]) == 250.0
        for _ in range(10):
            now[0] += 2.0
            progress.advance("generate calls", 1, work=1.0)
        assert state.left(now[0]) == 30.0  # 35 of 50 done in 70 s: 15 left take 30 s (15 calls of 2 s)
    finally:
        progress.set_listener(None)


def test_a_forecast_weighs_the_parts_still_to_plan_as_the_planned_ones_of_their_group():
    f = Forecast(PARTS)
    f.plan("concat-1", 5, work=5000.0)  # 5 calls of 1,000 characters
    f.plan("pf-1", 25, work=6250.0)  # 25 calls of 250
    assert (f.total(), f.work()) == (60, 22500.0)  # concat-2 and pf-2 as their group's first shard
    f.plan("pf-2", 25)  # no weight given: one per call
    assert f.work() == 5000.0 + 6250.0 + 5000.0 + 25.0


class Recording(Stages):
    """A listener that keeps every report it was given, in order."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: 0.0)
        self.reports: list[tuple] = []

    def total(self, stage, n, timed=True, begun=True):
        self.reports.append(("total", stage, n))
        return super().total(stage, n, timed, begun)

    def revise(self, stage, n, work=None):
        self.reports.append(("revise", stage, n, work))
        return super().revise(stage, n, work)

    def advance(self, stage, n, work=None):
        self.reports.append(("advance", stage, n, work))
        return super().advance(stage, n, work)


def test_a_task_elsewhere_relays_its_reports_and_the_runs_process_replays_them_as_if_made_there():
    """A task in a process with no listener (a Dask worker) reports inside `relayed`: each report reaches the run's
    process as a plain list and, replayed there, gives its listener what the same calls made there give. Two tasks on
    one worker relay each to its own run (a context variable, not a global)."""
    import threading

    def task_reports():
        progress.planned("generate calls", "a", 2, 300.0)
        progress.advance("generate calls", 1, 150.0)
        progress.advance("generate calls", 1, 150.0)
        progress.advance("retrieve questions", 4)

    relayed: dict[str, list] = {"run-1": [], "run-2": []}

    def worker_task(run: str) -> None:
        with progress.relayed(relayed[run].append):
            task_reports()

    threads = [threading.Thread(target=worker_task, args=(run,)) for run in relayed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    progress.advance("retrieve questions", 9)  # outside `relayed`, with no listener: nothing, nowhere
    assert relayed["run-1"] == relayed["run-2"] == [
        ["planned", "generate calls", "a", 2, 300.0], ["advance", "generate calls", 1, 150.0],
        ["advance", "generate calls", 1, 150.0], ["advance", "retrieve questions", 4, None]]

    def in_the_runs_process(reports_of_the_task) -> list[tuple]:
        listener = Recording()
        progress.set_listener(listener)
        try:
            progress.forecast("generate calls", {"a": ("cell", 2), "b": ("cell", 2)})
            reports_of_the_task()
        finally:
            progress.set_listener(None)
        return listener.reports

    direct = in_the_runs_process(task_reports)
    replayed = in_the_runs_process(lambda: [progress.replay(r) for r in relayed["run-1"]])
    assert replayed == direct == [
        ("total", "generate calls", 4), ("revise", "generate calls", 4, 600.0),
        ("advance", "generate calls", 1, 150.0), ("advance", "generate calls", 1, 150.0),
        ("advance", "retrieve questions", 4, None)]
