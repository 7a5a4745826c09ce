"""A store at an object-storage URL (`s3://bucket/prefix`), read and written through a local folder that mirrors it.

Every reader and writer of a store works on a folder (tracking/store/ledger.py, events.py, compaction.py, the views):
a store at a URL is given to them as its *mirror*, a folder under $RAGLEDGER_HOME/stores/ that this module keeps in
step with the bucket through the storage seam (tracking/store/objects.py):

- before a command reads, `pull_down` fetches every object the mirror lacks (by name: a segment or pack is content-
  named, so one already held is the same bytes) and every updated file (a catalog, a run manifest) whose tag changed;
  DuckDB and pyarrow then read local files: no httpfs extension, nothing downloaded by DuckDB at run time;
- a segment is put in the bucket as it is written (EventStore.write calls `put_segment`), create-only; a run on the
  thread runner, which no other process reads while it runs, puts its segments at its end instead (`pushed`);
- when a command that writes ends (a run, a compaction), `push_up` puts every other durable file: packs create-only,
  catalogs and manifests by compare-and-swap against the tag last seen, so a writer that did not see another's
  commit fails instead of overwriting it; after a compaction, `collect` deletes the objects its committed catalog
  made unread.

The LLM calls are shared as call packs (tracking/store/callpack.py), not as the SQLite cache itself: `push_up` puts the
calls of the mirror's cache that no pack it has seen holds as one content-named pack `callpacks/<sha>.jsonl.gz`
(create-only), and `pull_down` imports every pack the machine has not imported yet into the local cache, keyed as a
run keys them; so a second machine rerunning or extending an experiment of the store calls the model only for new work.

What stays on the machine and never goes to the bucket: the LLM-call cache file (SQLite), projections (rebuildable),
MLflow's pending markers, a pull's downloads. The mirror's `.remote/` folder holds the URL (never a credential) and
the tags of the updated files as last seen.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from core.atomic import atomic_write_bytes, atomic_write_text
from core.paths import StoreLayout, cache_home
from schemas.kinds import RECORD_KINDS
from tracking.store.catalog import CATALOG_DIR, PackEntry, load_catalog
from tracking.store.identity import NotAStoreError, StoreState, classify
from tracking.store.mirrored import ORIGIN, objects_at, origin_url
from tracking.store.objects import ConflictError, S3Objects, StorageError, endpoint, is_s3_url, s3_objects

TAGS = "tags.json"
IMPORTED = "callpacks.json"  # the call packs this mirror's cache holds every call of (imported, or put by it)
PACK_SUFFIX = ".jsonl.gz"
_tags_lock = threading.Lock()


def mirror_root(url: str) -> Path:
    """The mirror of the store at `url` on this machine: one per endpoint and URL."""
    name = hashlib.sha256(f"{endpoint() or ''}\n{url.rstrip('/')}".encode()).hexdigest()[:16]
    return cache_home().absolute() / "stores" / name


def _durable(key: str) -> bool:
    """Whether a store file belongs in the bucket: records, catalogs, run manifests, analysis outputs."""
    parts = key.split("/")
    if any(p.startswith(".tmp-") for p in parts):
        return False
    if parts[0] in RECORD_KINDS:
        return len(parts) == 3 and parts[2].endswith(".parquet") and parts[2].startswith(("seg-", "pack-"))
    if parts[0] == CATALOG_DIR:
        return len(parts) == 2 and parts[1].endswith(".json")
    if parts[0] == StoreLayout.CALLPACKS:
        return len(parts) == 2 and parts[1].endswith(PACK_SUFFIX)
    return parts[0] in (StoreLayout.RUNS, StoreLayout.ANALYSIS) and len(parts) >= 2


def _immutable(key: str) -> bool:
    """Content-named: records and call packs (a name already held is the same content)."""
    top = key.split("/")[0]
    return top in RECORD_KINDS or top == StoreLayout.CALLPACKS


# a run manifest names its segments by path: in the bucket relative to the store, in a mirror under the mirror's root,
# so that machines whose mirrors lie in other places read the same manifest
BUCKET_ROOT = "s3-store:"


def _rooted(key: str) -> bool:
    return key.startswith(f"{StoreLayout.RUNS}/") and key.endswith(".json")


def _to_bucket(root: Path, key: str, data: bytes) -> bytes:
    if not _rooted(key):
        return data
    return data.replace(json.dumps(f"{root}/")[1:-1].encode(), BUCKET_ROOT.encode())


def _from_bucket(root: Path, key: str, data: bytes) -> bytes:
    if not _rooted(key):
        return data
    return data.replace(BUCKET_ROOT.encode(), json.dumps(f"{root}/")[1:-1].encode())


class _KeyListing:
    """tracking/store/identity.py's listing over a bucket's keys."""

    def __init__(self, keys: list[str]):
        self.keys = keys

    def names(self, *parts: str) -> list[str] | None:
        head = "/".join(parts) + "/" if parts else ""
        found = sorted({k[len(head):].split("/")[0] for k in self.keys if k.startswith(head)})
        return found or (None if parts else [])

    def is_file(self) -> bool:
        return False


def _load_tags(root: Path) -> dict[str, list[str]]:
    try:
        return json.loads((root / StoreLayout.REMOTE / TAGS).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _save_tag(root: Path, key: str, tag: str, data: bytes) -> None:
    with _tags_lock:
        tags = _load_tags(root)
        tags[key] = [tag, hashlib.sha256(data).hexdigest()]
        atomic_write_text(root / StoreLayout.REMOTE / TAGS, json.dumps(tags, sort_keys=True))


def remote_of(root: str | Path) -> S3Objects | None:
    """The bucket a mirror stands for; None for a store that is its own folder."""
    url = origin_url(Path(root))
    return objects_at(url) if url else None


def open_remote(url: str, what: str = "--store", creating: bool = False, writing: bool = False) -> Path:
    """The mirror of the store at `url`, brought up to date: NotAStoreError or StorageError (one line each, naming
    the URL) unless the bucket is reachable and the prefix holds a store, or, for a command that makes one
    (`creating`), nothing yet or only a store's own names; and, for a command that writes (`writing`, or
    `creating`), unless the credentials may write there. Nothing is written before these are known."""
    objects = s3_objects(url, what)
    keys = list(objects.list())
    check = classify(_KeyListing(keys))
    if not (check.state is StoreState.STORE or (creating and check.state in (StoreState.EMPTY, StoreState.MISSING))):
        if check.state is StoreState.FOREIGN:
            raise NotAStoreError(f"{what} {url}: not a ragledger store: it holds {', '.join(check.foreign[:3])} and no "
                                 "records, run manifests or call cache")
        raise NotAStoreError(f"{what} {url}: not a ragledger store: it holds no records or run manifests")
    if creating or writing:
        objects.check_writable()
    root = mirror_root(url)
    (root / StoreLayout.REMOTE).mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / StoreLayout.REMOTE / ORIGIN, json.dumps({"url": url.rstrip("/")}))
    origin_url.cache_clear()
    pull_down(root, objects)
    return root


def pull_down(root: Path, objects: S3Objects) -> int:
    """Fetch into the mirror what it lacks or holds an older version of; the number of objects fetched."""
    tags = _load_tags(root)
    fetched = 0
    # catalogs first, then in each folder its pack before its segments ('pack-' < 'seg-'), so that what a held catalog
    # made unread is not fetched while it waits out its retention time in the bucket (a machine that compacted deleted
    # its own copies)
    listing = objects.list()
    for key in sorted(listing, key=lambda k: (not k.startswith(f"{CATALOG_DIR}/"), k)):
        tag = listing[key]
        if not _durable(key) or _unread(root, key):
            continue
        path = root / key
        if _immutable(key) and path.exists():
            continue
        if not _immutable(key) and tags.get(key, [None])[0] == tag and path.exists():
            continue
        got = objects.get(key)
        if got is None:  # deleted since the listing (a compaction's garbage)
            continue
        data = _from_bucket(root, key, got[0])
        atomic_write_bytes(path, data)
        if not _immutable(key):
            _save_tag(root, key, got[1], data)
        fetched += 1
    fetched += _fetch_missing_packs(root, objects)
    import_calls(root)
    return fetched


def _unread(root: Path, key: str) -> bool:
    """Whether a record object is one the mirror's catalog made unread (a compacted segment, a replaced pack), its pack
    held: a reader of the mirror reads that pack instead."""
    parts = key.split("/")
    if parts[0] not in RECORD_KINDS or len(parts) != 3:
        return False
    entry = load_catalog(root, parts[1]).entry(parts[0])
    if entry is None or not (root / parts[0] / parts[1] / entry.pack).exists():
        return False
    return _made_unread(entry, parts[2])


def _made_unread(entry: PackEntry, name: str) -> bool:
    """Whether the record file `name` of an entry's folder is one its catalog made unread: a segment it packed, or
    a pack it replaced."""
    return name in entry.segments or (name.startswith("pack-") and name != entry.pack)


def _fetch_missing_packs(root: Path, objects: S3Objects) -> int:
    """The packs the mirror's catalogs name that it lacks: a catalog committed between the listing and its fetch names
    a pack the listing did not hold."""
    fetched = 0
    for path in (root / CATALOG_DIR).glob("*.json"):
        catalog = load_catalog(root, path.stem)
        for kind, entry in catalog.kinds.items():
            key = f"{kind}/{catalog.experiment}/{entry.pack}"
            if (root / key).exists():
                continue
            got = objects.get(key)
            if got is not None:
                atomic_write_bytes(root / key, got[0])
                fetched += 1
    return fetched


def _imported(root: Path) -> set[str]:
    try:
        return set(json.loads((root / StoreLayout.REMOTE / IMPORTED).read_text()))
    except (FileNotFoundError, ValueError):
        return set()


def _save_imported(root: Path, names: set[str]) -> None:
    atomic_write_text(root / StoreLayout.REMOTE / IMPORTED, json.dumps(sorted(names)))


def import_calls(root: Path) -> int:
    """Import into the mirror's LLM-call cache the calls of every call pack in the mirror it has not imported yet
    (a key already cached keeps its response: same key, same call); the number of calls new to the cache. A pack that
    fails its checks is a StorageError naming it, and nothing of it is imported."""
    from engines.llm_cache import LLMCallCache
    from tracking.store import callpack

    done = _imported(root)
    todo = sorted(p for p in (root / StoreLayout.CALLPACKS).glob(f"*{PACK_SUFFIX}") if p.name not in done)
    if not todo:
        return 0
    added = 0
    cache = LLMCallCache(callpack.cache_path(root))
    try:
        for path in todo:
            try:
                added += callpack.import_file(path, cache).added
            except callpack.CallPackError as exc:
                why = str(exc).removeprefix(f"{path}: ")
                raise StorageError(f"{origin_url(root)}/{StoreLayout.CALLPACKS}/{path.name}: {why}") from None
            done.add(path.name)
            _save_imported(root, done)
    finally:
        cache.close()
    return added


def publish_calls(root: Path) -> str | None:
    """Write in the mirror, as one call pack, the calls of its LLM-call cache that no pack it has imported or put
    holds; its key (`callpacks/<sha>.jsonl.gz`, for `push_up` to put create-only), or None when there are none.

    Why "not in a pack seen" rather than "the calls of the run that ends": the cache knows no run, and this way a
    failed run's calls, calls made before the store was shared, and calls of a command other than `run` are shared
    too, while calls imported from the bucket are never put back. The name is the digest of the pack's call lines, so
    two machines that made the same calls name one object and the create-only put keeps the first."""
    from engines.llm_cache import LLMCallCache
    from tracking.store import callpack

    cache_file = callpack.cache_path(root)
    if not cache_file.exists():
        return None
    known: set[str] = set()
    for path in (root / StoreLayout.CALLPACKS).glob(f"*{PACK_SUFFIX}"):
        known.update(_keys_of_pack(str(path), path.stat().st_size))
    cache = LLMCallCache(cache_file)
    try:
        # no request details: the cache does not say which records asked (as `ragledger cache export` without --experiment)
        fresh = {k: {} for k in cache.all_keys() if k not in known}
        if not fresh:
            return None
        data, head = callpack.build(cache, fresh)
    finally:
        cache.close()
    name = f"{head['sha256'][:32]}{PACK_SUFFIX}"
    callpack.write(root / StoreLayout.CALLPACKS / name, data)
    _save_imported(root, _imported(root) | {name})
    return f"{StoreLayout.CALLPACKS}/{name}"


@functools.lru_cache(maxsize=64)
def _keys_of_pack(path: str, size: int) -> frozenset[str]:
    """The call keys a call pack holds, read once per process: a pack is named by its content, and a Dask worker
    publishes after each task that called the model (`size` tells a pack rewritten under the same name)."""
    from tracking.store import callpack

    return frozenset(c["key"] for c in callpack.read(path).calls)


RUN_MIRRORS_KEPT = 32  # runs a long-lived worker remembers its mirror for (one small entry each)
_run_mirrors: collections.OrderedDict[tuple[str, str], Path] = collections.OrderedDict()
_run_mirrors_lock = threading.Lock()
_calls_lock = threading.Lock()


def mirror_for_run(url: str, run_token: str) -> Path:
    """This machine's mirror of the store at `url`, brought up to date once for the run `run_token`: a Dask worker
    on another host, whose first task of a run fetches what the bucket holds (the calls other machines made
    included), reaches the rest of the run's records as it reads them (tracking/store/mirrored.py)."""
    with _run_mirrors_lock:
        if (url, run_token) not in _run_mirrors:
            _run_mirrors[(url, run_token)] = open_remote(url, writing=True)
            while len(_run_mirrors) > RUN_MIRRORS_KEPT:  # the oldest runs' (a run's tasks come within it)
                _run_mirrors.popitem(last=False)
        return _run_mirrors[(url, run_token)]


def share_calls(root: Path) -> None:
    """The mirror's model calls that no call pack holds yet, put in its bucket now as one pack: a Dask worker's, after
    each of its tasks (it has no command's end to push them at), so another machine makes none of them again."""
    objects = remote_of(root)
    if objects is None:
        return
    with _calls_lock:  # a worker's tasks end in several threads: each of its calls in one pack
        key = publish_calls(root)
        if key is not None:
            objects.put_new(key, (root / key).read_bytes())


# mirrors whose segments wait for the command's end (`pushed(..., segments_at_end=True)`)
_segments_at_end: set[Path] = set()


def put_segment(root: Path, path: Path) -> None:
    """Put one content-named record file of a mirror in its bucket (create-only); nothing for a folder store, nor
    while the command writing the mirror puts its segments at its end."""
    if Path(root) in _segments_at_end:
        return
    objects = remote_of(root)
    if objects is not None:
        objects.put_new(path.relative_to(root).as_posix(), path.read_bytes())


def push_up(root: str | Path, collect: bool = False) -> int:
    """Put in the bucket every durable file of the mirror it does not hold as the mirror does (records create-only;
    catalogs, manifests and analysis files by compare-and-swap); then, with `collect`, delete the record objects the
    committed catalogs made unread. Nothing for a folder store. The number of objects put."""
    root = Path(root)
    objects = remote_of(root)
    if objects is None:
        return 0
    publish_calls(root)
    held = objects.list()
    tags = _load_tags(root)
    put = 0
    # records before catalogs: a catalog is committed only once the packs it names are in the bucket
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: (not _immutable(_key(root, p)), str(p)))
    for path in files:
        key = _key(root, path)
        if not _durable(key):
            continue
        if _immutable(key):
            if key not in held:
                put += objects.put_new(key, path.read_bytes())
            continue
        data = path.read_bytes()
        seen = tags.get(key)
        if seen is not None and seen[1] == hashlib.sha256(data).hexdigest():
            continue  # as last put or fetched: nothing of this machine's to put (the bucket may hold a newer one)
        try:
            tag = objects.put_if(key, _to_bucket(root, key, data), seen[0] if seen else None)
        except ConflictError:
            raise ConflictError(f"{objects.location.url}/{key}: changed by another writer since this machine read "
                                "it; run the command again") from None
        _save_tag(root, key, tag, data)
        put += 1
    if collect:
        _collect(root, objects, objects.list())
    return put


@contextlib.contextmanager
def pushed(root: str | Path, segments_at_end: bool = False) -> Iterator[None]:
    """Around a command that writes the store at `root`: at its end, what it wrote goes to the bucket and the objects
    committed catalogs made unread are collected; when it fails, what it did write still goes (its own error is the
    one raised). Nothing for a folder store.

    `segments_at_end`: no process but this one reads the command's segments before it ends (a run on the thread
    runner), so they are not put as they are written but with the rest at the end: the segments a compaction at the
    run's end replaced by packs are never put (nor deleted later), two requests fewer per segment. A killed command
    leaves them in the mirror, and the next command that writes it puts them."""
    deferred = segments_at_end and remote_of(Path(root)) is not None
    if deferred:
        _segments_at_end.add(Path(root))
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            push_up(root)
        raise
    finally:
        _segments_at_end.discard(Path(root))
    push_up(root, collect=True)


def _key(root: Path, path: Path) -> str:
    return path.relative_to(root).as_posix()


def retention_s() -> float:
    """How long objects a committed catalog made unread stay in the bucket (RAGLEDGER_STORE_RETENTION_S, default an
    hour): a reader on another machine that listed the store before the commit may still fetch them meanwhile; there
    are no locks across machines to ask it."""
    return float(os.environ.get("RAGLEDGER_STORE_RETENTION_S", "3600"))


def _collect(root: Path, objects: S3Objects, held: dict[str, str]) -> None:
    """Delete the segments a committed catalog names and the packs it does not (tracking/store/catalog.py: no
    reader of that catalog reads them), once that catalog has been in the bucket longer than the retention time;
    younger ones wait for a later command that collects (a run's end, `store compact`)."""
    import time

    committed = objects.modified(CATALOG_DIR)
    cutoff = time.time() - retention_s()
    for key in sorted(held):
        parts = key.split("/")
        if parts[0] not in RECORD_KINDS or len(parts) != 3:
            continue
        if committed.get(f"{CATALOG_DIR}/{parts[1]}.json", cutoff + 1) > cutoff:
            continue  # committed too recently (or no catalog): a reader may still need the object
        entry = load_catalog(root, parts[1]).entry(parts[0])
        if entry is None:
            continue
        if _made_unread(entry, parts[2]):
            objects.delete(key)


def local_root(location: str | os.PathLike[str], what: str = "--store", creating: bool = False,
               writing: bool = False) -> str:
    """The folder a command reads or writes for a store named by a path or a URL: the path itself, or an s3://
    store's mirror brought up to date (`writing`: the credentials checked for writes too)."""
    text = os.fspath(location)
    return str(open_remote(text, what, creating, writing)) if is_s3_url(text) else text


__all__ = ["ConflictError", "StorageError", "import_calls", "local_root", "mirror_for_run", "open_remote", "publish_calls",
           "pull_down", "push_up", "pushed", "put_segment", "remote_of", "share_calls"]
