"""Whether a place is a ragledger store: asked by every command before it reads or writes one, so that a mistyped
`--store` names the folder in one error line instead of littering it (a compaction's lock, a projection).

A store is told by the files only ragledger writes there (docs/concepts.md, "The store layout"):

- a record file, `<kind>/<experiment>/seg-*.parquet` or `pack-*.parquet`, for a record kind;
- a catalog, `compacted/<experiment>.json`;
- a run manifest, `runs/<experiment>/*.json`;
- the LLM-call cache, `llm_cache.sqlite`.

A folder holding none of them is *empty* when it holds nothing else than a store's own names (nothing, or what a
store holds before its first record: `projections/`, `compacted/.readers.lock`, `.pull/`, ...): a command that makes
a store (`run`, `pull`, `cache import`) may write there, one that reads a store may not. Any other content makes it
*foreign*: no command writes there.

The question is asked of the store through `StoreListing` (the names under a path, as a folder's listing or an
object store's prefixes), so the same rules tell a store wherever its files are kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Protocol

from core.paths import StoreLayout
from schemas.kinds import RECORD_KINDS
from tracking.store.catalog import CATALOG_DIR

# the names a store holds at its top, records or not
STORE_NAMES = frozenset({*RECORD_KINDS, CATALOG_DIR, *StoreLayout.TOP_LEVEL})
TEMP_PREFIX = ".tmp-"  # an atomic write's temporary file (core/atomic.py)
SHOWN = 3  # foreign names quoted in a message


class NotAStoreError(ValueError):
    """The place given as a store is not one (or, for a command that makes one, not new, empty or a store)."""


class StoreListing(Protocol):
    def names(self, *parts: str) -> list[str] | None:
        """The names directly under `<store>/<parts...>`; None when that is not a folder (nothing, or a file)."""

    def is_file(self) -> bool:
        """Whether the store's own path is a file."""


@dataclass(frozen=True)
class FolderListing:
    """A store kept as a folder on a file system."""

    root: Path

    def names(self, *parts: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self.root.joinpath(*parts)))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_file(self) -> bool:
        return self.root.exists() and not self.root.is_dir()


class StoreState(Enum):
    MISSING = "missing"
    FILE = "file"
    EMPTY = "empty"  # no records, and nothing that is not a store's
    STORE = "store"
    FOREIGN = "foreign"  # no records, and something a store does not hold


@dataclass(frozen=True)
class StoreCheck:
    state: StoreState
    foreign: tuple[str, ...] = ()  # the names at its top that are not a store's (FOREIGN)


def _own(name: str) -> bool:
    return name in STORE_NAMES or name.startswith((StoreLayout.LLM_CACHE, TEMP_PREFIX))


def _record_files(listing: StoreListing, top: list[str]) -> Iterator[str]:
    """The store's own files, lazily: the first one found answers the question."""
    if StoreLayout.LLM_CACHE in top:
        yield StoreLayout.LLM_CACHE
    for kind in (k for k in RECORD_KINDS if k in top):
        for experiment in listing.names(kind) or []:
            yield from (n for n in listing.names(kind, experiment) or []
                        if n.startswith(("seg-", "pack-")) and n.endswith(".parquet"))
    if CATALOG_DIR in top:
        yield from (n for n in listing.names(CATALOG_DIR) or [] if n.endswith(".json"))
    if StoreLayout.RUNS in top:
        for experiment in listing.names(StoreLayout.RUNS) or []:
            yield from (n for n in listing.names(StoreLayout.RUNS, experiment) or [] if n.endswith(".json"))


def classify(listing: StoreListing) -> StoreCheck:
    """What the listed place is, as a store (the module's docstring gives the rules)."""
    top = listing.names()
    if top is None:
        return StoreCheck(StoreState.FILE if listing.is_file() else StoreState.MISSING)
    if next(_record_files(listing, top), None) is not None:
        return StoreCheck(StoreState.STORE)
    foreign = tuple(n for n in top if not _own(n))
    return StoreCheck(StoreState.FOREIGN, foreign) if foreign else StoreCheck(StoreState.EMPTY)


def store_state(root: str | Path) -> StoreCheck:
    return classify(FolderListing(Path(root)))


def require_store(root: str | Path, what: str = "--store", creating: bool = False) -> None:
    """Raise NotAStoreError, naming `what` (the option or setting) and the folder, unless `root` is a store, or, when
    the command makes one (`creating`), a folder still to be made or an empty one."""
    check = store_state(root)
    if check.state is StoreState.STORE or (creating and check.state in (StoreState.MISSING, StoreState.EMPTY)):
        return
    shown = f"{what} {root}"
    if check.state is StoreState.MISSING:
        raise NotAStoreError(f"{shown}: no such directory")
    if check.state is StoreState.FILE:
        raise NotAStoreError(f"{shown}: a file, not a store directory")
    if check.state is StoreState.EMPTY:
        raise NotAStoreError(f"{shown}: not a ragledger store: it holds no records, run manifests or call cache")
    names = ", ".join(check.foreign[:SHOWN]) + (f" and {len(check.foreign) - SHOWN} more" if len(check.foreign) > SHOWN
                                                 else "")
    need = "a new or empty folder, or an existing store" if creating else "an existing store"
    raise NotAStoreError(f"{shown}: not a ragledger store: it holds {names} and no records, run manifests or call "
                         f"cache; give {need}")
