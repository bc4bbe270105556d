"""Kill and resume: a run killed after step k (or inside a checkpoint write) and resumed ends
bitwise-identical to an uninterrupted run — same weights hash, same metrics."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import train
from zeromismatch.train.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow

RUNNER = """
import json, sys
from zeromismatch.rl import RLConfig, train
config = RLConfig.from_dict(json.loads(sys.argv[1]))
train(config, sys.argv[2], resume=sys.argv[3] == "1", quiet=True)
"""


def _run(config, out, resume: bool, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(config.to_dict()), str(out), "1" if resume else "0"],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    config = tiny_config(steps=4, lag=2, checkpoint_every=1)
    summary = train(config, out, quiet=True)
    return config, summary, read_metrics(out)


def test_kill_after_step_then_resume_is_bitwise_identical(tmp_path, reference):
    config, summary, metrics = reference
    out = tmp_path / "run"
    killed = _run(config, out, resume=False, env={"ZM_CRASH_AFTER_STEP": "2"})
    assert killed.returncode == 13, killed.stderr[-2000:]
    assert latest_checkpoint(out / "checkpoints").name == "step_000002"
    resumed = _run(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["weights_sha256"] == summary["weights_sha256"]
    assert read_metrics(out) == metrics


def test_prefix_cache_counters_cover_the_whole_resumed_run(tmp_path):
    # Code-repair prompts share whole blocks: at lag 1, step 1 (version 0 again) hits the blocks step 0
    # cached, and step 2 (version 1) has nothing to hit, so killing after step 2 loses no hit. The
    # resumed engine counts from 0; the checkpoint carries the count before it.
    config = tiny_config(env="code_repair", max_new_tokens=8, steps=3, lag=1, checkpoint_every=1)
    uninterrupted = train(config, tmp_path / "whole", quiet=True)
    assert uninterrupted["prefix_cache_hits"] > 0
    out = tmp_path / "run"
    killed = _run(config, out, resume=False, env={"ZM_CRASH_AFTER_STEP": "2"})
    assert killed.returncode == 13, killed.stderr[-2000:]
    resumed = _run(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["weights_sha256"] == uninterrupted["weights_sha256"]
    assert summary["prefix_cache_hits"] == uninterrupted["prefix_cache_hits"]


def test_a_partial_last_metrics_line_is_dropped_on_resume(tmp_path, reference):
    config, summary, metrics = reference
    out = tmp_path / "run"
    killed = _run(config, out, resume=False, env={"ZM_CRASH_AFTER_STEP": "2"})
    assert killed.returncode == 13, killed.stderr[-2000:]
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "k3_k')  # a kill in the middle of a write
    resumed = _run(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_metrics(out) == metrics


def test_an_unversioned_prefix_cache_run_is_not_resumable(tmp_path):
    out = tmp_path / "run"
    config = tiny_config(steps=1, checkpoint_every=1, prefix_cache_versioned=False)
    train(config, out, quiet=True)
    with pytest.raises(ValueError, match="cannot be resumed"):
        train(config, out, resume=True, quiet=True)


def test_kill_during_checkpoint_write_keeps_previous_checkpoint(tmp_path, reference):
    config, summary, metrics = reference
    out = tmp_path / "run"
    killed = _run(config, out, resume=False, env={"ZM_CRASH_DURING_CHECKPOINT": "3"})
    assert killed.returncode == 17, killed.stderr[-2000:]
    # the half-written step 3 is invisible: LATEST still names step 2, whose files are complete
    assert latest_checkpoint(out / "checkpoints").name == "step_000002"
    resumed = _run(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["weights_sha256"] == summary["weights_sha256"]
    assert read_metrics(out) == metrics


def test_resume_with_a_different_config_is_refused(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(steps=1, checkpoint_every=1), out, quiet=True)
    with pytest.raises(ValueError, match="differs from the config given"):
        train(tiny_config(steps=2, checkpoint_every=1), out, resume=True, quiet=True)


@pytest.mark.parametrize("mode", ["keep", "abort"])
def test_kill_and_resume_with_inflight_updates_is_bitwise_identical(tmp_path, mode):
    """The same with the next version landing in the middle of each batch (rl/inflight.py): a batch's
    update is whole inside its step, so a checkpoint between steps holds everything a resume needs."""
    config = tiny_config(
        steps=4, lag=2, checkpoint_every=1, inflight_update_at_token=1, update_mode=mode, sft_steps=20,
        prompts_per_step=4, group_size=4, env_options={"max_digits": 1},
    )  # fmt: skip
    whole = train(config, tmp_path / "whole", quiet=True)
    metrics = read_metrics(tmp_path / "whole")
    assert [r["inflight_update_at_step"] for r in metrics][2:] == [1, 1]  # it did land in flight
    out = tmp_path / "run"
    killed = _run(config, out, resume=False, env={"ZM_CRASH_AFTER_STEP": "2"})
    assert killed.returncode == 13, killed.stderr[-2000:]
    resumed = _run(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["weights_sha256"] == whole["weights_sha256"]
    assert read_metrics(out) == metrics
