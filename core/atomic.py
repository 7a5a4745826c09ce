"""Atomic file writes: the one way ragledger puts a file in place.

The content goes to a temporary file in the target's directory (same filesystem, so the rename is atomic), is
fsynced, then renamed over the target with os.replace; the directory is fsynced so the rename survives a crash.
Readers see the old file or the new one, never half of one; a failed write leaves no temporary file behind.
Temporary names are `.tmp-<pid>-<random><suffix>`: the writer's pid lets the event store tell a file abandoned by
a killed writer from a live one (tracking.store.events.EventStore.remove_abandoned_temp_files).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


def temp_path(directory: Path, suffix: str = "") -> Path:
    """A fresh temporary file name in `directory` (`.tmp-<pid>-<random><suffix>`)."""
    return Path(directory) / f".tmp-{os.getpid()}-{uuid.uuid4().hex}{suffix}"


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot open or fsync a directory; the rename still holds
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(target: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `target` for the caller (or a library) to write; on a normal exit it is
    fsynced and renamed to `target`, on an exception it is removed. `suffix` defaults to the target's (some
    writers pick a format by it)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(target.parent, target.suffix if suffix is None else suffix)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temporary file, fsync, os.replace)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically (temporary file, fsync, os.replace)."""
    atomic_write_bytes(path, text.encode(encoding))


COMPLETE_MARKER = "ragledger-complete"  # written last into a built directory: its presence means the build finished


def publish_dir(built: Path, target: Path, marker_text: str) -> None:
    """Mark a directory built beside `target` complete and rename it into place. Two processes may build the same
    index at once: the loser's rename fails, which is fine only when the winner's copy is complete."""
    (built / COMPLETE_MARKER).write_text(marker_text)
    try:
        os.replace(built, target)
    except OSError:
        if not (target / COMPLETE_MARKER).exists():
            raise
