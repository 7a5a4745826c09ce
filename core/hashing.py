"""The content hash behind event ids, segment names and cache keys: the lowest layer, so that a retriever, the store
layout and the event store share one definition without importing each other."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def stable_hash(*parts: Any, length: int = 32) -> str:
    """Content hash of JSON-serialisable parts (sorted keys), used for ids and cache keys."""
    payload = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:length]
