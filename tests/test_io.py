"""Atomic writes: complete file or nothing, normal permissions, no temp files left."""

import os

import pytest

from fedmedbench.workflow import io


def test_atomic_write_success_and_permissions(tmp_path):
    target = tmp_path / "sub" / "x.json"
    io.write_json(target, {"a": 1})
    assert io.read_json(target) == {"a": 1}
    mask = os.umask(0)
    os.umask(mask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]


def test_failure_leaves_previous_version_and_no_temp(tmp_path):
    target = tmp_path / "x.txt"
    io.write_text(target, "old")
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.txt"]


def test_temp_name_keeps_extension(tmp_path):
    with io.atomic_path(tmp_path / "fig.png") as tmp:
        assert tmp.suffix == ".png"
        tmp.write_bytes(b"x")
