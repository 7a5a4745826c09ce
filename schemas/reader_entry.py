"""A spec's reader entry: a registered reader's name, that reader's own settings (its `Settings` model,
strategies/readers) and a label. The entry is written flat in YAML ({name, label?, <setting>: ...}) and validated
against the named reader's model, so a knob is declared once, beside the reader that reads it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, model_serializer

from schemas.messages import pydantic_message
from strategies.readers.base import ReaderSettings

# The reader entry's settings before each reader declared its own, at their defaults then. Entries are hashed and
# keyed as they were (tests/test_plan_pinning.py), so stores and caches written then keep answering, and a stored spec
# naming one of these at its default for a reader without it still reads.
LEGACY_DEFAULTS: dict[str, Any] = {"samples": 1, "sample_temperature": 0.7, "feedback_k": None, "feedback_samples": None,
                                   "shots": None, "show_initial": False, "candidates": None, "vote": "majority"}
LEGACY_KEYED = ("samples", "sample_temperature", "feedback_k", "feedback_samples")  # in every changed entry's key
LEGACY_HASHED = tuple(k for k in LEGACY_DEFAULTS if k != "candidates")  # in every mapping entry's spec hash


class ReaderEntry(BaseModel):
    """A reader with settings: its name, its own settings (the reader's `Settings` model, strategies/readers) and a
    label, written flat ({name, label?, <setting>: ...}); a plain string in `readers` is the name with the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., description="a registered reader strategy (strategies/readers READERS)")
    settings: SerializeAsAny[ReaderSettings] = Field(default_factory=ReaderSettings, description="the reader's own "
                                                     "settings, each written beside `name` (the reader table below)")
    label: str | None = Field(None, min_length=1, pattern=r"^[^·\[\]]+$",
                              description="cell label; default derived from the settings")

    @model_serializer(mode="wrap")
    def _flat(self, handler: Any) -> dict:
        d = handler(self)
        return {"name": d["name"], **d["settings"], "label": d["label"]}

    @classmethod
    def parse(cls, value: str | dict, where: str = "readers") -> ReaderEntry:
        """An entry validated against its reader's own settings model; a bad one raises ValueError naming the
        entry, the field and the value."""
        from strategies.readers import READERS

        data = {"name": value} if isinstance(value, str) else dict(value)
        name, label = data.pop("name", None), data.pop("label", None)
        if name not in READERS:
            raise ValueError(f"{where}.name: unknown reader strategy {name!r}; known: {', '.join(sorted(READERS))}")
        model = READERS[name].Settings
        for k, v in data.items():
            if k not in model.model_fields and LEGACY_DEFAULTS.get(k, ...) != v:
                users = sorted(n for n, r in READERS.items() if k in r.Settings.model_fields)
                where_else = f"; it is a setting of {', '.join(users)}" if users else ""
                raise ValueError(f"{where}.{k}: {v!r}: {name!r} has no setting {k!r} (its settings: "
                                 f"{', '.join(model.model_fields) or 'none'}){where_else}")
        try:
            settings = model.model_validate({k: v for k, v in data.items() if k in model.model_fields})
            return cls(name=name, settings=settings, label=label)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"] if p != "settings") or "label"
            raise ValueError(f"{where}.{field}: {pydantic_message(err)}") from None

    def _changed(self, exclude: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The settings that differ from the reader's defaults, in the reader's field order."""
        own, default = self.settings.model_dump(exclude=set(exclude)), type(self.settings)().model_dump()
        return {k: v for k, v in own.items() if v != default[k]}

    def call_settings(self) -> dict[str, Any]:
        """What of the settings enters the generate cache keys: {} at the defaults (plain names keep their keys),
        else every setting that changes model calls, the legacy ones always (as they were keyed)."""
        changed = self._changed(self.settings.decides_only)
        if not changed:
            return {}
        own = self.settings.model_dump()
        return {**{k: own.get(k, LEGACY_DEFAULTS[k]) for k in LEGACY_KEYED}, **changed}

    def hashed(self) -> dict[str, Any]:
        """The entry as the spec hash reads it: the legacy settings always, any other setting when it is set."""
        own = self.settings.model_dump()
        legacy = {k: own.get(k, LEGACY_DEFAULTS[k]) for k in LEGACY_HASHED}
        return {"name": self.name, "label": self.label, **legacy, **self._changed()}

    @property
    def vote(self) -> str:
        """How the answer pool becomes one answer (a pool reader's `vote`; the vote key of every other reader)."""
        return getattr(self.settings, "vote", LEGACY_DEFAULTS["vote"])

    @property
    def key(self) -> str:
        """The reader label used in cell names and the records' `reader` column: the name, plus any non-default setting."""
        if self.label:
            return self.label
        diff = [f"{k}={v}" for k, v in self._changed().items()]
        return f"{self.name}({','.join(diff)})" if diff else self.name  # no [ ]: rich reads them as markup
