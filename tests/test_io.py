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


def test_git_commit_is_dirty_for_code_changes_but_not_for_results(tmp_path):
    import subprocess

    from zeromismatch._provenance import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "run.json").write_text("{}\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean = git_commit(tmp_path / "pkg")
    assert len(clean) == 40
    (tmp_path / "results" / "run.json").write_text('{"reward": 1}\n')  # a reproduction rewrote a result
    assert git_commit(tmp_path / "pkg") == clean
    (tmp_path / "pkg" / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path / "pkg") == clean + "-dirty"
