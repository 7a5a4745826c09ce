"""core.cell: the one builder and parser of cell names."""

from __future__ import annotations

import pytest

from core.cell import Cell, is_ensemble_retriever


def test_name_is_the_stored_format():
    cell = Cell("bm25@5", "post_fusion(samples=2)", "qwen2.5-0.5b-instruct")
    assert cell.name == "bm25@5 · post_fusion(samples=2) · qwen2.5-0.5b-instruct"
    assert str(cell) == cell.name
    assert not cell.is_ensemble


@pytest.mark.parametrize("name", [
    "none · concatenation · scripted",
    "eor(bm25@5,dense@5,pooling=mean) · post_fusion · scripted",
    "hybrid(bm25@5,dense@5) · sure(samples=2,show_initial=True) · gpt-4o-mini",
])
def test_parse_round_trips(name):
    cell = Cell.parse(name)
    assert cell.name == name
    assert Cell.parse(cell.name) == cell


def test_ensemble():
    cell = Cell.parse("eor(bm25@5,dense@5,pooling=mean) · concatenation · m")
    assert cell.is_ensemble and cell.retriever == "eor(bm25@5,dense@5,pooling=mean)"
    assert is_ensemble_retriever("eor(a,b)") and not is_ensemble_retriever("bm25@5")


@pytest.mark.parametrize("bad", ["bm25@5", "a · b", "a · b · c · d", " · b · c", "a·b·c"])
def test_parse_refuses_other_shapes(bad):
    with pytest.raises(ValueError, match="not a cell name"):
        Cell.parse(bad)


def test_frozen_and_ordered():
    a, b = Cell("a", "r", "m"), Cell("b", "r", "m")
    assert sorted([b, a]) == [a, b]
    with pytest.raises(AttributeError):
        a.retriever = "x"  # type: ignore[misc]
