"""The ledger: immutable, idempotent, atomically written Parquet event segments.

Layout: <root>/<kind>/<experiment>/seg-<hash>.parquet. A segment's name is the hash of the event
ids it holds, so writing the same events twice finds the segment already there (a no-op). Each
segment carries a checksum of its rows in the Parquet key-value metadata, so `verify` can detect
a truncated or altered file without a sidecar that could fall out of step with it.

A compacted experiment keeps a kind's events in one pack, `pack-<hash>.parquet` beside the segments, named with the
segments it replaced by the experiment's catalog (tracking/store/catalog.py says how readers choose the files).
Every method here takes a segment's path whether it is a file or compacted into a pack.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.atomic import atomic_path
from core.crash import crashpoint
from core.diskfull import reported_as_store_full
from core.hashing import stable_hash as stable_hash  # re-exported: ids and keys across tasks/ and flows/
from core.processes import pid_alive
from schemas.records import RECORD_MODELS, SCHEMA_VERSION, columns_of, current_names, validate_records
from tracking.store.catalog import (
    CATALOG_DIR,
    SEGMENTS_COLUMN,
    CatalogError,
    catalog_path,
    load_catalog,
    packed_in,
    reading,
    segment_exists,
    segment_of,
    split_packed,
)
from tracking.store.duck import earliest_rows
from tracking.store.mirrored import on_this_mirror, origin_url

# derived, rebuildable views of the segments (overlap sets, cell metrics) live under <store>/projections/
PROJECTIONS_DIR = "projections"


CHECKSUM_KEY = b"ragledger.checksum"
KIND_KEY = b"ragledger.kind"


def event_id(kind: str, experiment: str, *identity: Any) -> str:
    """Event identity = hash of its kind, experiment and the inputs that determine it."""
    return stable_hash(kind, experiment, *identity)


def new_events(kind: str, experiment: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Frame rows (which already carry event_id and cell) as events of `kind`, in schema column order."""
    if kind not in RECORD_MODELS:
        raise KeyError(f"unknown record kind {kind!r}")
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=columns_of(kind))
    df["schema_version"] = SCHEMA_VERSION
    df["experiment"] = experiment
    df["created_at"] = now
    return df[[c for c in columns_of(kind) if c in df.columns] + [c for c in df.columns if c not in columns_of(kind)]]


def _table_checksum(table: pa.Table) -> str:
    """sha256 of the rows as a Parquet reader returns them (metadata dropped, chunks combined), so the
    same rows always hash the same however they were laid out in memory when written."""
    table = table.replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def written_checksum(table: pa.Table) -> str:
    """The checksum of `table`'s rows as a reader of its Parquet file will get them. The round trip is uncompressed:
    compression changes the bytes, never the rows read back."""
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="none")
    return _table_checksum(pq.read_table(pa.BufferReader(buf.getvalue())))


def segment_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """One segment's rows (of `columns`), from its own file or from the pack it was compacted into."""
    pack = packed_in(path)
    return pq.read_table(path, columns=columns) if pack is None else _file_table(pack, {Path(path).name}, columns)


# what a call pack records of each call's request (tracking/store/callpack.py)
REQUEST_COLUMNS = ("call_id", "model", "role", "sample_index", "prompt_hash")


def calls_of_segments(segments: Iterable[str | Path]) -> dict[str, dict[str, Any]]:
    """Cache key -> what was asked (model, role, sample index, prompt hash), over generation segments: the requests
    of a call pack. The generation records' call_id is the call's cache key (tasks/generate.py). Here, not in
    callpack.py: the call packs are imported by tracking/store/remote.py, which this module's writes use."""
    calls: dict[str, dict[str, Any]] = {}
    for seg in segments:
        if not seg or not segment_exists(seg):
            continue
        for row in segment_table(seg, columns=list(REQUEST_COLUMNS)).to_pylist():
            key = row.pop("call_id")
            calls.setdefault(key, row)
    return calls


def read_file(path: str | Path, segments: set[str] | None = None) -> pd.DataFrame:
    """One segment file's events, or a pack's: all of them, or those of the named `segments`."""
    return current_names(_file_table(path, segments).to_pandas())


def _file_table(path: str | Path, segments: set[str] | None = None, columns: list[str] | None = None) -> pa.Table:
    """A file's rows; of a pack, those the named `segments` held (its `_segments` column says which segments held
    each event), without that column (the pack's bookkeeping, not an event's)."""
    if columns is not None and SEGMENTS_COLUMN in pq.read_schema(path).names:
        columns = [*columns, SEGMENTS_COLUMN]
    table = pq.read_table(path, columns=columns)
    if SEGMENTS_COLUMN in table.schema.names:
        if segments is not None:
            table = table.filter(_held_by(table.column(SEGMENTS_COLUMN), segments))
        table = table.drop_columns([SEGMENTS_COLUMN])
    return table


def _held_by(lists: pa.ChunkedArray, segments: set[str]) -> pa.Array:
    """For each row, whether one of its segment names is in `segments`."""
    import pyarrow.compute as pc

    lists = lists.combine_chunks()
    hit = pc.is_in(pc.list_flatten(lists), value_set=pa.array(sorted(segments), pa.string()))
    rows = pc.unique(pc.filter(pc.list_parent_indices(lists), hit))
    mask = [False] * len(lists)
    for i in rows.to_pylist():
        mask[i] = True
    return pa.array(mask, pa.bool_())


def table_problem(kind: str, table: pa.Table) -> str | None:
    """What is wrong with a stored file's rows (checksum, then schema), or None."""
    stored = (table.schema.metadata or {}).get(CHECKSUM_KEY, b"").decode()
    if not stored:
        return "no checksum in metadata"
    if _table_checksum(table) != stored:
        return "checksum mismatch (altered after writing)"
    if SEGMENTS_COLUMN in table.schema.names:
        table = table.drop_columns([SEGMENTS_COLUMN])
    try:
        validate_records(kind, table.to_pandas())
    except Exception as exc:
        return f"schema: {exc}"
    return None


@dataclass(frozen=True)
class VerifyProblem:
    path: Path
    problem: str


class EventStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def kind_dir(self, kind: str, experiment: str) -> Path:
        return self.root / kind / experiment

    def write(self, kind: str, df: pd.DataFrame) -> Path | None:
        """Validate and atomically write one segment; return its path (None for an empty batch).

        Validation failure raises before anything touches the disk. An existing segment with the
        same name holds the same events, so it is left as it is.
        """
        if df.empty:
            return None
        df = validate_records(kind, df)
        experiments = df["experiment"].unique()
        if len(experiments) != 1:
            raise ValueError(f"{kind}: a segment belongs to one experiment, got {list(experiments)}")
        ids = sorted(df["event_id"].tolist())
        seg = f"seg-{stable_hash(kind, ids, length=24)}.parquet"
        target = self.kind_dir(kind, str(experiments[0])) / seg
        if target.exists() or packed_in(target) is not None:
            return target
        table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), CHECKSUM_KEY: written_checksum(table).encode(), KIND_KEY: kind.encode()}
        )
        # out of space (ENOSPC from mkdir, the write or the fsync): the temp file is removed below and the error names
        # the segment (core/diskfull.py); the target name appears only by the rename, so never half-written
        with reported_as_store_full(target), atomic_path(target) as tmp:
            with tmp.open("wb") as fh:  # Python's file object: an ENOSPC keeps its errno (pyarrow's own writer drops it)
                pq.write_table(table, fh, compression="zstd")
            crashpoint("events.before_rename")
        from tracking.store.remote import put_segment  # here: a folder store's writes never import boto3

        put_segment(self.root, target)  # a store at an s3:// URL: in the bucket as soon as it is written
        return target

    def remove_abandoned_temp_files(self) -> int:
        """Delete temp files left by writers that were killed (their pid is gone); never a live writer's."""
        removed = 0
        if not self.root.exists():
            return 0
        for tmp in self.root.rglob(".tmp-*"):
            m = re.match(r"\.tmp-(\d+)-", tmp.name)
            if m and not pid_alive(int(m.group(1))):
                tmp.unlink(missing_ok=True)
                removed += 1
        return removed

    def experiments(self, kind: str) -> list[str]:
        base = self.root / kind
        if not base.is_dir():
            return []
        return sorted(e.name for e in os.scandir(base) if e.is_dir())

    def segments(self, kind: str, experiment: str | None = None) -> list[Path]:
        """The files that hold a kind's events now (of one experiment, or of all): each compacted experiment's pack
        first, then the segment files its catalog does not name, by name."""
        files: list[Path] = []
        for name in [experiment] if experiment else self.experiments(kind):
            directory = self.kind_dir(kind, name)
            try:
                names = sorted(f for f in os.listdir(directory) if f.startswith("seg-") and f.endswith(".parquet"))
            except (FileNotFoundError, NotADirectoryError):
                continue
            entry = load_catalog(self.root, name).entry(kind)
            if entry is not None:
                files.append(directory / entry.pack)
                names = [f for f in names if f not in entry.segments]
            files += [directory / f for f in names]
        return files

    def read(self, kind: str, experiment: str | None = None, paths: Iterable[Path | str] | None = None) -> pd.DataFrame:
        """Events of one kind, each event once (segments may overlap when shards were regrouped): of `paths` (segments,
        as files or compacted) when given, else every event of the experiment (or store). A segment's column of an
        earlier name reads under its name now (`strategy` as `reader`: schemas/records.RENAMED_COLUMNS)."""
        wanted = None if paths is None else [p for p in paths if p is not None]
        if wanted and origin_url(self.root) is not None:  # a mirror: files another machine's mirror named, fetched
            wanted = [self._on_this_mirror(p) for p in wanted]
        with reading(self.root):  # no compaction deletes a listed file before it is read (tracking/store/catalog.py)
            frames = self._frames(kind, experiment, wanted)
        if not frames:
            return pd.DataFrame(columns=columns_of(kind))
        events = pd.concat([frame for _, frame in frames], ignore_index=True)
        if not events["event_id"].duplicated().any():
            return events
        # copies of an event: the one every reader keeps (tracking/store/duck.py), the rows otherwise in their order
        files = [str(name) for name, frame in frames for _ in range(len(frame))]
        return events.iloc[earliest_rows(events, files)].reset_index(drop=True)

    def _on_this_mirror(self, path: Path | str) -> Path:
        here = on_this_mirror(self.root, path)
        segment_exists(here)  # fetched from the bucket when this mirror lacks it
        return here

    def _frames(self, kind: str, experiment: str | None,
                paths: list[Path | str] | None) -> list[tuple[Path, pd.DataFrame]]:
        """Each file's events with the file they were read from (a pack for its segments)."""
        if paths is None:
            return [(f, read_file(f)) for f in self.segments(kind, experiment)]
        files, packed = split_packed(paths)
        return [(Path(f), read_file(f)) for f in files] + [(p, read_file(p, names)) for p, names in packed.items()]

    def verify(self) -> tuple[int, list[VerifyProblem]]:
        """Check every segment's and every pack's checksum and schema, and that each catalog's packs hold the segments
        it names; return (files checked, problems). A temporary file of a writer that was killed is not a problem
        (reads never see it; the next run or `store compact` removes it); one of a live writer is reported."""
        problems: list[VerifyProblem] = []
        checked = 0
        for kind in RECORD_MODELS:
            for experiment in self.experiments(kind):
                for path in sorted(self.kind_dir(kind, experiment).glob("seg-*.parquet")):
                    checked += 1
                    problems += self._check_file(kind, path)
        for path in sorted((self.root / CATALOG_DIR).glob("*.json")):
            try:
                catalog = load_catalog(self.root, path.stem)
            except CatalogError as exc:
                problems.append(VerifyProblem(path, str(exc).removeprefix(f"{path}: ")))
                continue
            for kind, entry in catalog.kinds.items():
                checked += 1
                problems += self._check_file(kind, self.kind_dir(kind, path.stem) / entry.pack, entry.segments)
        for tmp in self.root.rglob(".tmp-*"):
            m = re.match(r"\.tmp-(\d+)-", tmp.name)
            if not m or pid_alive(int(m.group(1))):
                problems.append(VerifyProblem(tmp, "temporary file of a write in progress (ignored by reads)"))
        return checked, problems

    def _check_file(self, kind: str, path: Path, segments: frozenset[str] | None = None) -> list[VerifyProblem]:
        """A segment's problems, or a pack's (then `segments`: the names its catalog says it holds)."""
        try:
            table = pq.read_table(path)
        except Exception as exc:  # a truncated file fails here
            return [VerifyProblem(path, f"unreadable: {exc}")]
        problem = table_problem(kind, table)
        if problem is None and segments is not None:
            import pyarrow.compute as pc

            held = set(pc.list_flatten(table.column(SEGMENTS_COLUMN)).unique().to_pylist())
            if held != segments:
                problem = (f"holds {len(held)} segment(s), its catalog {catalog_path(self.root, segment_of(path)[2])} "
                           f"names {len(segments)}")
        return [VerifyProblem(path, problem)] if problem else []
