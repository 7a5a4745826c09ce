"""The warm runner (ragledger/warm_start.py): `ragledger run` (or a command reading the store) in a directory whose
runner is up is run by a child the runner forks, with the command's stdio, directory, environment and arguments; it
stores and prints what the command's own process would, ends with its exit status, dies with the command, takes the
signals the command gets, and a command whose import setting differs from the runner's runs in its own process."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fakes.openai_server import ScriptedServer
from tests.test_direct_route import outcomes, recorder_api, waited_for  # noqa: F401  (a fixture)
from tests.test_flow_scripted import answer_from_context, make_spec, workspace  # noqa: F401  (a fixture)

RAGLEDGER = str(Path(sys.executable).parent / "ragledger")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def runner(workspace, recorder_api, monkeypatch):  # noqa: F811
    """The workspace's warm runner, as `ragledger server start` starts it there; stopped at the end."""
    from ragledger import warm_runner

    monkeypatch.setenv("PREFECT_HOME", str(workspace / "prefect"))
    monkeypatch.setenv("RAGLEDGER_INDEX_DIR", str(workspace / "indexes"))
    monkeypatch.delenv("RAGLEDGER_WARM")  # on, as in a user's shell (tests/conftest.py turns it off)
    (workspace / "prefect").mkdir()
    log = workspace / "prefect" / "ragledger-runner.log"
    pid, started = warm_runner.start(workspace, log)
    assert started and warm_runner.start(workspace, log) == (pid, False)  # found, not started twice
    yield log
    assert warm_runner.stop()
    waited_for(pid, timeout_s=20)


def spec_file(ws: Path, base_url: str, store: str) -> Path:
    spec = make_spec(ws, base_url, readers=("concatenation",))
    spec["tracking"]["store"] = str(ws / store)
    path = ws / f"{store}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def command(ws: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([RAGLEDGER, *args], cwd=ws, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=300)


def forked_pids(log: Path, args: str) -> list[int]:
    return [int(p) for p in re.findall(rf"pid (\d+): '{re.escape(args)}'", log.read_text())]


def test_a_run_through_the_runner_stores_and_prints_what_its_own_process_would(workspace, runner):  # noqa: F811
    with ScriptedServer(answer=answer_from_context) as server:
        spec_file(workspace, server.base_url, "warm")
        spec_file(workspace, server.base_url, "alone")
        warm = command(workspace, "run", "warm.yaml", "--json", "warm.json")
        alone = command(workspace, "run", "alone.yaml", "--json", "alone.json", env={"RAGLEDGER_WARM": "0"})
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert len(forked_pids(runner, "run warm.yaml --json warm.json")) == 1  # the runner ran it
    assert forked_pids(runner, "run alone.yaml --json alone.json") == []  # RAGLEDGER_WARM=0: its own process
    first, second = (json.loads((workspace / f).read_text()) for f in ("warm.json", "alone.json"))
    assert first["llm_calls"] == second["llm_calls"] > 0
    assert first["cells"] == second["cells"]
    assert outcomes(str(workspace / "warm")) == outcomes(str(workspace / "alone"))
    table = [line for line in warm.stdout.splitlines() if "bm25@2" in line]
    assert table == [line for line in alone.stdout.splitlines() if "bm25@2" in line] and table
    sql = "SELECT cell, count(*) AS n, sum(em) AS em FROM outcomes GROUP BY cell ORDER BY cell"
    read = [command(workspace, "query", sql, "--store", "warm", "--format", "csv", env={"RAGLEDGER_WARM": flag})
            for flag in ("1", "0")]  # a command reading the store: through the runner, then in its own process
    assert read[0].returncode == 0 and read[0].stdout == read[1].stdout and "bm25@2" in read[0].stdout, read[0].stderr
    assert len(forked_pids(runner, f"query {sql} --store warm --format csv")) == 1
    for summary in (first, second):  # the recorder each started, if the run took the direct route
        if summary.get("recorder_pid"):
            waited_for(summary["recorder_pid"])


def test_a_bad_spec_ends_with_one_error_line_and_its_status(workspace, runner):  # noqa: F811
    done = command(workspace, "run", "missing.yaml")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: missing.yaml: spec file not found"]
    assert len(forked_pids(runner, "run missing.yaml")) == 1
    assert not (workspace / ".ragledger" / "store").exists()


def test_the_runners_log_keeps_no_credentials_of_a_command_line(workspace, runner):  # noqa: F811
    done = command(workspace, "run", "missing.yaml", "--base-url", "http://lab:hunter2secret@127.0.0.1:9/v1")
    assert done.returncode == 2 and "hunter2secret" not in done.stderr
    log = runner.read_text()
    assert "--base-url http://***@127.0.0.1:9/v1" in log and "hunter2secret" not in log


def test_a_command_of_another_import_setting_runs_in_its_own_process(workspace, runner):  # noqa: F811
    threads = "3" if os.environ.get("OMP_NUM_THREADS") != "3" else "4"
    done = command(workspace, "run", "other.yaml", env={"OMP_NUM_THREADS": threads})
    assert done.returncode == 2 and "other.yaml: spec file not found" in done.stderr
    assert forked_pids(runner, "run other.yaml") == []
    assert "refused 'run other.yaml': its OMP_NUM_THREADS differ(s)" in runner.read_text()


def test_a_source_changed_after_the_runner_imported_it_runs_as_it_is_now(workspace, runner):  # noqa: F811
    """A preloaded module edited after the runner imported it (a researcher's edit, a package upgraded): the command
    runs in its own process, on the code as it is on disk, and the runner, running nothing, restarts to import it
    again, so a later command is forked from it. Only the file's modification time changes here."""
    import flows.cached

    path = Path(flows.cached.__file__)
    before = path.stat()
    try:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
        assert command(workspace, "run", "one.yaml").returncode == 2
        log = runner.read_text()
        assert f"refused 'run one.yaml': source changed since the runner imported it: {path}" in log
        assert "restarting to import the changed sources" in log
        deadline = time.monotonic() + 120
        while not forked_pids(runner, "run two.yaml"):  # on its own until the restarted runner listens
            assert time.monotonic() < deadline, runner.read_text()[-3000:]
            assert command(workspace, "run", "two.yaml").returncode == 2
            time.sleep(0.5)
    finally:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _started_run(ws: Path, runner: Path, server: ScriptedServer, args: str) -> tuple[subprocess.Popen, int]:
    spec_file(ws, server.base_url, "slow")
    proc = subprocess.Popen([RAGLEDGER, *args.split()], cwd=ws, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pids := forked_pids(runner, args)) or not server.requests:  # forked, and calling the model
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    return proc, pids[0]


def test_a_killed_command_takes_its_run_with_it(workspace, runner):  # noqa: F811
    with ScriptedServer(answer=answer_from_context, delay_s=10) as server:
        proc, child = _started_run(workspace, runner, server, "run slow.yaml")
        proc.kill()
        proc.wait()
        waited_for(child, timeout_s=10)


def test_ctrl_c_reaches_the_run_and_its_status_the_command(workspace, runner):  # noqa: F811
    with ScriptedServer(answer=answer_from_context, delay_s=10) as server:
        proc, child = _started_run(workspace, runner, server, "run slow.yaml --store interrupted")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        _, err = proc.communicate()
    waited_for(child, timeout_s=10)
    assert code != 0 and "Traceback" not in err, err[-3000:]


def test_a_run_that_found_no_runner_starts_one_that_serves_the_next_commands_and_leaves_when_idle(
        workspace, recorder_api, monkeypatch):  # noqa: F811
    """No `ragledger server start`: the first run runs in its own process and, ending, starts the directory's
    runner; the next commands are forked from it, each taking the command's umask (the store's files say it); idle
    for RAGLEDGER_WARM_IDLE_MINUTES, it leaves and takes its state file with it."""
    from ragledger import warm_runner

    monkeypatch.setenv("PREFECT_HOME", str(workspace / "prefect"))
    monkeypatch.setenv("RAGLEDGER_INDEX_DIR", str(workspace / "indexes"))
    monkeypatch.setenv("RAGLEDGER_WARM_IDLE_MINUTES", "0.25")
    monkeypatch.delenv("RAGLEDGER_WARM")
    monkeypatch.chdir(workspace)
    log = workspace / "prefect" / "ragledger-runner.log"
    with ScriptedServer(answer=answer_from_context) as server:
        spec_file(workspace, server.base_url, "first")
        spec_file(workspace, server.base_url, "private")
        first = command(workspace, "run", "first.yaml")
        assert first.returncode == 0, first.stderr[-3000:]
        deadline = time.monotonic() + 60
        while (pid := warm_runner.running_pid()) is None:  # started as the first run ended
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no runner log"
            time.sleep(0.2)
        private = subprocess.run(["sh", "-c", f"umask 077 && exec {RAGLEDGER} run private.yaml"], cwd=workspace,
                                 capture_output=True, text=True, timeout=300)
    assert private.returncode == 0, private.stderr[-3000:]
    assert forked_pids(log, "run first.yaml") == [] and len(forked_pids(log, "run private.yaml")) == 1
    stored = [f for f in (workspace / "private").rglob("*") if f.is_file()]
    assert stored and {f.stat().st_mode & 0o077 for f in stored} == {0}  # the command's umask, not the runner's
    assert {f.stat().st_mode & 0o044 for f in (workspace / "first").rglob("*") if f.is_file()} == {0o044}
    waited_for(pid, timeout_s=120)  # idle for 15 s once the second command ended
    assert warm_runner.running_pid() is None and not warm_runner.state_file().exists()
    assert "idle for 0.25 min: leaving" in log.read_text()


def test_server_start_replaces_a_runner_a_run_started_with_one_that_stays(workspace, monkeypatch):  # noqa: F811
    """`ragledger server start` finds the runner a run started (which would leave when idle) and puts one in its
    place that stays until `ragledger server stop`."""
    from ragledger import warm_runner

    monkeypatch.setenv("PREFECT_HOME", str(workspace / "prefect"))
    (workspace / "prefect").mkdir()
    monkeypatch.chdir(workspace)
    warm_runner.start_in_background(workspace, dict(os.environ))
    deadline = time.monotonic() + 60
    while (idle := warm_runner.running_pid()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert json.loads(warm_runner.state_file().read_text())["idle_minutes"] == 20.0
    pid, started = warm_runner.start(workspace, workspace / "prefect" / "ragledger-runner.log")
    try:
        assert started and pid != idle
        waited_for(idle, timeout_s=20)
        assert json.loads(warm_runner.state_file().read_text()) | {"log": None} == {
            "pid": pid, "address": warm_runner.address_for(workspace), "log": None, "idle_minutes": None}
    finally:
        assert warm_runner.stop()
    waited_for(pid, timeout_s=20)


def test_a_command_whose_limits_a_forked_child_could_not_take_runs_in_its_own_process(monkeypatch):
    """Not root, a child of the runner can raise its nice value and lower a hard limit, never the reverse: such a
    command runs alone (ragledger/warm_start.py `_unreachable`)."""
    import resource

    from ragledger import warm_start

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    mine = warm_start._process_setting()
    assert warm_start._unreachable(mine) is None
    assert warm_start._unreachable({**mine, "nice": mine["nice"] + 5}) is None
    assert warm_start._unreachable({**mine, "nice": mine["nice"] - 1}) == "nice value"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = {**mine, "rlimits": {**mine["rlimits"], "RLIMIT_NOFILE": [min(soft, 64), min(hard, 64)]}}
    assert warm_start._unreachable(lower) is None
    if hard != resource.RLIM_INFINITY:
        higher = {**mine, "rlimits": {**mine["rlimits"], "RLIMIT_NOFILE": [soft, resource.RLIM_INFINITY]}}
        assert warm_start._unreachable(higher) == "hard limit(s) RLIMIT_NOFILE"
    assert warm_start._unreachable(None) == "process setting"


def _reads_environment(node: ast.AST, source: str) -> bool:
    text = ast.get_source_segment(source, node) or ""
    return any(word in text for word in ("environ", "getenv", "home()", "cwd()", "isatty", "get_terminal_size"))


def test_what_the_runner_imports_of_ragledger_reads_no_environment_when_imported():
    """A preloaded module of ragledger's (and every module of ragledger's it imports) reads the environment, the
    working directory and the terminal only inside functions: the runner's children run in other directories and
    environments. The check is real: ragledger/cli_common.py, which sizes its consoles when imported, is caught."""
    script = ("import importlib, json, sys\nfrom ragledger.warm_start import PRELOADED\n"
              "[importlib.import_module(m) for m in PRELOADED]\n"
              "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))")
    files = json.loads(subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, check=True,
                                      cwd="/").stdout.strip().splitlines()[-1])
    ours = [Path(f) for f in files if f.startswith(str(REPO)) and "/.venv/" not in f]
    assert ours and not any(p.name == "cli_common.py" for p in ours)

    def import_time_readers(path: Path) -> list[int]:
        source = path.read_text()
        found = []
        for node in ast.walk(ast.parse(source)):
            body = node.body if isinstance(node, ast.Module | ast.ClassDef) else []
            found += [s.lineno for s in body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef |
                                                                   ast.ClassDef) and _reads_environment(s, source)
                      and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # a docstring
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [d.lineno for d in node.args.defaults + [k for k in node.args.kw_defaults if k]
                          if _reads_environment(d, source)]
        return found

    assert {str(p): lines for p in ours if (lines := import_time_readers(p))} == {}
    assert import_time_readers(REPO / "ragledger" / "cli_common.py")
