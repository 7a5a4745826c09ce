"""The run log: where a command's tracebacks and Prefect's warnings and errors go, instead of the terminal.

`ragledger run` names a log file (`.ragledger/logs/<command>-<time>-<pid>.log`) in RAGLEDGER_RUN_LOG before Prefect
is imported; Prefect's logging config (ragledger/prefect_logging.yaml, selected by ragledger.prefect_env) sends
WARNING and above there through `RunLogHandler`, in this process and in those it starts (Prefect's server, Dask
workers), and keeps `TerminalFilter` on its console handler. A failed run then ends on the terminal with one
`error:` line naming the log, not screens of task tracebacks above it (tests/test_reliability.py). The file is
created by the first record written to it: a run without warnings leaves none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
from pathlib import Path

from core.secrets import scrub

RUN_LOG_ENV = "RAGLEDGER_RUN_LOG"
# records of a failed flow or task run: the failure reaches the CLI as the exception itself, which it reports
ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


def start(workdir: Path, command: str) -> Path:
    """Name this command's log file (not created yet) for this process and the processes it starts."""
    path = (workdir / ".ragledger" / "logs" / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log").absolute()
    os.environ[RUN_LOG_ENV] = str(path)
    return path


def current() -> Path | None:
    value = os.environ.get(RUN_LOG_ENV)
    return Path(value) if value else None


_write_lock = threading.Lock()


def append(text: str) -> Path | None:
    """Append `text` (scrubbed of credentials) to the run log; None when there is none or it cannot be written
    (a full disk must not turn the report of an error into another error)."""
    path = current()
    if path is None:
        return None
    try:
        with _write_lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as out:
                out.write(scrub(text if text.endswith("\n") else text + "\n"))
    except OSError:
        return None
    return path


def write_traceback(exc: BaseException) -> Path | None:
    """The exception's traceback, appended to the run log; the log's path, or None if it could not be written."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return append(f"{stamp} | ragledger: the command failed with\n{''.join(traceback.format_exception(exc))}")


def shown(path: Path) -> str:
    """The log's path as the error line shows it: relative to the working directory when under it."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


class RunLogHandler(logging.Handler):
    """A logging handler writing to $RAGLEDGER_RUN_LOG (nothing when it is unset), scrubbing credentials.
    The file is opened per record, so processes sharing one log append in turn; records at WARNING and above are
    few (the config sets the level)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not os.environ.get(RUN_LOG_ENV):
            return
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        append(text)


class TerminalFilter(logging.Filter):
    """What Prefect's console handler leaves out: records carrying a traceback, and failed flow and task runs
    (the CLI reports the failure as one line; both are in the run log and in Prefect's own records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info or record.exc_text:
            return False
        return not (record.name.startswith(ENGINE_LOGGERS) and record.levelno >= logging.ERROR)
