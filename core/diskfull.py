"""A full filesystem under the store: told apart from other write errors and reported by the path being written.

Every write under the store goes aside and is renamed into place (tracking/store/events.py), so a write that runs out of
space leaves nothing partial; the run stops with StoreFullError, and once space is freed the next run resumes from
the segments already stored (Prefect's persisted task results and the LLM-call cache point at them).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from core.atomic import atomic_write_text

# what the model-call process (engines/model_call_process.py) puts before a StoreFullError's text when it sends it back as a
# failed call: the parent sees only that string (a BackendError), and run_experiment turns it back into the error
MARKER = "StoreFullError: "


class StoreFullError(OSError):
    """No space left on the filesystem holding a store file: an OSError (ENOSPC) whose text is the whole message.
    Built as StoreFullError(message); OSError pickles it as (errno, message), which __init__ accepts back (Dask
    workers, Prefect's result store)."""

    def __init__(self, *args: object) -> None:
        if len(args) == 1:
            args = (errno.ENOSPC, args[0])
        super().__init__(*args)

    def __str__(self) -> str:
        return str(self.strerror)


def _free_bytes(path: Path) -> int | None:
    for p in (path, *path.parents):  # the file may not exist yet: its nearest existing directory's filesystem
        with contextlib.suppress(OSError):
            if p.exists():
                return shutil.disk_usage(p).free
    return None


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def is_disk_full(exc: BaseException, path: str | Path | None = None) -> bool:
    """ENOSPC/EDQUOT; or SQLite's 'database or disk is full'; or another SQLite I/O error (on a full tmpfs SQLite says
    'disk I/O error', growing its shared-memory file) while the filesystem of `path` has under 64 KiB left."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name == "SQLITE_FULL" or "disk is full" in str(exc):
            return True
        if path is not None and (name.startswith("SQLITE_IOERR") or "disk I/O error" in str(exc)):
            free = _free_bytes(Path(path))
            return free is not None and free < 64 * 1024
    return False


def store_full_error(path: str | Path) -> StoreFullError:
    free = _free_bytes(Path(path))
    left = f"{_human(free)} left on its filesystem" if free is not None else "its filesystem is full"
    return StoreFullError(f"no space left on device writing {path} ({left}); nothing partial was kept: free some "
                          "space and run again, the run resumes from the segments already stored")


@contextlib.contextmanager
def reported_as_store_full(path: str | Path) -> Iterator[None]:
    """Raise StoreFullError naming `path` when the block fails for lack of space; other errors pass unchanged."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        if is_disk_full(exc, path):
            raise store_full_error(path) from None
        raise


def as_store_full(exc: BaseException, store_root: str | Path) -> StoreFullError | None:
    """The StoreFullError an experiment's failure amounts to, or None when it was something else: a StoreFullError
    itself, one that came back from the model-call process as a failed call's text, or a disk-full OSError raised
    by a writer that does not name its file (reported by the file it names, else by the store)."""
    if isinstance(exc, StoreFullError):
        return exc
    text = str(exc)
    if MARKER in text:
        return StoreFullError(text.split(MARKER, 1)[1])
    if isinstance(exc, OSError | sqlite3.Error) and is_disk_full(exc, store_root):
        return store_full_error(getattr(exc, "filename", None) or Path(store_root).resolve())
    return None


def write_text_atomically(path: Path, text: str) -> None:
    """Write a small derived file (a projection, a manifest) atomically (core.atomic): readers never see half of
    it, and a full filesystem is a StoreFullError naming the file, with nothing left behind. Here, not in
    tracking.store.events, so that writing a manifest imports no pandas (tracking/mlflow/sync.py)."""
    with reported_as_store_full(path):
        atomic_write_text(path, text)
