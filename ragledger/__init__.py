"""ragledger: event-sourced experiment tracking for retrieval-augmented QA research.

The top layer: the command line (`ragledger.cli` and its `cli_*` modules) and what only it starts (the Prefect and
MLflow servers, the run log). Below it: flows, tasks, tracking, schemas, strategies, engines, core
(tests/test_architecture.py)."""

from core import __version__ as __version__
