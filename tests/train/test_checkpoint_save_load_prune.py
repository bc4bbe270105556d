"""Checkpoint edge cases: unreadable files give CheckpointError, a crash while re-saving the step
LATEST names never leaves LATEST dangling, and pruning orders checkpoints by integer step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zeromismatch.train import checkpoint as ck


@pytest.fixture
def saved(tmp_path):
    ck.save_checkpoint(tmp_path, 1, {"x": 1}, {"note": "first"})
    return tmp_path


@pytest.mark.parametrize(
    ("name", "payload"),
    [("state.pt", b"not a pickle at all"), ("state.pt", b""), ("meta.json", b"{}"),
     ("meta.json", b'{"step": "one"}'), ("meta.json", b"[1]"), ("meta.json", b"{oops")],
)  # fmt: skip
def test_unreadable_checkpoint_is_a_checkpoint_error(saved, name, payload):
    path = saved / "step_000001"
    (path / name).write_bytes(payload)
    with pytest.raises(ck.CheckpointError, match="unreadable"):
        ck.load_checkpoint(path)


def test_crash_while_resaving_the_latest_step_keeps_a_loadable_latest(saved):
    """Kill the process at the rename that puts the new copy of LATEST's step in place."""
    code = f"""
import os
from zeromismatch.train import checkpoint as ck
real = os.replace
def dying_replace(src, dst):
    if str(dst).endswith("step_000001"):
        os._exit(17)
    return real(src, dst)
ck.os.replace = dying_replace
ck.save_checkpoint({str(saved)!r}, 1, {{"x": 2}}, {{}})
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 17
    latest = ck.latest_checkpoint(saved)
    loaded = ck.load_checkpoint(latest)
    assert (loaded.step, loaded.state, loaded.meta["note"]) == (1, {"x": 1}, "first")
    # a later re-save of the step completes and leaves nothing aside
    ck.save_checkpoint(saved, 1, {"x": 3}, {})
    assert ck.latest_checkpoint(saved) == saved / "step_000001"
    assert ck.load_checkpoint(saved / "step_000001").state == {"x": 3}
    assert not list(saved.glob(".step_*.previous"))  # (the crashed save's temp dir stays, as before)


def test_resave_of_the_latest_step_replaces_it(saved):
    ck.save_checkpoint(saved, 1, {"x": 2}, {})
    assert ck.load_checkpoint(ck.latest_checkpoint(saved)).state == {"x": 2}
    assert sorted(p.name for p in saved.iterdir()) == ["LATEST", "step_000001"]


def test_prune_orders_by_integer_step(tmp_path):
    for step in (999998, 999999, 1000000, 1000001):
        ck.save_checkpoint(tmp_path, step, {"s": step}, {})
    ck.prune_checkpoints(tmp_path, keep=2)
    assert (tmp_path / ck.LATEST).read_text().strip() == "step_1000001"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_1000000", "step_1000001"]
