"""A run holds its directory's lock for as long as it runs: a second `zm train --resume` on the same
directory is one clear error and changes nothing; a lock left by a killed process does not block."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from rl_helpers import tiny_config

from zeromismatch.cli import main
from zeromismatch.io import LOCK_FILE, DirectoryLockedError, directory_lock
from zeromismatch.rl import loop, train

TINY_FLAGS = ["--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4", "--eval-size", "2",
              "--eval-samples", "1", "--quiet"]  # fmt: skip

HOLDER = """
import sys
from zeromismatch.io import directory_lock
with directory_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def finished_run(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(steps=1, checkpoint_every=1), out, quiet=True)
    return out


def _snapshot(out) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_second_resume_while_a_run_holds_the_directory_is_one_error(finished_run, capsys):
    before = _snapshot(finished_run)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(finished_run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        code = main(["train", "--steps", "1", "--checkpoint-every", "1", *TINY_FLAGS, "--resume",
                     "--out", str(finished_run)])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2
        assert err.count("\n") == 1 and "Traceback" not in err
        assert "is in use by another run" in err and f"pid {holder.pid}" in err
        # the holder's lock file aside, nothing was written (no second copy of the metrics, no restart)
        assert {k: v for k, v in _snapshot(finished_run).items() if k != LOCK_FILE} == before
    finally:
        holder.communicate("")
    assert holder.returncode == 0
    assert not (finished_run / LOCK_FILE).exists()  # released and removed


def test_the_lock_is_held_for_the_whole_run(tmp_path, monkeypatch):
    out = tmp_path / "run"
    seen = []
    real = loop.summarize

    def summarize_while_probing(*args, **kwargs):
        with pytest.raises(DirectoryLockedError):  # the run's last step (its summary) is still under the lock
            with directory_lock(out):
                pass
        seen.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "summarize", summarize_while_probing)
    train(tiny_config(steps=1), out, quiet=True)
    assert seen == [True]
    assert not (out / LOCK_FILE).exists()


def test_a_stale_lock_file_of_a_killed_run_does_not_block(finished_run):
    (finished_run / LOCK_FILE).write_text("pid 999999\n")  # a SIGKILLed holder leaves its file, not its lock
    summary = train(tiny_config(steps=1, checkpoint_every=1), finished_run, resume=True, quiet=True)
    assert summary["steps"] == 1
    assert not (finished_run / LOCK_FILE).exists()
