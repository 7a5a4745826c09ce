"""A cell of an experiment: one retriever x one reader (the spec's reader label) x one model.

Its name, "retriever · reader · model", is what stores, MLflow runs and tables key cells by; this is the one place
that builds and splits it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEPARATOR = " · "
ENSEMBLE_PREFIX = "eor("  # tracking/analysis/eor_cells.py names its ensemble retriever eor(<members>,pooling=<label>)


@dataclass(frozen=True, order=True)
class Cell:
    retriever: str
    reader: str  # the spec's reader label (ReaderEntry.key): the reader's name plus any non-default setting
    model: str  # the model's display name

    @property
    def name(self) -> str:
        return SEPARATOR.join((self.retriever, self.reader, self.model))

    @property
    def is_ensemble(self) -> bool:
        """An EoR cell: answers chosen among the retriever-cells of one (reader, model), not retrieved itself."""
        return is_ensemble_retriever(self.retriever)

    @classmethod
    def parse(cls, name: str) -> Cell:
        """The cell named `name`; ValueError unless it has exactly the three parts `name` builds (reader labels
        cannot hold '·': schemas/spec.py)."""
        parts = name.split(SEPARATOR)
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"not a cell name (retriever{SEPARATOR}reader{SEPARATOR}model): {name!r}")
        return cls(*parts)

    def __str__(self) -> str:
        return self.name


def is_ensemble_retriever(retriever: str) -> bool:
    """Whether a retriever name (a record's `retriever` column) is an EoR ensemble's."""
    return str(retriever).startswith(ENSEMBLE_PREFIX)


def resolve_cell(name: str, cells: list[str]) -> str:
    """A cell by exact name, or by words that pick exactly one cell ("bm25@5 post_fusion"): first words that each
    equal one part of the name, then words that each occur in it. ValueError naming the candidates otherwise."""
    if name in cells:
        return name
    words = [w for w in re.split(r"[\s·/]+", name.lower()) if w]
    hits = [c for c in cells if all(any(w == p.lower() for p in _parts(c)) for w in words)]
    if not hits:
        hits = [c for c in cells if all(w in c.lower() for w in words)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise ValueError(f"no cell matches {name!r}; cells: {', '.join(cells)}")
    raise ValueError(f"{name!r} matches {len(hits)} cells: {', '.join(hits)}")


def _parts(cell: str) -> tuple[str, ...]:
    """retriever, reader and model of a cell name; an ad-hoc name is one part."""
    try:
        c = Cell.parse(cell)
    except ValueError:
        return (cell.strip(),)
    return (c.retriever, c.reader, c.model)
