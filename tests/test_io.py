"""Atomic writes: a failure mid-write leaves the previous file intact and no temp files; JSON writes
turn numpy/torch scalars into numbers and refuse anything else by key path. Provenance: which
changes mark a commit dirty."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

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


def test_untracked_code_marks_the_run_dirty_and_is_listed(tmp_path):
    import subprocess

    from zeromismatch._provenance import git_state

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "code.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("venv/\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    clean, untracked = git_state(tmp_path / "pkg")
    assert len(clean) == 40 and untracked == []
    # untracked files that are not code, code under results/, and ignored code leave it clean
    (tmp_path / "notes.txt").write_text("todo\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "plot.py").write_text("")
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "site.py").write_text("")
    assert git_state(tmp_path / "pkg") == (clean, [])
    # a new module is code that runs: dirty, and named
    (tmp_path / "pkg" / "new_kernel.py").write_text("y = 2\n")
    (tmp_path / "pkg" / "sub").mkdir()
    (tmp_path / "pkg" / "sub" / "helper.py").write_text("")
    assert git_state(tmp_path / "pkg") == (clean + "-dirty", ["pkg/new_kernel.py", "pkg/sub/helper.py"])


def test_provenance_records_the_untracked_code_list():
    from zeromismatch._provenance import UNTRACKED_LISTED, git_state, provenance

    record = provenance({"a": 1}, argv=["x"])
    _, untracked = git_state()
    if untracked is None:
        assert record["untracked_code"] is None
    else:
        assert record["untracked_code"] == {"count": len(untracked), "files": untracked[:UNTRACKED_LISTED]}


def test_numpy_and_torch_scalars_are_written_as_numbers(tmp_path):
    path = tmp_path / "summary.json"
    atomic_write_json(
        path,
        {
            "loss": np.float32(0.5),
            "steps": np.int64(3),
            "ok": np.bool_(True),
            "kl": torch.tensor(0.25, dtype=torch.float64),
            "count": torch.tensor(7),
            "zero_d": np.array(1.5),
            "list": [np.float64(2.0), (torch.tensor(False),)],
        },
    )
    assert json.loads(path.read_text()) == {
        "loss": 0.5,
        "steps": 3,
        "ok": True,
        "kl": 0.25,
        "count": 7,
        "zero_d": 1.5,
        "list": [2.0, [False]],
    }
    assert '"loss": 0.5' in path.read_text()  # a number, not the string "0.5"


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"run": {"dirs": [1, Path("x")]}}, "not JSON-serialisable at run.dirs[1]: "),
        ({"weights": torch.zeros(2)}, "at weights: tensor of shape (2,)"),
        ({"a": {"b": np.ones(3)}}, "at a.b: numpy array of shape (3,)"),
        ({"c": np.complex128(1j)}, "at c: complex128 holding 1j"),
        ({"m": {(1, 2): 3}}, "at m: key (1, 2) of type tuple"),
        (object(), "at (top level): object"),
    ],
)
def test_anything_else_is_a_type_error_naming_the_key_and_the_file_is_untouched(tmp_path, value, where):
    path = tmp_path / "summary.json"
    atomic_write_text(path, "old")
    with pytest.raises(TypeError) as raised:
        atomic_write_json(path, value)
    assert where in str(raised.value)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_process_reports_the_git_state_it_started_with(monkeypatch):
    # a learnability suite ran for an hour while commits landed; its later runs recorded the new HEAD
    # (and "-dirty") for code the process had loaded before
    from zeromismatch import _provenance

    monkeypatch.setattr(_provenance, "_PROCESS_STATE", None)
    states = iter([("a" * 40, []), ("b" * 40 + "-dirty", [])])
    monkeypatch.setattr(_provenance, "_local_git_state", lambda where: next(states))
    _provenance.freeze_git_state()
    assert _provenance.git_commit() == "a" * 40
    assert _provenance.provenance()["git_commit"] == "a" * 40  # the checkout moved on; the process did not
