"""ragledger: event-sourced experiment tracking for retrieval-augmented QA research."""

__version__ = "0.1.0"
