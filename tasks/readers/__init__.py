"""Reader strategies. Adding one = one module here plus one entry in READERS."""

from __future__ import annotations

from tasks.readers.base import Reader
from tasks.readers.concatenation import Concatenation
from tasks.readers.post_fusion import PostFusion

READERS: dict[str, type[Reader]] = {
    Concatenation.name: Concatenation,
    PostFusion.name: PostFusion,
}


def get_reader(name: str) -> Reader:
    try:
        return READERS[name]()
    except KeyError:
        raise ValueError(f"unknown reader strategy {name!r}; known: {', '.join(sorted(READERS))}") from None
