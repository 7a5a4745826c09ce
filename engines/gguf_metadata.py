"""What a GGUF file says it is: the `general.*` entries of its own metadata, read from its header.

A GGUF file starts with the magic `GGUF`, a format version (2 or 3 here), its tensor count and its metadata count,
then the metadata as (key, value type, value) entries, little-endian; strings are a 64-bit length and UTF-8 bytes,
arrays an element type, a 64-bit count and the elements (the format's specification: ggml's docs/gguf.md). The
entries are read in order and every array is skipped over, so only the header is read, never a tensor. Written here,
in the standard library, rather than taken from the `gguf` package, which ragledger does not otherwise need.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# value type -> struct format of one element (8 is a string, 9 an array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LONGEST_STRING = 1 << 24  # a chat template is the longest string in a model's header (a few KB)
# llama.cpp's `general.file_type`: how most of a file's tensors are quantised (llama.h, enum llama_ftype)
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              32: "BF16"}


class GGUFError(ValueError):
    """Not a GGUF file, or a header cut short."""


@dataclass(frozen=True)
class GGUFIdentity:
    """The model a GGUF file names itself: its `general.*` metadata (absent entries are None)."""

    name: str | None  # general.name, e.g. "Qwen2.5 Coder 0.5B Instruct AWQ"
    basename: str | None  # general.basename, e.g. "Qwen2.5-Coder"
    finetune: str | None  # general.finetune, e.g. "Instruct-AWQ"
    size_label: str | None  # general.size_label, e.g. "0.5B"
    architecture: str | None  # general.architecture, e.g. "qwen2"
    file_type: int | None  # general.file_type (FILE_TYPES), e.g. 15 for Q4_K_M

    @property
    def quantisation(self) -> str | None:
        return None if self.file_type is None else FILE_TYPES.get(self.file_type, f"file type {self.file_type}")


def read_identity(path: Path) -> GGUFIdentity:
    """The `general.*` metadata of the GGUF file at `path`; GGUFError naming the file if it is not one."""
    wanted = {"general.name", "general.basename", "general.finetune", "general.size_label", "general.architecture",
              "general.file_type"}
    found: dict[str, object] = {}
    try:
        with path.open("rb") as f:
            for key, value in _entries(f):
                if key in wanted:
                    found[key] = value
    except (struct.error, UnicodeDecodeError, EOFError) as exc:
        raise GGUFError(f"{path}: not a readable GGUF header ({exc})") from None
    text = {k: v if isinstance(v, str) else None for k, v in found.items()}
    file_type = found.get("general.file_type")
    return GGUFIdentity(text.get("general.name"), text.get("general.basename"), text.get("general.finetune"),
                        text.get("general.size_label"), text.get("general.architecture"),
                        file_type if isinstance(file_type, int) else None)


def _entries(f: BinaryIO):
    """(key, value) of every metadata entry; arrays are skipped (value None)."""
    magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{getattr(f, 'name', 'file')}: not a GGUF file (starts with {magic!r})")
    version, _tensors, count = struct.unpack("<IQQ", _read(f, 20))
    if version not in (2, 3):
        raise GGUFError(f"{getattr(f, 'name', 'file')}: GGUF version {version}, not 2 or 3")
    for _ in range(count):
        key = _string(f)
        (kind,) = struct.unpack("<I", _read(f, 4))
        yield key, _value(f, kind)


def _value(f: BinaryIO, kind: int) -> object:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        element, n = struct.unpack("<IQ", _read(f, 12))
        if element == _STRING:
            for _ in range(n):
                (length,) = struct.unpack("<Q", _read(f, 8))
                f.seek(length, 1)
        elif element in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[element]) * n, 1)
        else:  # nested arrays: no model file in use has them
            raise GGUFError(f"{getattr(f, 'name', 'file')}: array of GGUF type {element}")
        return None
    if kind not in _SCALARS:
        raise GGUFError(f"{getattr(f, 'name', 'file')}: unknown GGUF value type {kind}")
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", _read(f, 8))
    if length > _LONGEST_STRING:  # a corrupt length, not a string: read no further
        raise EOFError(f"a string of {length} bytes at byte {f.tell()}")
    return _read(f, length).decode("utf-8")


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError(f"header ends after {f.tell()} bytes")
    return data
