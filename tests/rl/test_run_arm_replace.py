"""``run_arm`` replaces a finished result by renames only: a crash between them leaves the old result
aside, and the next call puts it back before it trains (so a failed rerun still leaves the old one)."""

from __future__ import annotations

import json
import os

import pytest

import zeromismatch.rl
from zeromismatch.experiment import runner


class _Arm:
    config = None


ARM = _Arm()  # run_arm reads only .config, which the fake train below ignores


def _fake_train(tag: str):
    def train(config, out, resume=False, quiet=True):
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"tag": tag}))
        return {"tag": tag}

    return train


def _tag(final) -> str:
    return json.loads((final / "summary.json").read_text())["tag"]


def test_a_crash_between_the_renames_is_recovered(tmp_path, monkeypatch):
    final = tmp_path / "arm"
    monkeypatch.setattr(zeromismatch.rl, "train", _fake_train("old"))
    runner.run_arm(ARM, str(final))
    assert _tag(final) == "old"

    real_replace = os.replace

    def crash_on_rename_in(src, dst):
        if str(dst) == str(final):
            raise KeyboardInterrupt("killed between the renames")
        real_replace(src, dst)

    monkeypatch.setattr(zeromismatch.rl, "train", _fake_train("new"))
    monkeypatch.setattr(runner.os, "replace", crash_on_rename_in)
    with pytest.raises(KeyboardInterrupt):
        runner.run_arm(ARM, str(final))
    monkeypatch.setattr(runner.os, "replace", real_replace)
    assert not final.exists() and _tag(tmp_path / ".arm.old") == "old"  # the old result is aside, whole

    def failing_train(config, out, resume=False, quiet=True):
        raise ValueError("the rerun fails")

    monkeypatch.setattr(zeromismatch.rl, "train", failing_train)
    with pytest.raises(ValueError):
        runner.run_arm(ARM, str(final))
    assert _tag(final) == "old"  # put back before the rerun began

    monkeypatch.setattr(zeromismatch.rl, "train", _fake_train("new"))
    assert runner.run_arm(ARM, str(final)) == {"tag": "new"}
    assert _tag(final) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arm"]  # nothing aside, nothing partial


def test_an_aside_left_after_the_new_result_was_in_is_dropped(tmp_path, monkeypatch):
    final = tmp_path / "arm"
    (tmp_path / ".arm.old").mkdir()
    (tmp_path / ".arm.old" / "summary.json").write_text(json.dumps({"tag": "stale"}))
    final.mkdir()
    (final / "summary.json").write_text(json.dumps({"tag": "current"}))
    monkeypatch.setattr(zeromismatch.rl, "train", _fake_train("next"))
    runner.run_arm(ARM, str(final))
    assert _tag(final) == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arm"]


def test_a_second_process_on_the_same_arm_is_refused_before_it_touches_anything(tmp_path, monkeypatch):
    """Two launchers sharing an out root: the one that comes second must not remove the first one's
    in-progress ``.partial`` (it did, and the first then sealed a truncated run as finished)."""
    from zeromismatch.io import DirectoryLockedError, directory_lock

    final = tmp_path / "arm"
    partial = tmp_path / ".arm.partial"
    partial.mkdir()
    (partial / "metrics.jsonl").write_text('{"step": 0}\n')
    monkeypatch.setattr(zeromismatch.rl, "train", lambda *a, **k: pytest.fail("trained under another's lock"))
    with directory_lock(tmp_path, "run of arm arm", name=".arm.lock"):  # the first launcher, mid-run
        locked = r"in use by another run of arm arm \(pid \d+ holds .*\.arm\.lock\)"
        with pytest.raises(DirectoryLockedError, match=locked):
            runner.run_arm(ARM, str(final))
    assert (partial / "metrics.jsonl").read_text() == '{"step": 0}\n' and not final.exists()
    monkeypatch.setattr(zeromismatch.rl, "train", _fake_train("after"))
    assert runner.run_arm(ARM, str(final)) == {"tag": "after"}  # released: the arm runs
