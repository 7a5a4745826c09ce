"""The record schemas' error, apart from the schemas themselves: `ragledger run` names its user errors before it
loads the spec (ragledger/cli_common.py `user_errors`), and importing schemas.records there would import pandas and
pandera (0.6 s and more of a cold start) before the head start starts the JVM (flows/head_start.py)."""

from __future__ import annotations


class RecordValidationError(ValueError):
    """A batch of records failed its schema; nothing was written."""
