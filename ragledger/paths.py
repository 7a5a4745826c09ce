"""Where ragledger reads data and keeps its caches."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """Real QA data: $RAGLEDGER_DATA, default ../shared/data relative to the project root."""
    env = os.environ.get("RAGLEDGER_DATA")
    if env:
        return Path(env).expanduser().resolve()
    for base in (Path.cwd(), REPO_ROOT):
        candidate = (base / ".." / "shared" / "data").resolve()
        if candidate.is_dir():
            return candidate
    return (Path.cwd() / ".." / "shared" / "data").resolve()


def cache_home() -> Path:
    """Models, built wheels and indexes shared across checkouts: $RAGLEDGER_HOME or ~/.cache/ragledger."""
    return Path(os.environ.get("RAGLEDGER_HOME", Path.home() / ".cache" / "ragledger")).expanduser()


def resolve_data_path(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else data_dir() / p
