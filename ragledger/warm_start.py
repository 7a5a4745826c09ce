"""The `ragledger` command's entry, and the warm runner of a directory: started by a `ragledger run` that found none,
as it ends (leaving once idle), or by `ragledger server start` beside the Prefect server (ragledger/warm_runner.py).

A `ragledger run` imports pandas, pyarrow, pandera, pydantic, typer, rich and its stage modules (~1.5 CPU-seconds on
a 2.4 GHz core) while its JVM and first model-call process start, and on two cores the three share the CPU; a
command reading the store waits for the same imports (docs/performance.md, "The fixed cost of a small run"). The warm
runner is a process that made them once and then waits on a Unix socket: each `ragledger run`, or command reading the
store (`_WARM_COMMANDS`), started in its directory hands it the command line, the working directory, the environment
and its own stdin, stdout and stderr, and the runner forks a child with those; the child runs the command exactly as
the command's own process would (ragledger/cli.py `main`), and its exit status comes back as the command's. The
command forwards the signals it gets (Ctrl-C, SIGTERM, SIGHUP) to the child; if the command itself dies (kill -9),
the child is killed too, so the run ends as a killed run ends (the store is safe against that: docs/concepts.md).

A command uses the runner only when the runner would import what the command itself would: the same interpreter,
the same import path and the same import-time settings (`_IMPORT_TIME_ENV`), with no module the runner imported
changed on disk since (`_source_stamps`; the runner then restarts once it runs nothing). Otherwise, or when no runner
answers, it runs in its own process. `RAGLEDGER_WARM=0` turns it off for one command.

Only the process's owner may connect (the peer's uid is checked), the socket is in the abstract namespace (no
file to go stale), and the runner forks from a single Python thread: nothing it imports starts one (the native
threads of numpy's OpenBLAS and pyarrow's jemalloc are their libraries' own, which prepare for a fork; scipy, with an
OpenBLAS of its own, is left to the child). A child takes the command's umask, nice value, CPU affinity and
resource limits; a command whose nice value or hard limits a child could not take runs alone (`_unreachable`).

This module's top imports only the standard library (and ragledger/warm_runner.py, which imports no more): it is the
entry of every `ragledger` command."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import Any, NoReturn

from ragledger import warm_runner

# what the runner imports before it forks: what every run imports and no run needs fresh. None of them reads the
# environment, the working directory or the terminal when imported (tests/test_warm_start.py holds ragledger's own
# to that), except what _IMPORT_TIME_ENV names; not ragledger/cli_common.py, which sizes its consoles from the
# terminal, nor Prefect, whose settings are read from the environment when it is imported.
PRELOADED = ("numpy", "pandas", "pyarrow", "pyarrow.parquet", "pandera.pandas", "pydantic", "yaml", "typer",
             "rich.console", "rich.progress", "rich.table",
             "schemas.spec", "schemas.records", "tracking.store.events", "tasks.stages", "flows.launch", "flows.direct",
             "flows.head_start", "flows.prepare", "flows.plan", "flows.executor", "flows.recording", "flows.cached",
             "ragledger.running", "ragledger.locations",
             "duckdb", "tracking.store.ledger", "tracking.analysis.examples", "tracking.analysis.history",
             "tracking.analysis.across")
# environment variables that the preloaded modules read when imported: a command whose values differ runs alone
_IMPORT_TIME_ENV = ("PYTHON", "OMP_", "OPENBLAS_", "MKL_", "NUMEXPR_", "ARROW_", "PANDERA_", "LANG", "LC_")
# `run` and the commands that read the store; not those that serve (ui, schedule, server) or run a Prefect flow
_WARM_COMMANDS = {"run", "query", "errors", "flips", "hardest", "across", "trace", "history", "leaderboard", "diff"}
_MAX_MESSAGE = 1 << 20
_NO_RUNNER, _REFUSED = "no runner answered", "refused by the runner"


def main() -> None:
    """The `ragledger` command (pyproject.toml [project.scripts]): through this directory's warm runner when one
    answers and may run it, in this process otherwise. A `ragledger run` that found no runner starts one as it ends,
    for the commands after it (it leaves once idle: ragledger/warm_runner.py `start_in_background`)."""
    alone = None
    if len(sys.argv) > 1 and sys.argv[1] in _WARM_COMMANDS and os.environ.get("RAGLEDGER_WARM", "1") != "0":
        alone = _through_runner()
        if isinstance(alone, int):
            sys.exit(alone)
    from ragledger.cli import main as cli_main

    if alone != _NO_RUNNER or sys.argv[1] != "run":
        cli_main()
        return
    shell_env = dict(os.environ)  # the runner's, not what the run sets in its own (its Prefect home, its log)
    try:
        cli_main()
    except SystemExit as exc:
        from ragledger.cli import exit_status

        if exit_status(exc) == 0:
            warm_runner.start_in_background(Path.cwd(), shell_env)
        raise
    warm_runner.start_in_background(Path.cwd(), shell_env)


# --- the command's side -------------------------------------------------------------------------------------------

def _import_setting(path: list[str]) -> dict[str, Any]:
    """What decides what an import finds and does: a command whose setting differs from the runner's runs alone.
    `path`: the import path without the command's own first entry (its script's folder; the runner has none: -P)."""
    env = {k: v for k, v in os.environ.items() if k.startswith(_IMPORT_TIME_ENV)}
    return {"executable": sys.executable, "path": [p for p in path if p], "env": env}


def _through_runner() -> int | str:
    """The command's exit status, run by the warm runner; otherwise why this process runs it: _NO_RUNNER, or
    _REFUSED (the runner's interpreter, import setting or process limits are not the command's)."""
    try:
        address = warm_runner.state()["address"]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(b"\0" + address.encode())
    except (OSError, KeyError, AttributeError):
        return _NO_RUNNER
    with sock:
        message = {"argv": sys.argv, "cwd": os.getcwd(), "environ": dict(os.environ), "path": sys.path,
                   "setting": _import_setting(sys.path[1:]), "process": _process_setting()}
        try:
            socket.send_fds(sock, [json.dumps(message).encode() + b"\n"], [0, 1, 2])
            lines = _lines(sock)
            first = next(lines, None)
        except OSError:
            return _NO_RUNNER
        if first is None:
            return _NO_RUNNER  # it left as it was reached (idle, or stopped)
        if "pid" not in first:
            return _REFUSED
        return _wait_for(first["pid"], lines)


def _process_setting() -> dict[str, Any]:
    """What a process takes from its parent besides its environment and directory: a child forked by the runner
    takes the command's (`_take_process_setting`), or the command runs alone where it cannot (`_unreachable`)."""
    import resource

    mask = os.umask(0o022)
    os.umask(mask)
    limits = {name: list(resource.getrlimit(getattr(resource, name))) for name in dir(resource)
              if name.startswith("RLIMIT_")}
    return {"umask": mask, "nice": os.getpriority(os.PRIO_PROCESS, 0), "affinity": sorted(os.sched_getaffinity(0)),
            "rlimits": limits}


def _wait_for(pid: int, lines: Any) -> int:
    """Forward the signals a command's own process would get to the child, until the runner says how it ended."""
    def forward(signum: int, _frame: Any) -> None:  # to the child's group, as a terminal's Ctrl-C reaches a process's
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)
    answer = next(lines, None)  # a signal handled meanwhile does not end the wait (PEP 475)
    if answer is None or "status" not in answer:
        sys.stderr.write(f"error: the run's process ({pid}) ended without an exit status: its warm runner stopped "
                         "(`ragledger server start` starts it again)\n")
        return 1
    status = int(answer["status"])
    return 128 - status if status < 0 else status  # killed by signal N: 128+N, as a shell says


def _lines(sock: socket.socket) -> Any:
    buffer = b""
    while True:
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)
        chunk = sock.recv(65536)
        if not chunk:
            return
        buffer += chunk


# --- the runner's side --------------------------------------------------------------------------------------------

def serve(address: str, idle_minutes: float | None = None) -> NoReturn:
    """Claim `address` (a runner holding it already: leave), import PRELOADED, and fork a child for each command
    until SIGTERM, or until idle for `idle_minutes` (no command under way or arriving)."""
    import selectors
    import time

    listener = _claimed(address, idle_minutes)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # running children are in groups of their own: they go on
    _warmed()
    sources = _source_stamps()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.dup2(2, 1)  # the starting command stops reading: from now on stdout goes to the log, as stderr does
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the command's connection)
    setting = _import_setting(sys.path)
    idle_s, last_seen = (None if idle_minutes is None else idle_minutes * 60), time.monotonic()
    while True:
        wait = None if idle_s is None or running else max(idle_s - (time.monotonic() - last_seen), 0.0)
        events = selector.select(wait)
        if not events and not running and wait is not None and time.monotonic() - last_seen >= idle_s:
            warm_runner.forget_state()
            _log(f"idle for {idle_minutes:g} min: leaving")
            os._exit(0)
        last_seen = time.monotonic()
        for key, _ in events:
            if key.fileobj is listener:
                _answer(listener, selector, running, setting, sources, address, idle_minutes)
            else:
                _reap(key.fileobj, selector, running)


def _claimed(address: str, idle_minutes: float | None) -> socket.socket:
    """The listening socket at `address`, before the imports: a command arriving meanwhile waits for them rather
    than making its own, and a second runner started for the directory leaves at once."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(b"\0" + address.encode())
    except OSError:  # EADDRINUSE: this directory's runner runs already
        os._exit(0)
    listener.listen(16)
    warm_runner.write_state(address, os.readlink("/proc/self/fd/2"), idle_minutes)
    return listener


def _warmed() -> None:
    import gc
    import importlib
    import threading

    for name in PRELOADED:
        importlib.import_module(name)
    gc.freeze()  # what the imports made is never collected: a child's collections neither walk nor copy its pages
    if threading.active_count() != 1:  # a fork copies only the forking thread: another's locks would stay held
        raise SystemExit(f"the warm runner's imports started threads: {[t.name for t in threading.enumerate()]}")


def _answer(listener: socket.socket, selector: Any, running: dict[int, tuple[int, socket.socket]],
            setting: dict[str, Any], sources: dict[str, tuple[int, int]], address: str,
            idle_minutes: float | None) -> None:
    """Take one command: fork its child, or refuse it (and restart, idle, to import changed sources)."""
    import selectors

    conn, _ = listener.accept()
    received = _received(conn)
    why = "unreadable" if received is None else _refusal(received[0], setting, sources)
    if received is not None and why is None:
        child = _forked(conn, *received, listener, selector, running)
        pidfd = os.pidfd_open(child)
        running[pidfd] = (child, conn)
        selector.register(pidfd, selectors.EVENT_READ)
        return
    _refuse(conn, received, why)
    if why.startswith("source") and not running:  # the next command finds the code as it is now
        _log("restarting to import the changed sources")
        os.execv(sys.executable, warm_runner.runner_command(address, idle_minutes))


def _reap(pidfd: Any, selector: Any, running: dict[int, tuple[int, socket.socket]]) -> None:
    """A child ended: its exit status to its command."""
    assert isinstance(pidfd, int)
    selector.unregister(pidfd)
    pid, conn = running.pop(pidfd)
    os.close(pidfd)
    _, wait_status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}).encode() + b"\n")
    conn.close()


def _source_stamps() -> dict[str, tuple[int, int]]:
    """Every imported module's file with its modification time and size: a child must not run code older than
    what is on disk (a researcher's edit to a reader, a package upgraded)."""
    stamps = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                stamps[path] = (st.st_mtime_ns, st.st_size)
    return stamps


def _changed_source(stamps: dict[str, tuple[int, int]]) -> str | None:
    for path, stamp in stamps.items():
        try:
            st = os.stat(path)
        except OSError:
            return path
        if (st.st_mtime_ns, st.st_size) != stamp:
            return path
    return None


def _received(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """A command's message and its stdin, stdout and stderr; None for a peer of another user or a broken message."""
    fds: list[int] = []
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            return None
        conn.settimeout(10)
        data, fds, _flags, _ = socket.recv_fds(conn, _MAX_MESSAGE, 3)
        while not data.endswith(b"\n") and len(data) < _MAX_MESSAGE:
            chunk = conn.recv(_MAX_MESSAGE)
            if not chunk:
                break
            data += chunk
        message = json.loads(data)
        if len(fds) == 3 and isinstance(message, dict):
            return message, fds
    except (OSError, ValueError):
        pass
    for fd in fds:
        os.close(fd)
    return None


def _refusal(message: dict[str, Any], setting: dict[str, Any], sources: dict[str, tuple[int, int]]) -> str | None:
    """Why this runner must not run the command, or None."""
    if message.get("setting") != setting:
        return f"its {_differences(message.get('setting'), setting)} differ(s) from the runner's"
    unreachable = _unreachable(message.get("process"))
    if unreachable:
        return f"a child of the runner cannot take its {unreachable}"
    changed = _changed_source(sources)
    return None if changed is None else f"source changed since the runner imported it: {changed}"


def _unreachable(process: Any) -> str | None:
    """What of a command's process setting a forked child could not take: a nice value below the runner's, a hard
    resource limit above it (neither may be changed so by a process that is not root's)."""
    import resource

    if not isinstance(process, dict) or not isinstance(process.get("rlimits"), dict):
        return "process setting"
    if os.geteuid() == 0:
        return None
    if process.get("nice", 0) < os.getpriority(os.PRIO_PROCESS, 0):
        return "nice value"
    def above(a: int, b: int) -> bool:  # RLIM_INFINITY (-1) above all
        return a != b and (a == resource.RLIM_INFINITY or (b != resource.RLIM_INFINITY and a > b))
    higher = [name for name, (_, hard) in process["rlimits"].items()
              if hasattr(resource, name) and above(hard, resource.getrlimit(getattr(resource, name))[1])]
    return f"hard limit(s) {', '.join(sorted(higher))}" if higher else None


def _take_process_setting(process: dict[str, Any]) -> None:
    """The command's umask, nice value, CPU affinity and resource limits, for this child (`_unreachable` held)."""
    import resource

    os.umask(process["umask"])
    if process["nice"] != os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, process["nice"])
    with contextlib.suppress(OSError):  # CPUs outside the runner's cgroup: the runner's
        os.sched_setaffinity(0, process["affinity"])
    for name, limits in process["rlimits"].items():
        which = getattr(resource, name, None)
        if which is not None and resource.getrlimit(which) != tuple(limits):
            resource.setrlimit(which, tuple(limits))


def _refuse(conn: socket.socket, received: tuple[dict[str, Any], list[int]] | None, why: str) -> None:
    """The command runs in its own process."""
    if received is not None:
        message, fds = received
        for fd in fds:
            os.close(fd)
        _log(f"refused {' '.join(message.get('argv', [])[1:])!r}: {why}")
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"refused": why}).encode() + b"\n")
    conn.close()


def _forked(conn: socket.socket, message: dict[str, Any], fds: list[int], listener: socket.socket, selector: Any,
            running: dict[int, tuple[int, socket.socket]]) -> int:
    """The child's pid: it runs the command (and never returns here)."""
    pid = os.fork()
    if pid == 0:
        selector.close()
        listener.close()
        for pidfd, (_, other) in running.items():
            os.close(pidfd)
            other.close()
        _run_child(conn, fds, message)
    for fd in fds:
        os.close(fd)
    _log(f"pid {pid}: {' '.join(message['argv'][1:])!r} in {message['cwd']}")
    conn.settimeout(None)
    try:
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except OSError:  # the command is gone already: its child must not run on
        os.kill(pid, signal.SIGKILL)
    return pid


def _differences(given: Any, setting: dict[str, Any]) -> str:
    """What of a command's import setting differs from the runner's, by name (never the values: they may be paths)."""
    if not isinstance(given, dict):
        return "setting"
    names = [k for k in ("executable", "path") if given.get(k) != setting[k]]
    env, ours = given.get("env") or {}, setting["env"]
    names += sorted(k for k in {*env, *ours} if env.get(k) != ours.get(k))
    return ", ".join(names) or "stdio"


def _log(line: str) -> None:
    """A line of the runner's log; a URL's credentials in a command line (refused by the command itself) stay out."""
    import time

    from core.secrets import redact_url

    sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {redact_url(line)}\n")
    sys.stderr.flush()


def _run_child(conn: socket.socket, fds: list[int], message: dict[str, Any]) -> NoReturn:
    """Become the command: its stdio, directory, environment, import path and arguments, then ragledger/cli.py's
    `main`. Never returns to the runner's loop."""
    status = 1
    try:
        os.setpgid(0, 0)  # `ragledger server stop` stops the runner's group, not the runs it started
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for name in ("SIGTERM", "SIGHUP", "SIGQUIT"):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _take_process_setting(message["process"])
        os.chdir(message["cwd"])
        os.environ.clear()
        os.environ.update(message["environ"])
        sys.path[:] = message["path"]
        sys.argv = message["argv"]
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr)  # type: ignore[union-attr]
        _die_with(conn)
        from ragledger.cli import exit_status
        from ragledger.cli import main as cli_main

        try:
            cli_main()
            status = 0
        except SystemExit as exc:
            status = exit_status(exc)
        _exit_as_a_process_would()
    except BaseException:  # whatever happens, this process must not return into the runner's loop
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _die_with(conn: socket.socket) -> None:
    """Kill this child when its command's connection closes: the command was killed (its own exit waits for the
    runner's word that this child ended)."""
    import threading

    conn.settimeout(None)  # the runner's receiving timeout came with the fork

    def watch() -> None:
        with contextlib.suppress(OSError):  # a reset: gone as well
            while conn.recv(1):
                pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="ragledger-command-watch", daemon=True).start()


def _exit_as_a_process_would() -> None:
    """What the interpreter does at exit before its teardown: join the non-daemon threads, then the atexit
    handlers (ragledger/cli.py's last one ends the process with the command's status)."""
    import atexit
    import threading

    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()


if __name__ == "__main__":  # ragledger/warm_runner.py runner_command
    serve(sys.argv[1], float(sys.argv[3]) if sys.argv[2:3] == ["--idle-minutes"] else None)
