"""core.atomic: a file appears whole or not at all, and a failed write leaves no temporary file."""

from __future__ import annotations

import os

import pytest

from core.atomic import atomic_path, atomic_write_bytes, atomic_write_text, temp_path


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


def test_publish_dir_moves_a_build_into_place_and_a_lost_race_to_a_finished_build_is_fine(tmp_path):
    from core.atomic import COMPLETE_MARKER, publish_dir

    target = tmp_path / "index"
    for i in range(2):  # two builders of the same index; the second loses the rename
        built = tmp_path / f"build{i}"
        built.mkdir()
        (built / "data").write_text(str(i))
        publish_dir(built, target, "hash")
    assert (target / "data").read_text() == "0" and (target / COMPLETE_MARKER).read_text() == "hash"
    unfinished = tmp_path / "unfinished"
    (unfinished / "x").mkdir(parents=True)  # a non-empty target without the marker: a broken earlier build
    built = tmp_path / "build2"
    built.mkdir()
    with pytest.raises(OSError):
        publish_dir(built, unfinished, "hash")
