"""Process helpers shared by the servers ragledger starts and the clean-up of what dead runs left behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (on this host), whoever owns it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_child(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM a child this process started; SIGKILL it if it has not exited after grace_s seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_process_group(pid: int, grace_s: float) -> None:
    """SIGTERM the process group led by pid (a server started in its own session); SIGKILL the group if its
    leader is still alive after grace_s seconds. A group that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            return
        time.sleep(0.25)


def die_with_parent() -> None:
    """`preexec_fn` for a server child: the kernel SIGTERMs it when the process that started it dies, even by
    SIGKILL (Linux PR_SET_PDEATHSIG), so a killed run leaves no server behind. Only prctl runs between fork and
    exec: no locks are taken."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
