"""ragledger.atomic: a file appears whole or not at all, and a failed write leaves no temporary file."""

from __future__ import annotations

import os

import pytest

from ragledger.atomic import atomic_path, atomic_write_bytes, atomic_write_text, temp_path


def test_writes_replace_the_whole_file(tmp_path):
    target = tmp_path / "sub" / "x.json"
    atomic_write_text(target, "first")
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "x.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_temp_names_carry_the_writer_pid_beside_the_target(tmp_path):
    tmp = temp_path(tmp_path, ".parquet")
    assert tmp.parent == tmp_path and tmp.name.startswith(f".tmp-{os.getpid()}-") and tmp.suffix == ".parquet"
    with atomic_path(tmp_path / "seg.parquet") as inside:
        assert inside.parent == tmp_path and inside.name.startswith(f".tmp-{os.getpid()}-")
        inside.write_bytes(b"x")
    assert (tmp_path / "seg.parquet").read_bytes() == b"x"
