"""How a pydantic validation error reads in ragledger's messages: one sentence naming the value given, which
pydantic's own messages leave out. Written once for the spec's fields (schemas/spec.py) and a reader entry's settings
(schemas/reader_entry.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pydantic_message(err: Mapping[str, Any]) -> str:
    """One error of `ValidationError.errors()`: "'wikipedia-xl' is not one of ...", "Input should be greater than 0,
    got -5". The messages of our own validators name their value already, and a missing field has none."""
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] in ("literal_error", "enum"):
        return f"{err['input']!r} is not one of {err['ctx']['expected']}"
    given = err.get("input")
    plain = err["type"] in ("value_error", "missing") or isinstance(given, dict | list)
    return err["msg"].removeprefix("Value error, ") + ("" if plain else f", got {given!r}")
