"""How a pydantic validation error reads in ragledger's messages: one sentence naming the value given, which
pydantic's own messages leave out. Written once for the spec's fields (schemas/spec.py) and a reader entry's settings
(schemas/reader_entry.py)."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
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


def _field(err: Mapping[str, Any]) -> str:
    return ".".join(str(p) for p in err["loc"]) or "<root>"


def field_errors(errors: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each error of `ValidationError.errors()` as "field 'model.temperature': <message>", in order, each on no more
    than its line. A required field missing beside an unknown field of the same mapping whose name is close to it
    (difflib) is one typo, said once: "field 'retriever': unknown field (did you mean 'retrievers'?)"."""
    missing = [_field(e) for e in errors if e["type"] == "missing"]
    meant: dict[str, str] = {}  # an unknown field -> the missing field it stands for
    for err in errors:
        if err["type"] == "extra_forbidden":
            parent, _, name = _field(err).rpartition(".")
            siblings = {f.rpartition(".")[2]: f for f in missing if f.rpartition(".")[0] == parent and f not in meant.values()}
            if close := difflib.get_close_matches(name, list(siblings), n=1):
                meant[_field(err)] = siblings[close[0]]
    out = []
    for err in errors:
        field = _field(err)
        if err["type"] == "missing" and field in meant.values():
            continue  # said with the unknown field that stands for it
        hint = f" (did you mean {meant[field].rpartition('.')[2]!r}?)" if field in meant else ""
        out.append(f"field '{field}': {' '.join(pydantic_message(err).splitlines())}{hint}")
    return out
