"""A cell of an experiment: one retriever x one reader (the spec's reader label) x one model.

Its name, "retriever · reader · model", is what stores, MLflow runs and tables key cells by; this is the one place
that builds and splits it.
"""

from __future__ import annotations

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
