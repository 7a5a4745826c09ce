"""Where ragledger reads data and keeps its caches."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from core.hashing import stable_hash

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


def file_identity(p: Path) -> tuple[str, int, int, int, int]:
    """A file as it is now: its resolved path, inode, size, modification time and status-change time. What is kept
    per file (a parsed dataset, a corpus table) is named by it, so a changed file is read afresh; the inode and ctime
    catch a file replaced by a copy that kept the old size and mtime (`cp -p`, `rsync -t`), which no user can set."""
    st = p.stat()
    return str(p.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def index_root() -> Path:
    """Retrieval indexes, keyed by corpus hash and shared by every store, experiment and checkout on the machine:
    $RAGLEDGER_INDEX_DIR, default <cache_home>/indexes."""
    return Path(os.environ.get("RAGLEDGER_INDEX_DIR") or cache_home() / "indexes")


@dataclass(frozen=True)
class StoreLayout:
    """Every path under a store, named once (tracking/store/events.py writes the segments, tracking/mlflow/sync.py the
    pending markers, tasks/context.py opens the call cache)."""

    root: Path

    # the names at the top of a store besides one folder per record kind and the catalogs' folder
    # (tracking/store/identity.py tells a store from another folder by them)
    RUNS: ClassVar[str] = "runs"
    PROJECTIONS: ClassVar[str] = "projections"
    MLFLOW_PENDING: ClassVar[str] = "mlflow-pending"
    ANALYSIS: ClassVar[str] = "analysis"
    PULLS: ClassVar[str] = ".pull"  # a pull's downloads before they move in, and its locks (tracking/mlflow/pull.py)
    LLM_CACHE: ClassVar[str] = "llm_cache.sqlite"
    REMOTE: ClassVar[str] = ".remote"  # a mirror's URL and tags, for a store at an s3:// URL (tracking/store/remote.py)
    CALLPACKS: ClassVar[str] = "callpacks"  # an s3:// store's shared LLM calls, content-named (tracking/store/remote.py)
    TOP_LEVEL: ClassVar[tuple[str, ...]] = (RUNS, PROJECTIONS, MLFLOW_PENDING, ANALYSIS, PULLS, LLM_CACHE, REMOTE,
                                            CALLPACKS)

    @classmethod
    def of(cls, root: str | Path) -> StoreLayout:
        return cls(Path(root))

    def records(self, kind: str, experiment: str) -> Path:
        """The directory of one record kind's segments of one experiment."""
        return self.root / kind / experiment

    def segment(self, kind: str, experiment: str, event_ids: list[str]) -> Path:
        """Where the segment holding exactly these events is (EventStore.write names it by them)."""
        return self.records(kind, experiment) / f"seg-{stable_hash(kind, sorted(event_ids), length=24)}.parquet"

    def runs(self, experiment: str) -> Path:
        """Run manifests and the run's analysis files (recall curve, readers table)."""
        return self.root / self.RUNS / experiment

    def manifest(self, experiment: str, stamp: str, run_token: str) -> Path:
        return self.runs(experiment) / f"{stamp}-{run_token[:8]}.json"

    def manifests(self, experiment: str) -> list[Path]:
        """Run manifests of an experiment, oldest first (names start with a UTC timestamp; mtime breaks ties)."""
        d = self.runs(experiment)
        files = list(d.glob("*.json")) if d.is_dir() else []
        return sorted(files, key=lambda p: (p.name[:15], p.stat().st_mtime, p.name))

    def recall_curve_dir(self, experiment: str, tag: str) -> Path:
        return self.runs(experiment) / f"recall-{tag}"

    def readers_table_dir(self, experiment: str, tag: str) -> Path:
        return self.runs(experiment) / f"readers-{tag}"

    def analysis(self, experiment: str) -> Path:
        """`ragledger analyze` output when no --out is given."""
        return self.root / self.ANALYSIS / experiment

    @property
    def projections(self) -> Path:
        return self.root / self.PROJECTIONS

    @property
    def metrics_projection(self) -> Path:
        """Cell metrics, one file per set of segments (tracking/analysis/metrics.py)."""
        return self.projections / "metrics"

    def stage_result(self, key: str) -> Path:
        """A stage task's result, kept under its key (tasks/stage_runs.py): rebuildable, as every projection."""
        return self.projections / "stages" / key[:2] / f"{key}.json"

    @property
    def llm_cache(self) -> Path:
        """The LLM-call cache (resolved: one connection per file per process)."""
        return self.root.resolve() / self.LLM_CACHE

    def mlflow_pending(self, experiment: str) -> Path:
        return self.root / self.MLFLOW_PENDING / experiment

    @property
    def indexes(self) -> Path:
        """Not under the store: indexes are shared by every store (index_root)."""
        return index_root()
