"""Compaction: an experiment's segments of each kind rewritten into one pack, as event stores compact their logs.

Only which files hold the events changes. The pack holds each event once: of copies that overlapped (a resumed or
re-sharded run writes some events into a second segment) the one every reader shows (tracking/store/duck.py
`COPY_RANK`). Its rows are sorted by question, cell and event id and kept in row groups
of PACK_ROW_GROUP rows, so a query for one question or one cell skips, by the row groups' statistics, what it does
not need. Its `_segments` column lists the segments that held each event, so the segment paths a run manifest
names read as before (tracking/store/catalog.py).

The steps, each safe to be killed after (a reader sees the old files or the new ones, tracking/store/catalog.py):
1. each kind's pack written beside its segments (an atomic rename; a pack no catalog names is never read);
2. the experiment's catalog written: the commit, one rename for every kind;
3. the replaced segments and packs deleted (what a kill leaves, the next compaction deletes).
One compaction at a time per store: an flock on the catalogs' folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from core import progress
from core.atomic import atomic_path
from core.crash import crashpoint
from core.diskfull import reported_as_store_full, write_text_atomically
from core.processes import pid_alive
from schemas.records import RECORD_MODELS
from tracking.store.catalog import (
    CATALOG_DIR,
    SEGMENTS_COLUMN,
    Catalog,
    PackEntry,
    catalog_path,
    deleting,
    load_catalog,
    packed_in,
    segment_of,
)
from tracking.store.duck import COPY_RANK, memory_connection, sql_list
from tracking.store.events import CHECKSUM_KEY, KIND_KEY, EventStore, read_file, stable_hash, written_checksum

PACK_ROW_GROUP = 8192


@dataclass
class CompactionResult:
    experiments: int = 0  # experiments compacted now (the others had nothing new)
    files_before: int = 0  # record files (segments and packs) of the experiments looked at, before
    files_after: int = 0
    rows: int = 0  # events in the packs written
    seconds: float = 0.0


@contextlib.contextmanager
def compaction_lock(root: Path) -> Iterator[None]:
    """One compaction at a time in a store (a run compacting its experiment, `ragledger store compact`)."""
    folder = root / CATALOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def compact_store(store: EventStore, experiments: list[str] | None = None) -> CompactionResult:
    """Compact every experiment of the store (or the named ones), reporting each done to core.progress."""
    started = time.perf_counter()
    names = experiments if experiments is not None else sorted({e for k in RECORD_MODELS for e in store.experiments(k)})
    result = CompactionResult()
    progress.set_total("compact", len(names))
    with compaction_lock(store.root):
        for name in names:
            before, after, rows = _compact_locked(store, name)
            result.files_before += before
            result.files_after += after
            result.rows += rows
            result.experiments += rows > 0 or before != after
            progress.advance("compact")
    result.seconds = time.perf_counter() - started
    return result


def compact_experiment(store: EventStore, experiment: str) -> CompactionResult:
    return compact_store(store, [experiment])


def _compact_locked(store: EventStore, experiment: str) -> tuple[int, int, int]:
    """(record files before, after, rows packed) for one experiment; the caller holds the compaction lock."""
    old = load_catalog(store.root, experiment)
    kinds = dict(old.kinds)
    before = sum(len(store.segments(kind, experiment)) for kind in RECORD_MODELS)
    rows = 0
    for kind in RECORD_MODELS:
        entry = old.entry(kind)
        directory = store.kind_dir(kind, experiment)
        loose = [p for p in store.segments(kind, experiment) if p.name.startswith("seg-")]
        if not loose:
            continue
        kinds[kind] = _write_pack(kind, directory, loose, entry)
        rows += kinds[kind].rows
        crashpoint("compact.pack_written")
    if kinds != old.kinds:
        write_text_atomically(catalog_path(store.root, experiment), Catalog(experiment, kinds).to_json())
        crashpoint("compact.committed")
    _delete_replaced(store, experiment)
    after = sum(len(store.segments(kind, experiment)) for kind in RECORD_MODELS)
    return before, after, rows


def _write_pack(kind: str, directory: Path, loose: list[Path], entry: PackEntry | None) -> PackEntry:
    """The pack of `loose` segments and the experiment's current pack (if any), written beside them."""
    sources = ([directory / entry.pack] if entry else []) + loose
    held = f"coalesce(\"{SEGMENTS_COLUMN}\", [parse_filename(filename)])" if entry else "[parse_filename(filename)]"
    hidden = f"filename, __held, __rn, __all{f', {SEGMENTS_COLUMN}' if entry else ''}"
    sql = (f"SELECT * EXCLUDE ({hidden}), __all AS \"{SEGMENTS_COLUMN}\" FROM ("
           f"SELECT *, {COPY_RANK} AS __rn, "
           f"list_sort(list_distinct(flatten(list(__held) OVER (PARTITION BY qid, event_id)))) AS __all FROM ("
           f"SELECT *, {held} AS __held FROM read_parquet({sql_list(sources)}, union_by_name = true, filename = true))) "
           f"WHERE __rn = 1 ORDER BY qid, cell, event_id")
    con = memory_connection()
    try:
        con.execute("SET TimeZone = 'UTC'")
        table = con.sql(sql).to_arrow_table()
    finally:
        con.close()
    segments = frozenset((entry.segments if entry else frozenset()) | {p.name for p in loose})
    pack = directory / f"pack-{stable_hash(kind, sorted(segments), length=24)}.parquet"
    meta = {**_pandas_metadata(sources), KIND_KEY: kind.encode()}
    table = table.replace_schema_metadata(meta)
    table = table.replace_schema_metadata({**meta, CHECKSUM_KEY: written_checksum(table).encode()})
    with reported_as_store_full(pack), atomic_path(pack) as tmp:
        with tmp.open("wb") as fh:
            pq.write_table(table, fh, compression="zstd", row_group_size=PACK_ROW_GROUP)
        crashpoint("compact.before_pack_rename")
    pairs = table.select(["cell", "qid"]).group_by(["cell", "qid"]).aggregate([]).num_rows
    return PackEntry(pack.name, table.num_rows, tuple(n for n in table.schema.names if n != SEGMENTS_COLUMN),
                     segments, pairs == table.num_rows)


def _pandas_metadata(sources: list[Path]) -> dict[bytes, bytes]:
    """The pandas dtypes the segments were written with (a nullable column read back as pandas wrote it), when they
    all agree; none when they differ (then each column reads as Arrow maps it)."""
    import json

    found = {(pq.read_schema(f).metadata or {}).get(b"pandas") for f in sources}
    if None in found:
        return {}
    dtypes = [{c["name"]: c["numpy_type"] for c in json.loads(m)["columns"]} for m in found]
    return {b"pandas": min(found)} if all(d == dtypes[0] for d in dtypes) else {}


def _delete_replaced(store: EventStore, experiment: str) -> None:
    """Remove what the catalog made unread: the segments it names, packs it does not name, and temporary files
    of killed writers."""
    catalog = load_catalog(store.root, experiment)
    doomed = []
    for kind in RECORD_MODELS:
        directory = store.kind_dir(kind, experiment)
        if not directory.is_dir():
            continue
        entry = catalog.entry(kind)
        for f in sorted(os.listdir(directory)):
            replaced = entry is not None and f in entry.segments
            stale_pack = f.startswith("pack-") and (entry is None or f != entry.pack)
            if replaced or stale_pack or _abandoned_temp(f):
                doomed.append(directory / f)
    if not doomed:
        return
    with deleting(store.root):  # readers that listed the files before the commit have read them
        for path in doomed:
            path.unlink(missing_ok=True)
            crashpoint("compact.deleting")


def _abandoned_temp(name: str) -> bool:
    m = re.match(r"\.tmp-(\d+)-", name)
    return m is not None and not pid_alive(int(m.group(1)))


def record_files(store: EventStore) -> int:
    """Record files on disk (segments, packs, catalogs), whether read or left to delete: what a lab's store holds."""
    count = 0
    for kind in RECORD_MODELS:
        for experiment in store.experiments(kind):
            count += sum(1 for f in os.listdir(store.kind_dir(kind, experiment)) if f.endswith(".parquet"))
    folder = store.root / CATALOG_DIR
    return count + (sum(1 for _ in folder.glob("*.json")) if folder.is_dir() else 0)


@contextlib.contextmanager
def segment_files(paths: Iterable[str | Path | None]) -> Iterator[list[Path]]:
    """The segments at `paths` as files of their own, for a tool that uploads files (MLflow's artifacts): a
    compacted one is written again from its pack (the same events, so the same name) into a temporary folder that
    is removed on exit. A path the store does not hold is left out."""
    with tempfile.TemporaryDirectory(prefix="ragledger-segments-") as tmp:
        files = []
        for p in paths:
            if not p:
                continue
            pack = packed_in(p)
            if pack is None:
                if Path(p).exists():
                    files.append(Path(p))
                continue
            _, kind, _, name = segment_of(p)
            written = EventStore(tmp).write(kind, read_file(pack, {name}))
            if written is None or written.name != name:
                raise ValueError(f"{pack}: the events it holds for {name} are not that segment's")
            files.append(written)
        yield files
