"""Which files hold an experiment's events after compaction (tracking/store/compaction.py).

`<store>/compacted/<experiment>.json`, the experiment's *catalog*, names for each record kind the pack that holds
the events of the segments it replaced, and those segments' names. Writing it (one atomic rename) is the commit of
a compaction, for every kind at once. Readers take a kind's events from

- the pack the catalog names, and
- every segment file the catalog does not name (written since, or never compacted);

a segment file the catalog names is ignored (replaced: the compaction deletes it after the commit, and a kill
between the two leaves it behind), and so is a pack file it does not name (an interrupted compaction's). So a
reader sees the files before a compaction or the files after it, never both. A segment the catalog names still
*exists* as far as the store is concerned (`segment_exists`): its events are read from the pack, by the pack's
`_segments` column, which lists for each event the segments that held it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tracking.store.mirrored import fetched

CATALOG_DIR = "compacted"
READERS_LOCK = ".readers.lock"  # in CATALOG_DIR: shared by readers, exclusive while a compaction deletes files
CATALOG_VERSION = 1
SEGMENTS_COLUMN = "_segments"  # in a pack: the names of the segments that held each event


class CatalogError(ValueError):
    """A catalog that cannot be read: the store is damaged there (`store verify` names it)."""


@dataclass(frozen=True)
class PackEntry:
    pack: str  # file name in <store>/<kind>/<experiment>/
    rows: int
    columns: tuple[str, ...]  # the pack's columns, in order: packs of one layout are read without unifying schemas
    segments: frozenset[str] = field(default_factory=frozenset)
    # no two events share a cell and a question (one execution's outcomes): a leaderboard sums them as they are
    one_per_cell_question: bool = False


@dataclass(frozen=True)
class Catalog:
    experiment: str
    kinds: dict[str, PackEntry] = field(default_factory=dict)

    def entry(self, kind: str) -> PackEntry | None:
        return self.kinds.get(kind)

    def replaced(self, kind: str) -> frozenset[str]:
        entry = self.kinds.get(kind)
        return entry.segments if entry else frozenset()

    def to_json(self) -> str:
        kinds = {kind: {"pack": e.pack, "rows": e.rows, "columns": list(e.columns), "segments": sorted(e.segments),
                        "one_per_cell_question": e.one_per_cell_question} for kind, e in sorted(self.kinds.items())}
        return json.dumps({"version": CATALOG_VERSION, "experiment": self.experiment, "kinds": kinds})


def catalog_path(root: str | Path, experiment: str) -> Path:
    return Path(root) / CATALOG_DIR / f"{experiment}.json"


# parsed catalogs by path, kept while the file is the same one (a compaction replaces it by a rename: a new inode)
_parsed: dict[Path, tuple[tuple[int, int, int], Catalog]] = {}
_parsed_lock = threading.Lock()


def load_catalog(root: str | Path, experiment: str) -> Catalog:
    """The experiment's catalog; an empty one when it was never compacted. CatalogError for a damaged file."""
    path = catalog_path(root, experiment)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Catalog(experiment)
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    with _parsed_lock:
        hit = _parsed.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        data = json.loads(path.read_text())
        if data["version"] != CATALOG_VERSION:
            raise CatalogError(f"{path}: catalog version {data['version']}, this ragledger reads {CATALOG_VERSION}")
        kinds = {kind: PackEntry(e["pack"], int(e["rows"]), tuple(e["columns"]), frozenset(e["segments"]),
                                 bool(e.get("one_per_cell_question", False))) for kind, e in data["kinds"].items()}
    except FileNotFoundError:  # replaced between the stat and the read: the newer one
        return load_catalog(root, experiment)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CatalogError(f"{path}: unreadable catalog: {exc}") from None
    catalog = Catalog(str(data.get("experiment", experiment)), kinds)
    with _parsed_lock:
        _parsed[path] = (stamp, catalog)
    return catalog


def segment_of(path: str | Path) -> tuple[Path, str, str, str]:
    """(store root, kind, experiment, file name) of a path <root>/<kind>/<experiment>/<file>."""
    p = Path(path)
    return p.parents[2], p.parents[1].name, p.parent.name, p.name


def packed_in(path: str | Path) -> Path | None:
    """The pack that holds a compacted segment's events, or None when the segment was not compacted."""
    root, kind, experiment, name = segment_of(path)
    entry = load_catalog(root, experiment).entry(kind)
    if entry is None or name not in entry.segments:
        return None
    return Path(path).parent / entry.pack


def split_packed(paths: list[str | Path]) -> tuple[list[str | Path], dict[Path, set[str]]]:
    """Segment paths split into those that are their own files and, per pack, the names of those compacted into it."""
    files: list[str | Path] = []
    packed: dict[Path, set[str]] = {}
    for p in paths:
        pack = packed_in(p)
        if pack is None:
            files.append(p)
        else:
            packed.setdefault(pack, set()).add(Path(p).name)
    return files, packed


def segment_exists(path: str | Path) -> bool:
    """Whether the store holds the segment at `path`: as its own file, or compacted into a pack that is there; in a
    mirror of a store at a URL, also as an object its bucket holds (fetched now: another machine wrote it)."""
    pack = packed_in(path)
    return pack.exists() if pack is not None else Path(path).exists() or fetched(path)


@contextlib.contextmanager
def reading(root: str | Path) -> Iterator[None]:
    """Hold the store's readers' lock (shared) for a listing and the reads that follow it. The lock file is made here
    too when missing: a reader of a never-compacted store that held none could see the first compaction delete the
    files it listed. A store that is not there, or whose lock cannot be made or opened (permissions), is read without."""
    path = Path(root) / CATALOG_DIR / READERS_LOCK
    try:
        if Path(root).is_dir():
            path.parent.mkdir(exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def deleting(root: str | Path) -> Iterator[None]:
    """Hold the store's readers' lock exclusively: no reader is between its listing and its reads."""
    path = Path(root) / CATALOG_DIR / READERS_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
