"""Starting, finding and stopping the warm runner of a directory (ragledger/warm_start.py says what it is):
`ragledger server start`, `stop` and `status` (ragledger/cli_ops.py), and a `ragledger run` that found none
(`start_in_background`). Its state file lies beside the Prefect server's (ragledger/prefect_server.py), so the
runner of a directory serves the commands run there; the runner writes it once it holds its address.
Only the standard library at the top (and ragledger/prefect_env.py, no more): the `ragledger` command's entry reads
`state_file`."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ragledger.prefect_env import default_prefect_home

if TYPE_CHECKING:
    import subprocess

_STATE_FILE = "ragledger-runner.json"
STARTUP_TIMEOUT_S = 120.0


def state_file() -> Path:
    """Where this directory's runner is described: beside the Prefect server's own state file
    (ragledger/prefect_server.py), so `ragledger server start` in a directory serves the commands run there."""
    home = os.environ.get("PREFECT_HOME") or default_prefect_home(Path.cwd())
    return Path(home) / _STATE_FILE


def address_for(workdir: Path) -> str:
    """The name of an abstract socket (bound with a leading NUL), one per user, directory and interpreter."""
    key = f"{os.getuid()}:{workdir.resolve()}:{sys.executable}"
    return "ragledger-runner-" + hashlib.sha256(key.encode()).hexdigest()[:24]


class WarmRunnerError(RuntimeError):
    pass


def running_pid() -> int | None:
    """The pid of this directory's runner, if it runs."""
    from core.processes import pid_alive

    pid = _state_pid()
    return pid if pid is not None and pid_alive(pid) else None


def _state_pid() -> int | None:
    try:
        return int(state()["pid"])
    except (KeyError, ValueError, TypeError):
        return None


def state() -> dict:
    """What the runner wrote of itself (`write_state`); empty when there is none or it cannot be read."""
    try:
        state = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def start(workdir: Path, log: Path) -> tuple[int, bool]:
    """Start (or find) the runner for `workdir`; (pid, started now). It outlives the command, in a session of its own,
    and runs until `stop`."""
    import select

    running = running_pid()
    if running is not None and state().get("idle_minutes") is None:
        return running, False
    if running is not None:  # one a run started, which would leave when idle: this one stays until `stop`
        stop()
    proc = _spawned(workdir, log, idle_minutes=None, stdout=True)
    assert proc.stdout is not None
    ready = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)[0] and proc.stdout.readline()
    if not ready or ready.strip() != b"ready":
        proc.kill()
        status = proc.wait()
        found = running_pid()  # another command's runner took the address a moment before: this one left
        if found is not None:
            return found, False
        raise WarmRunnerError(f"the warm runner did not start (exit {status}); its log: {log}")
    proc.stdout.close()
    return proc.pid, True


def start_in_background(workdir: Path, env: dict[str, str]) -> None:
    """Start a runner for `workdir` that stops once idle for RAGLEDGER_WARM_IDLE_MINUTES (default 20), without
    waiting for it: what a `ragledger run` that found none does as it ends, for the commands after it, in `env` (the
    command's as it started). Nothing when the directory has no Prefect home (the run kept its state elsewhere, or
    failed before it made one)."""
    home = state_file().parent
    if home.is_dir():
        _spawned(workdir, home / "ragledger-runner.log", idle_minutes=idle_minutes(), stdout=False, env=env)


def idle_minutes() -> float:
    value = os.environ.get("RAGLEDGER_WARM_IDLE_MINUTES", "20")
    try:
        return max(float(value), 0.0)
    except ValueError:
        return 20.0


def _spawned(workdir: Path, log: Path, idle_minutes: float | None, stdout: bool,
             env: dict[str, str] | None = None) -> subprocess.Popen:
    """A runner process for `workdir`: it claims the directory's address (a second one leaves at once), writes the
    state file, imports, says "ready" and serves (ragledger/warm_start.py `serve`)."""
    import subprocess

    with open(log, "ab") as out:
        return subprocess.Popen(runner_command(address_for(workdir), idle_minutes),
                                stdout=subprocess.PIPE if stdout else subprocess.DEVNULL, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)


def runner_command(address: str, idle_minutes: float | None) -> list[str]:
    """The runner's command line (ragledger/warm_start.py reads it back as it starts, and re-execs it)."""
    idle = [] if idle_minutes is None else ["--idle-minutes", str(idle_minutes)]
    return [sys.executable, "-P", "-m", "ragledger.warm_start", address, *idle]


def write_state(address: str, log: str, idle_minutes: float | None) -> None:
    """Said by the runner itself once it holds its address."""
    path = state_file()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"pid": os.getpid(), "address": address, "log": log, "idle_minutes": idle_minutes}))
    tmp.replace(path)


def forget_state() -> None:
    """Said by an idle runner as it leaves: the state file goes, unless it names another runner by now."""
    if _state_pid() == os.getpid():
        state_file().unlink(missing_ok=True)


def stop() -> bool:
    """Stop this directory's runner; runs it started go on. False when none ran."""
    from core.processes import stop_process_group

    pid = running_pid()
    state_file().unlink(missing_ok=True)
    if pid is None:
        return False
    stop_process_group(pid, grace_s=5)
    return True
