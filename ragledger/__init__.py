"""ragledger: event-sourced experiment tracking for retrieval-augmented QA research.

The top layer: the command line (`ragledger.cli` and its `cli_*` modules), what only it starts (the Prefect and
MLflow servers, the run log), and the Python API (docs/api.md). Below it: flows, tasks, tracking, schemas,
strategies, engines, core (tests/test_architecture.py).

The Python API, versioned with the command line (`ragledger.__version__`):

    import ragledger
    store = ragledger.open_store(".ragledger/store")
    store.readers_table("demo"); store.outcomes("demo", cell="bm25@5 post_fusion"); store.query("SELECT ...")
    result = ragledger.run("configs/demo.yaml")

Its names are imported on first use, so `import ragledger` (and `ragledger --help`) loads no pandas, DuckDB or
Prefect."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core import __version__ as __version__

if TYPE_CHECKING:
    from ragledger.api import Analysis, Flips, Lineage, RagledgerError, Store, open_store
    from ragledger.running import RunResult, run

# public name -> the module defining it
_API = {"open_store": "ragledger.api", "Store": "ragledger.api", "RagledgerError": "ragledger.api",
        "Flips": "ragledger.api", "Analysis": "ragledger.api", "Lineage": "ragledger.api",
        "run": "ragledger.running", "RunResult": "ragledger.running"}

__all__ = ["Analysis", "Flips", "Lineage", "RagledgerError", "RunResult", "Store", "__version__", "open_store", "run"]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'ragledger' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
