"""The Ray executor checkpoints and resumes like the in-process one, bit for bit.

- the driver killed after step k (``os._exit``, as a requeued Slurm job's driver is) and the run resumed
  with ``resume=True``: same weights hash and same records as an uninterrupted in-process run;
- the learner actor's process killed in the middle of a step: the run starts a new learner actor from the
  last checkpoint by itself, redoes the steps after it, and ends as the uninterrupted run, every step
  logged once; without checkpoints the same death ends the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import train
from zeromismatch.rl.actors import KILL_LEARNER_ENV
from zeromismatch.train.checkpoint import latest_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.cluster("ray")]

STEPS, LAG = 5, 2
RUNNER = """
import json, sys
from zeromismatch.rl import RLConfig, train
train(RLConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], resume=sys.argv[3] == "1", quiet=True)
"""


def _config(**changes):
    return tiny_config(steps=STEPS, lag=LAG, checkpoint_every=1, **changes)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, in-process at the actors' one torch thread."""
    out = tmp_path_factory.mktemp("reference") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = train(_config(), out, quiet=True)
    finally:
        torch.set_num_threads(threads)
    return summary, read_metrics(out)


def _subprocess(config, out, resume: bool, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(config.to_dict()), str(out), "1" if resume else "0"],
        env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_killed_ray_driver_resumes_bitwise(tmp_path, reference):
    summary, metrics = reference
    config, out = _config(executor="ray"), tmp_path / "run"
    killed = _subprocess(config, out, resume=False, env={"ZM_CRASH_AFTER_STEP": "2"})
    assert killed.returncode == 13, killed.stderr[-2000:]
    # the checkpoint after step 1 is the last one written before the kill after step 2's record
    assert latest_checkpoint(out / "checkpoints").name == "step_000002"
    assert [r["step"] for r in read_metrics(out)] == [0, 1, 2]
    resumed = _subprocess(config, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    resumed_summary = json.loads((out / "summary.json").read_text())
    assert resumed_summary["weights_sha256"] == summary["weights_sha256"]
    assert read_metrics(out) == metrics
    restarts = json.loads((out / "provenance.json").read_text())["restarts"]
    assert [r["resumed_at_step"] for r in restarts] == [2]


def test_killed_learner_actor_restarts_from_its_checkpoint(tmp_path, reference, ray_session, monkeypatch):
    summary, metrics = reference
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_LEARNER_ENV, f"3:{marker}")
    out = tmp_path / "run"
    ray_summary = train(_config(executor="ray"), out, quiet=True)
    assert marker.exists()  # the learner actor did die, in step 3
    assert ray_summary["learner_restarts"] == 1
    assert ray_summary["weights_sha256"] == summary["weights_sha256"]
    assert read_metrics(out) == metrics  # steps 0..4, each once
    restarts = json.loads((out / "provenance.json").read_text())["restarts"]
    assert [(r["resumed_at_step"], r["reason"]) for r in restarts] == [
        (3, "learner actor died; restarted from step_000003")
    ]


def test_without_checkpoints_a_dead_learner_ends_the_run(tmp_path, ray_session, monkeypatch):
    monkeypatch.setenv(KILL_LEARNER_ENV, f"1:{tmp_path / 'killed'}")
    with pytest.raises(Exception, match="(?i)actor|died"):
        train(tiny_config(steps=3, executor="ray"), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_ray_run_logs_to_wandb_offline(tmp_path, ray_session, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    train(tiny_config(steps=2, executor="ray", wandb=True), out, quiet=True)
    offline = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(offline) == 1 and offline[0].stat().st_size > 0
