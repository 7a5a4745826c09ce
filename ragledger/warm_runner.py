"""Starting, finding and stopping the warm runner of a directory (ragledger/warm_start.py says what it is):
`ragledger server start`, `stop` and `status` (ragledger/cli_ops.py). Its state file lies beside the Prefect server's
(ragledger/prefect_server.py), so the runner a directory's `ragledger server start` started serves the commands run
there. Only the standard library at the top (and ragledger/prefect_env.py, no more): the `ragledger` command's entry
reads `state_file`."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from ragledger.prefect_env import default_prefect_home

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

    try:
        pid = int(json.loads(state_file().read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if pid_alive(pid) else None


def start(workdir: Path, log: Path) -> tuple[int, bool]:
    """Start (or find) the runner for `workdir`; (pid, started now). It outlives the command, in a session of its own."""
    import select
    import subprocess

    running = running_pid()
    if running is not None:
        return running, False
    path = state_file()
    address = address_for(workdir)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "ragledger.warm_start", address], stdout=subprocess.PIPE,
                                stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    assert proc.stdout is not None
    ready = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)[0] and proc.stdout.readline()
    if not ready or ready.strip() != b"ready":
        proc.kill()
        raise WarmRunnerError(f"the warm runner did not start (exit {proc.wait()}); its log: {log}")
    proc.stdout.close()
    path.write_text(json.dumps({"pid": proc.pid, "address": address, "log": str(log)}))
    return proc.pid, True


def stop() -> bool:
    """Stop this directory's runner; runs it started go on. False when none ran."""
    from core.processes import stop_process_group

    pid = running_pid()
    state_file().unlink(missing_ok=True)
    if pid is None:
        return False
    stop_process_group(pid, grace_s=5)
    return True
