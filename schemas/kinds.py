"""The record kinds' names, apart from their schemas: telling a store by its folders (tracking/store/identity.py)
happens before `ragledger run` starts its head start, and importing schemas.records there would import pandas and
pandera (schemas/errors.py says why that matters). schemas/records.py keys RECORD_MODELS by these names."""

from __future__ import annotations

RECORD_KINDS: tuple[str, ...] = ("questions", "retrievals", "generations", "votes", "outcomes")
