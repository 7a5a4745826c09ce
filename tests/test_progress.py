"""Plain progress lines for long runs whose output goes to a file (no terminal for progress bars)."""

from core.progress import PlainProgress


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
