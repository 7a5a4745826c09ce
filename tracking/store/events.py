"""The ledger: immutable, idempotent, atomically written Parquet event segments.

Layout: <root>/<kind>/<experiment>/seg-<hash>.parquet. A segment's name is the hash of the event
ids it holds, so writing the same events twice finds the segment already there (a no-op). Each
segment carries a checksum of its rows in the Parquet key-value metadata, so `verify` can detect
a truncated or altered file without a sidecar that could fall out of step with it.
"""

from __future__ import annotations

import hashlib
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
from core.atomic import temp_path as temp_path  # re-exported: flows/experiment.py imports it from here
from core.crash import crashpoint
from core.diskfull import reported_as_store_full
from core.diskfull import write_text_atomically as write_text_atomically  # re-exported: projections write with it
from core.hashing import stable_hash as stable_hash  # re-exported: ids and keys across tasks/ and flows/
from core.processes import pid_alive
from schemas.records import RECORD_MODELS, SCHEMA_VERSION, columns_of, current_names, validate_records

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


def _parquet_roundtrip_checksum(table: pa.Table) -> str:
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, compression="zstd")
    return _table_checksum(pq.read_table(pa.BufferReader(buf.getvalue())))


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
        if target.exists():
            return target
        table = pa.Table.from_pandas(df.reset_index(drop=True), preserve_index=False)
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), CHECKSUM_KEY: _parquet_roundtrip_checksum(table).encode(), KIND_KEY: kind.encode()}
        )
        # out of space (ENOSPC from mkdir, the write or the fsync): the temp file is removed below and the error names
        # the segment (core/diskfull.py); the target name appears only by the rename, so never half-written
        with reported_as_store_full(target), atomic_path(target) as tmp:
            with tmp.open("wb") as fh:  # Python's file object: an ENOSPC keeps its errno (pyarrow's own writer drops it)
                pq.write_table(table, fh, compression="zstd")
            crashpoint("events.before_rename")
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

    def segments(self, kind: str, experiment: str | None = None) -> list[Path]:
        base = self.root / kind
        if not base.exists():
            return []
        pattern = f"{experiment}/seg-*.parquet" if experiment else "*/seg-*.parquet"
        return sorted(base.glob(pattern))

    def read(self, kind: str, experiment: str | None = None, paths: Iterable[Path] | None = None) -> pd.DataFrame:
        """Events of one kind, each event once (segments may overlap when shards were regrouped). A segment's
        column of an earlier name reads under its name now (`strategy` as `reader`: schemas/records.RENAMED_COLUMNS)."""
        files = list(paths) if paths is not None else self.segments(kind, experiment)
        files = [f for f in files if f is not None]
        if not files:
            return pd.DataFrame(columns=columns_of(kind))
        frames = [current_names(pq.read_table(f).to_pandas()) for f in files]
        df = pd.concat(frames, ignore_index=True)
        return df.drop_duplicates("event_id", keep="first").reset_index(drop=True)

    def verify(self) -> tuple[int, list[VerifyProblem]]:
        """Check every segment's checksum and schema; return (segments checked, problems)."""
        problems: list[VerifyProblem] = []
        checked = 0
        for kind in RECORD_MODELS:
            for path in self.segments(kind):
                checked += 1
                try:
                    table = pq.read_table(path)
                except Exception as exc:  # a truncated file fails here
                    problems.append(VerifyProblem(path, f"unreadable: {exc}"))
                    continue
                meta = table.schema.metadata or {}
                stored = meta.get(CHECKSUM_KEY, b"").decode()
                if not stored:
                    problems.append(VerifyProblem(path, "no checksum in metadata"))
                elif _table_checksum(table) != stored:
                    problems.append(VerifyProblem(path, "checksum mismatch (altered after writing)"))
                    continue
                try:
                    validate_records(kind, table.to_pandas())
                except Exception as exc:
                    problems.append(VerifyProblem(path, f"schema: {exc}"))
        for tmp in self.root.rglob(".tmp-*"):
            problems.append(VerifyProblem(tmp, "leftover temporary file from an interrupted write (ignored by reads)"))
        return checked, problems
