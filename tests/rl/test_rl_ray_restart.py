"""A rollout actor killed mid-run is restarted and the run continues: no batch lost or trained twice.

The actor's process really dies (``os._exit`` at the start of one batch, once); Ray restarts it and
re-runs the batch it was generating on the new incarnation. The run's records and final weights must
equal an uninterrupted in-process run's bit for bit, every step exactly once.
"""

from __future__ import annotations

import pytest
import torch
from rl_helpers import read_metrics, tiny_config

from zeromismatch.rl import train
from zeromismatch.rl.actors import KILL_ROLLOUT_ENV

pytestmark = [pytest.mark.slow, pytest.mark.cluster("ray")]


def test_killed_rollout_actor_is_restarted_and_the_run_is_unchanged(tmp_path, ray_session, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the actors run one torch thread each
    try:
        reference = train(tiny_config(steps=5, lag=1), tmp_path / "inprocess", quiet=True)
    finally:
        torch.set_num_threads(threads)
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ROLLOUT_ENV, f"3:{marker}")
    summary = train(tiny_config(steps=5, lag=1, executor="ray"), tmp_path / "ray", quiet=True)
    assert marker.exists()  # the actor did die at batch 3
    assert summary["rollout_actor_restarts"] == 1
    records = read_metrics(tmp_path / "ray")
    assert [r["step"] for r in records] == list(range(5))  # every batch once
    assert records == read_metrics(tmp_path / "inprocess")
    assert summary["weights_sha256"] == reference["weights_sha256"]
    # the actors ran in one placement group (the restarted actor in its own bundle again), released
    # at the end: a finished run holds no reservation
    import ray

    groups = ray.util.placement_group_table().values()
    assert groups and all(g["state"] == "REMOVED" for g in groups)
    assert all(list(g["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 1.0}] for g in groups)


def test_a_stale_prefix_cache_run_is_not_restarted(tmp_path, ray_session, monkeypatch):
    # its batches depend on what the lost cache held: a restart would change them silently
    monkeypatch.setenv(KILL_ROLLOUT_ENV, f"1:{tmp_path / 'killed'}")
    config = tiny_config(steps=3, executor="ray", prefix_cache_versioned=False)
    with pytest.raises(Exception, match="(?i)actor|died"):
        train(config, tmp_path / "ray", quiet=True)
