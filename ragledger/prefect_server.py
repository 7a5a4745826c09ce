"""Which Prefect API a ragledger command talks to, and the local servers ragledger starts for it.

Order of choice:
1. `PREFECT_API_URL` from the environment (a lab's own Prefect server);
2. the persistent local server of this workdir, if `ragledger server start` started one and it answers
   (it runs Prefect's services, so schedules fire, and it keeps every flow run for `ragledger runs`);
3. a temporary server for this one command: the same Prefect API app, on a free 127.0.0.1 port, on the
   shared SQLite database under PREFECT_HOME.

ragledger starts the temporary server itself instead of letting Prefect start its "ephemeral" one because
(a) it dies with the command, even on SIGKILL (Linux parent-death signal), so a killed run leaves no
orphan; (b) its URL goes into the environment, so Dask worker processes report to the same API; and
(c) its start-up timeout is ours: four experiments starting at once on 2 cores take longer than
Prefect's 20 s default.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from core.exposure import basic_auth_header, local_address, port_in_use, require_credentials
from core.processes import die_with_parent, pid_alive, stop_child, stop_process_group

STARTUP_TIMEOUT_S = float(os.environ.get("RAGLEDGER_PREFECT_STARTUP_TIMEOUT", "300"))


class PrefectServerError(RuntimeError):
    pass


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", Path.home() / ".prefect"))


def _state_file() -> Path:
    return prefect_home() / "ragledger-server.json"


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


SERVER_AUTH = "PREFECT_SERVER_API_AUTH_STRING"  # the server's user:password (Prefect's own setting)
CLIENT_AUTH = "PREFECT_API_AUTH_STRING"  # what a client sends (Prefect's own setting, read by its client too)
ACCESS_TIMEOUT_S = 10.0


def check_access(api_url: str, timeout: float = ACCESS_TIMEOUT_S) -> None:
    """Raise PrefectServerError, in bounded time, when the Prefect API at `api_url` does not answer or refuses this
    process's credentials (PREFECT_API_AUTH_STRING). /health answers everyone, so an authenticated route is asked.
    Called once per command, before it uses an API it did not start (ragledger/running.py check_services, `runs`,
    `schedule`)."""
    import urllib.error

    request = urllib.request.Request(f"{api_url.rstrip('/')}/admin/version")
    if os.environ.get(CLIENT_AUTH):
        request.add_header("Authorization", basic_auth_header(os.environ[CLIENT_AUTH]))
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            given = "refused the credentials in" if os.environ.get(CLIENT_AUTH) else "requires credentials: set"
            raise PrefectServerError(f"the Prefect API at {api_url} {given} {CLIENT_AUTH} (user:password, "
                                     f"as the server's {SERVER_AUTH})") from None
        raise PrefectServerError(f"the Prefect API at {api_url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise PrefectServerError(f"the Prefect API at {api_url} does not answer "
                                 f"({getattr(exc, 'reason', exc)}) within {timeout:.0f} s") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(api_url: str, proc: subprocess.Popen, log: Path | None) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if healthy(api_url):
            return
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise PrefectServerError(f"the Prefect API server exited with code {proc.returncode} while starting\n{tail}")
        time.sleep(0.25)
    proc.terminate()
    raise PrefectServerError(f"the Prefect API server did not answer at {api_url} within {STARTUP_TIMEOUT_S:.0f} s "
                             "(raise RAGLEDGER_PREFECT_STARTUP_TIMEOUT on a loaded machine)")


def _server_env(ephemeral: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update({"PREFECT_UI_ENABLED": "0" if ephemeral else env.get("PREFECT_UI_ENABLED", "1"),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"})
    if ephemeral:  # no scheduler/loop services: the command's own flow run is all this server serves
        env.pop(SERVER_AUTH, None)  # loopback only, and its one client is this command: no auth string to agree on
        env["PREFECT__SERVER_EPHEMERAL"] = "1"
        # nor block-type registration: a run saves no block, and checking whether the registry changed imports
        # every installed Prefect collection (prefect-dask: dask.distributed), a second of the server's start-up
        # that the flow waits for. `ragledger server` (persistent, with the UI) registers them
        env["PREFECT_SERVER_REGISTER_BLOCKS_ON_START"] = "false"
        env["PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION"] = "false"
    return env


def persistent_server_url() -> str | None:
    """The URL of this workdir's `ragledger server`, if it is running and answers."""
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return None
    if pid_alive(int(state.get("pid", 0))) and healthy(state["api_url"]):
        return state["api_url"]
    return None


def start_persistent_server(port: int = 4200, host: str = "127.0.0.1") -> tuple[str, bool]:
    """Start (or find) the long-running local server, bound to `host`. Returns (api_url, started_now). Beyond
    loopback it must require an auth string (core/exposure.py)."""
    require_credentials("the Prefect server", host, bool(os.environ.get(SERVER_AUTH)),
                        f"{SERVER_AUTH}=user:password (clients then set {CLIENT_AUTH} to the same)")
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "ragledger-startup.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two commands starting it at once: one starts, the other finds it
        url = persistent_server_url()
        if url:
            return url, False
        if port_in_use(host, port):
            raise PrefectServerError(f"--port {port}: {host}:{port} is in use by another process; choose another port")
        log = home / "ragledger-server.log"
        api_url = f"http://{local_address(host)}:{port}/api"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
                env=_server_env(ephemeral=False), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)  # outlives this command, by design
        _wait_healthy(api_url, proc, log)
        _state_file().write_text(json.dumps({"pid": proc.pid, "api_url": api_url, "log": str(log)}))
        return api_url, True


def stop_persistent_server() -> bool:
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return False
    pid = int(state.get("pid", 0))
    stopped = False
    if pid and pid_alive(pid):
        stop_process_group(pid, grace_s=20)
        stopped = True
    _state_file().unlink(missing_ok=True)
    return stopped


@contextlib.contextmanager
def temporary_server(meanwhile: Callable[[], None] | None = None) -> Iterator[str]:
    """A Prefect API for the duration of one command; it dies with the command. `meanwhile` runs in this process
    while the server starts (a few seconds of its own imports and migrations, in another process)."""
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    import importlib.util

    prefect_pkg = Path(importlib.util.find_spec("prefect").origin).parent  # no import: it would load settings
    args = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect_pkg.parent), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]
    home = prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    proc = None
    try:
        # one start at a time per database: a new server migrates the SQLite schema at start-up, and four
        # commands migrating a fresh database at once collide ("duplicate column")
        with open(home / "ragledger-startup.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            proc = subprocess.Popen(args, env=_server_env(ephemeral=True), stdin=subprocess.DEVNULL,
                                    preexec_fn=die_with_parent)  # only prctl runs before exec: no locks taken
            if meanwhile is not None:
                meanwhile()
            _wait_healthy(api_url, proc, None)
        yield api_url
    finally:
        if proc is not None:
            _send_pending_logs()
            stop_child(proc, grace_s=10)


def _send_pending_logs(timeout_s: float = 5.0) -> None:
    """Send the log records Prefect still holds for the API before the server they go to stops. Its log worker
    sends them in batches; those of a failed flow were sent at exit, to a server already gone, and Prefect
    wrote `--- Error logging to API --- All connection attempts failed` under the run's error line."""
    if "prefect.logging.handlers" not in sys.modules:  # nothing was logged through Prefect
        return
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(Exception):  # a log batch that cannot be sent must not hide the command's outcome
        APILogWorker.drain_all(timeout=timeout_s)


@contextlib.contextmanager
def prefect_api(meanwhile: Callable[[], None] | None = None) -> Iterator[str]:
    """Point this process (and processes it starts, e.g. Dask workers) at a Prefect API; see module doc.
    `meanwhile` (e.g. importing the flow modules: Prefect, pandas, pandera) runs before the block, while a temporary
    server starts when one is needed, so the command waits for the longer of the two rather than their sum."""
    url = os.environ.get("PREFECT_API_URL") or persistent_server_url()
    with contextlib.ExitStack() as stack:
        if not url:
            url = stack.enter_context(temporary_server(meanwhile))
        elif meanwhile is not None:
            meanwhile()
        with _api_url_set(url):
            yield url


@contextlib.contextmanager
def _api_url_set(url: str) -> Iterator[None]:
    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        if "prefect.settings" in sys.modules:  # settings already loaded: the environment alone is not re-read
            from prefect.settings import PREFECT_API_URL, temporary_settings

            with temporary_settings(updates={PREFECT_API_URL: url}):
                yield
        else:
            yield
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous
