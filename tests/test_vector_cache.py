"""Embeddings kept on the machine (engines/vector_cache.py): each distinct text is encoded once per machine, read
back bit for bit, and a cache that cannot be used never stops an embedding."""

from __future__ import annotations

import subprocess
import sys
import uuid

import numpy as np
import pytest

from engines import semantic
from engines.vector_cache import VectorCache


@pytest.fixture
def kept(tmp_path, monkeypatch):
    """A fresh process's view: no vector in memory, the kept ones in tmp_path; encode() counted."""
    cache = VectorCache(tmp_path / "embeddings" / "v.sqlite", 384)
    monkeypatch.setattr(semantic, "_kept", lambda: cache)
    monkeypatch.setattr(semantic, "_cache", {})
    import engines.onnx_encoder as onnx_encoder

    encoded: list[list[str]] = []
    real = onnx_encoder.encode

    def counting(texts: list[str]) -> np.ndarray:
        encoded.append(list(texts))
        return real(texts)

    monkeypatch.setattr(onnx_encoder, "encode", counting)
    return cache, encoded


def test_a_text_is_encoded_once_and_read_back_bit_for_bit(kept, monkeypatch):
    cache, encoded = kept
    first = semantic.embed(["Denver Broncos", "Santa Clara", "Denver Broncos"])
    assert encoded == [["Denver Broncos", "Santa Clara"]]
    assert np.array_equal(first[0], first[2])

    monkeypatch.setattr(semantic, "_cache", {})  # another process on the same machine
    again = semantic.embed(["Santa Clara", "Denver Broncos", "Levi's Stadium"])
    assert encoded[1:] == [["Levi's Stadium"]]  # only the new text
    assert np.array_equal(again[0], first[1]) and np.array_equal(again[1], first[0])
    assert np.isclose(np.linalg.norm(again[2]), 1.0, atol=1e-5)
    assert set(cache.get(["Denver Broncos", "Santa Clara", "Levi's Stadium", "never seen"])) == {
        "Denver Broncos", "Santa Clara", "Levi's Stadium"}


def test_a_damaged_cache_file_is_left_aside_and_every_text_still_embedded(kept, tmp_path):
    cache, encoded = kept
    cache.path.parent.mkdir(parents=True)
    cache.path.write_bytes(b"this is not a database" * 100)
    vectors = semantic.embed(["Paris", "Lutetia"])
    assert encoded == [["Paris", "Lutetia"]] and vectors.shape == (2, 384)
    assert semantic.max_similarity(["Paris"], [["Paris", "London"]])[0] == pytest.approx(1.0, abs=1e-5)


def test_a_cache_that_cannot_be_opened_still_embeds(kept):
    cache, encoded = kept
    cache.path.mkdir(parents=True)  # a folder where the database should be: SQLite cannot open it
    assert semantic.embed(["Paris"]).shape == (1, 384) and encoded == [["Paris"]]
    assert semantic.embed(["Paris"]).shape == (1, 384) and encoded == [["Paris"]]  # then from memory


def test_a_row_of_the_wrong_size_is_encoded_again(kept):
    cache, encoded = kept
    cache.put([("Paris", np.zeros(3, dtype=np.float32))])
    assert cache.get(["Paris"]) == {}
    semantic.embed(["Paris"])
    assert encoded == [["Paris"]]


def test_a_second_process_reads_kept_vectors_without_loading_the_encoder():
    """As a rerun of the evaluate stage in a new process: the texts were embedded before on this machine, so the
    semantic match loads neither ONNX Runtime nor the model."""
    texts = [f"answer {uuid.uuid4().hex}", f"gold {uuid.uuid4().hex}"]
    program = ("import sys; from engines.semantic import max_similarity; "
               f"print(round(max_similarity([{texts[0]!r}], [[{texts[1]!r}]])[0], 6), 'onnxruntime' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout.split()
    second = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout.split()
    assert first[1] == "True" and second == [first[0], "False"]
