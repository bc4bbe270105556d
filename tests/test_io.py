"""Atomic writes: a failure mid-write leaves the previous file intact and no temp files."""

from __future__ import annotations

import json

import pytest

from zeromismatch.io import atomic_write_json, atomic_write_text


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "sub" / "summary.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"b": 2})
    assert json.loads(path.read_text()) == {"b": 2}
    assert [p.name for p in path.parent.iterdir()] == ["summary.json"]


def test_crash_during_write_keeps_old_content(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic_write_text(path, "old")

    def crash(fd):
        raise OSError("disk vanished mid-write")

    # the temp file is fully written when fsync runs: a crash there is the worst case
    monkeypatch.setattr("zeromismatch.io.os.fsync", crash)
    with pytest.raises(OSError, match="disk vanished"):
        atomic_write_json(path, {"new": "content"})
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_written_files_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644
