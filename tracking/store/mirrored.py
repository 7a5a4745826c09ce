"""What makes a folder the mirror of a store at a URL, and a record file it lacks fetched when a reader asks for it.

A mirror (tracking/store/remote.py) names the URL it stands for in `.remote/origin.json`. Several machines' mirrors
of one store hold the same files under other roots: a Dask worker on another host writes its segments into its own
mirror and the bucket, and names them by its own root. So a record file named under any machine's mirror is, in
this one, `<kind>/<experiment>/<file>` under this mirror's root (`on_this_mirror`), and one it lacks is fetched from
the bucket when asked for (`fetched`): by catalog.py `segment_exists` (a stage result's check), and by events.py
`EventStore.read`. Kept apart from remote.py so that the catalog can use it without importing remote.py.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from core.atomic import atomic_write_bytes
from core.paths import StoreLayout
from tracking.store.objects import S3Objects, s3_objects

ORIGIN = "origin.json"


@lru_cache(maxsize=64)
def origin_url(root: Path) -> str | None:
    """The URL of the store a folder mirrors; None for a store that is its own folder."""
    try:
        return json.loads((root / StoreLayout.REMOTE / ORIGIN).read_text())["url"]
    except (FileNotFoundError, NotADirectoryError, ValueError, KeyError):
        return None


@lru_cache(maxsize=16)
def objects_at(url: str) -> S3Objects:
    return s3_objects(url)


def on_this_mirror(root: Path, path: str | Path) -> Path:
    """A record file `<root'>/<kind>/<experiment>/<file>`, named under any machine's mirror of the store, as `root`
    names it."""
    p = Path(path)
    if p.parents[2] == root:
        return p
    return root / p.parents[1].name / p.parent.name / p.name


def fetched(path: str | Path) -> bool:
    """Whether the record file at `path`, missing from the mirror it lies in, was fetched from that mirror's bucket
    now; False for a folder store, and for a name the bucket does not hold either."""
    p = Path(path)
    if len(p.parents) < 3:  # not <root>/<kind>/<experiment>/<file>
        return False
    root = p.parents[2]
    url = origin_url(root)
    if url is None:
        return False
    got = objects_at(url).get(p.relative_to(root).as_posix())
    if got is None:
        return False
    atomic_write_bytes(p, got[0])
    return True
