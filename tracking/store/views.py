"""The views' SQL over stored segments, each event once although segments may overlap (a resumed or re-sharded run
writes some events again, into another segment; tracking/store/duck.py says which copy every reader keeps). Finding
the overlaps needs every event id, which is the costly part
of a query over many segments, so it is done once per set of segments and cached:

- the *overlap projection* of a kind lists the segments a view covers (one experiment's, or every
  experiment's) that share an event with another of them. It is a small JSON,
  `<store>/projections/<kind>/<experiment or @all>/overlaps-<key>.json`, named by a hash of the
  segments it describes (path, size, mtime), so adding, removing or rewriting a segment makes a new
  one; deleting it (or the whole folder) only means it is computed again. When segments were only
  added, the cached projection of the others is extended by comparing just the new segments' events
  with the rest (a semi-join) instead of a window over every event. A store that cannot be written to
  gets it in memory.
- a view is then a plain `read_parquet` over the segments that share no event with another (each of
  their events is unique), plus, only when some segments do overlap, the earliest copy of each event over those
  (tracking/store/duck.py `COPY_RANK`). The answers are the same as that rule over every segment; a
  `WHERE qid = ...` is pushed into the Parquet scan.

A column a segment may hold under an earlier name (schemas/records.RENAMED_COLUMNS: `strategy`, the reader column)
reads under its name now, `reader`, over segments of either name or both (`current_names_select`); the earlier name
stays a column of the view too, the same values, last, so a query written with it still runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

import duckdb

from core.diskfull import write_text_atomically
from schemas.records import RENAMED_COLUMNS, columns_of, schema_of
from tracking.store.catalog import SEGMENTS_COLUMN, load_catalog
from tracking.store.duck import earliest_select, sql_list
from tracking.store.events import PROJECTIONS_DIR, EventStore, stable_hash

PROJECTION_VERSION = "overlap-2"


def empty_select(kind: str) -> str:
    model = schema_of(kind)
    cols = []
    for name, col in model.columns.items():
        dtype = str(col.dtype)
        sql = "VARCHAR"
        if "int" in dtype:
            sql = "BIGINT"
        elif "float" in dtype:
            sql = "DOUBLE"
        elif "bool" in dtype:
            sql = "BOOLEAN"
        elif "datetime" in dtype:
            sql = "TIMESTAMPTZ"
        elif dtype == "object":
            sql = "VARCHAR[]"
        cols.append(f"CAST(NULL AS {sql}) AS \"{name}\"")
    return f"SELECT {', '.join(cols)} WHERE FALSE"


def _sql_names(names: Sequence[str]) -> str:
    return ", ".join("'" + n.replace("'", "''") + "'" for n in names)


def current_names_select(kind: str, select: str) -> str:
    """`select` (rows of a kind's segments) with a column of an earlier name (RENAMED_COLUMNS) under its name now, in
    its place in the schema, and under the earlier name as well, last. The segments may hold either name or both
    (union_by_name gives both when they differ); COLUMNS matches whichever are there, so this binds without
    reading the segments' schemas first, and COALESCE takes each row's value from the one its segment has."""
    columns = columns_of(kind)
    for old, new in RENAMED_COLUMNS.items():
        if new not in columns:
            continue
        before = columns[:columns.index(new)]
        value = f"COALESCE(*COLUMNS('^({new}|{old})$'))"
        select = (f"SELECT COLUMNS(lambda c: c IN ({_sql_names(before)})), {value} AS \"{new}\", "
                  f"COLUMNS(lambda c: c NOT IN ({_sql_names([*before, new, old])})), {value} AS \"{old}\" "
                  f"FROM ({select})")
    return select


def is_pack(path: str | Path) -> bool:
    """A compacted experiment's pack (tracking/store/compaction.py), rather than a segment."""
    return Path(path).name.startswith("pack-")


def without_bookkeeping(select: str, files: Sequence[str]) -> str:
    """`select` over `files` without the packs' `_segments` column, when one of the files is a pack."""
    if not any(is_pack(f) for f in files):
        return select
    return f'SELECT * EXCLUDE ("{SEGMENTS_COLUMN}") FROM ({select})'


def dedupe_select(files: Sequence[str], where: str = "") -> str:
    """Each event once among `files` (tracking/store/duck.py `earliest_select`; `where`: a condition on qid only)."""
    return without_bookkeeping(_dedupe(files, where), files)


def _dedupe(files: Sequence[str], where: str = "") -> str:
    return earliest_select(f"read_parquet({sql_list(files)}, union_by_name = true, filename = true)", where)


def overlapping_segments(con: duckdb.DuckDBPyConnection, files: Sequence[str]) -> set[str]:
    """The files that hold an event (same qid and event_id) that another of the files also holds."""
    if len(files) < 2:
        return set()
    rows = con.execute(
        f"SELECT DISTINCT filename FROM (SELECT filename, count(*) OVER (PARTITION BY qid, event_id) AS n "
        f"FROM read_parquet({sql_list(files)}, union_by_name = true, filename = true)) WHERE n > 1"
    ).fetchall()
    return {r[0] for r in rows}


def overlapping_with_new(con: duckdb.DuckDBPyConnection, old: Sequence[str], new: Sequence[str]) -> set[str]:
    """The files that share an event with one of the `new` files (old or new ones): what adding `new` to
    `old` adds to the overlapping set. Only the old events that a new file also holds are kept, so this
    is a semi-join against the (few) new events rather than a window over every event."""
    if not new:
        return set()
    n = f"SELECT qid, event_id, filename FROM read_parquet({sql_list(new)}, union_by_name = true, filename = true)"
    if not old:
        return overlapping_segments(con, new)
    rows = con.execute(
        f"WITH n AS ({n}), o AS (SELECT o.qid, o.event_id, o.filename FROM read_parquet({sql_list(old)}, "
        f"union_by_name = true, filename = true) AS o SEMI JOIN n ON o.qid = n.qid AND o.event_id = n.event_id) "
        f"SELECT DISTINCT filename FROM (SELECT filename, count(*) OVER (PARTITION BY qid, event_id) AS c "
        f"FROM (SELECT * FROM n UNION ALL SELECT * FROM o)) WHERE c > 1"
    ).fetchall()
    return {r[0] for r in rows}


def segment_stamps(root: Path, files: Sequence[Path]) -> list[tuple[str, int, int]]:
    """Each segment's path under the store root, size and modification time, sorted."""
    stamps = []
    for f in files:
        st = f.stat()
        stamps.append((f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    return sorted(stamps)


def projection_key(stamps: list[tuple[str, int, int]]) -> str:
    """Identity of a set of segments (see segment_stamps)."""
    return stable_hash(PROJECTION_VERSION, stamps, length=24)


def _projection_path(root: Path, kind: str, experiment: str | None, key: str) -> Path:
    scope = experiment if experiment else "@all"  # '@' is not allowed in an experiment's name
    return root / PROJECTIONS_DIR / kind / scope / f"overlaps-{key}.json"


def _write_atomically(path: Path, text: str) -> None:
    write_text_atomically(path, text)
    for stale in path.parent.glob("overlaps-*.json"):  # the same kind and experiment, other segments
        if stale != path:
            with contextlib.suppress(OSError):
                stale.unlink()


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
        if data["version"] == PROJECTION_VERSION and isinstance(data["overlapping"], list):
            data["files"] = [tuple(f) for f in data["files"]]
            return data
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def overlap_projection(con: duckdb.DuckDBPyConnection, store: EventStore, kind: str, experiment: str | None,
                       segments: Sequence[Path], use_cache: bool = True) -> set[str]:
    """The overlapping segments (paths relative to the store) among the segments of a kind that a view
    covers (`experiment`'s, or every experiment's for None). From the cached projection when it matches
    the segments; else extended from a cached projection of a subset of them (segments were added: only
    the new segments' events are compared with the rest); else computed over every segment. Cached when
    the store is writable."""
    root = store.root
    if len(segments) < 2:
        return set()
    stamps = segment_stamps(root, segments)
    path = _projection_path(root, kind, experiment, projection_key(stamps)) if use_cache else None
    if path is not None:
        cached = _load(path) if path.exists() else None
        if cached is not None and cached["files"] == stamps:
            return set(cached["overlapping"])
    abs_of = {rel: str(root / rel) for rel, _, _ in stamps}
    rel_of = {str(p): p.relative_to(root).as_posix() for p in segments} | {a: r for r, a in abs_of.items()}
    base = None
    if path is not None:  # the newest cached projection of a subset of these segments
        current = set(stamps)
        candidates = sorted(path.parent.glob("overlaps-*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for other in candidates:
            data = _load(other)
            if data is not None and set(data["files"]) <= current:
                base = data
                break
    if base is not None:
        old = {rel for rel, _, _ in base["files"]}
        new = [str(p) for p in segments if rel_of[str(p)] not in old]
        added = overlapping_with_new(con, [abs_of[r] for r in sorted(old)], new)
        overlapping = set(base["overlapping"]) | {rel_of[f] for f in added}
    else:
        overlapping = {rel_of[f] for f in overlapping_segments(con, list(rel_of))}
    if path is not None:
        with contextlib.suppress(OSError):  # a read-only store: use it without caching it
            _write_atomically(path, json.dumps({"version": PROJECTION_VERSION, "kind": kind, "experiment": experiment,
                                                "files": stamps, "overlapping": sorted(overlapping)}))
    return overlapping


def view_select(con: duckdb.DuckDBPyConnection, files: Sequence[str], overlapping: set[str],
                uniform: bool = False) -> str:
    """SELECT showing each event of `files` once, given which of them overlap (absolute or store paths). `uniform`:
    every file has the same columns in the same order (packs of one layout), so DuckDB reads one file's schema
    instead of unifying every file's."""
    clean = [f for f in files if f not in overlapping]
    dup = [f for f in files if f in overlapping]
    if not dup:
        union = "false" if uniform else "true"
        return without_bookkeeping(f"SELECT * FROM read_parquet({sql_list(clean)}, union_by_name = {union})", files)
    if not clean:
        return dedupe_select(dup)
    # the same columns, in the same order, as one read_parquet over every file would give
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet({sql_list(files)}, union_by_name = true)").fetchall()
    cols = [r[0] for r in described]
    select = ", ".join('"' + c.replace('"', '""') + '"' for c in cols)
    return without_bookkeeping(f"SELECT {select} FROM (SELECT * FROM read_parquet({sql_list(clean)}, union_by_name = "
                               f"true) UNION ALL BY NAME {_dedupe(dup)})", files)


def kind_select(con: duckdb.DuckDBPyConnection, store: EventStore, kind: str, experiments: Sequence[str] | None,
                use_cache: bool = True) -> tuple[str | None, list[str]]:
    """The SELECT of a view of one kind over the experiments (every one for None), each event once, and the files
    it reads; (None, []) when they hold no such events. Events of two experiments never share an id (the id hashes
    the experiment), so overlaps are looked for within each experiment, and only where it has several files: a
    compacted experiment has one, and costs no look at all."""
    files: list[Path] = []
    overlapping: set[str] = set()
    layouts = set()
    for name in experiments if experiments is not None else store.experiments(kind):
        segments = store.segments(kind, name)
        files += segments
        if len(segments) > 1:
            overlapping |= {str(store.root / rel) for rel in overlap_projection(con, store, kind, name, segments,
                                                                                use_cache)}
        entry = load_catalog(store.root, name).entry(kind)
        layouts.add(entry.columns if entry is not None and len(segments) == 1 else None)
    if not files:
        return None, []
    paths = [str(f) for f in files]
    return view_select(con, paths, overlapping, uniform=None not in layouts and len(layouts) == 1), paths
