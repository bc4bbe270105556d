"""The Ray executor refuses what it cannot do, up front, with one clear error (no Ray started)."""

from __future__ import annotations

import pytest
from rl_helpers import tiny_config

from zeromismatch.rl import RLConfig, actors


@pytest.mark.parametrize(("field", "value"), [("checkpoint_every", 1), ("wandb", True)])
def test_ray_rejects_checkpoints_and_wandb(field, value):
    with pytest.raises(ValueError, match=f"RLConfig.{field}: the Ray executor"):
        RLConfig(executor="ray", **{field: value})
    RLConfig(executor="inprocess", **{field: value})  # the in-process executor does both
    RLConfig(executor="ray", **{field: type(value)(0)})  # off is fine


@pytest.mark.cluster("ray")
def test_ray_run_needs_two_cpus(tmp_path, monkeypatch):
    """With a 1-CPU Ray cluster the second actor could never be scheduled: fail before any work."""
    import ray

    monkeypatch.setattr(actors, "init_ray", lambda num_cpus=2: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    with pytest.raises(ValueError, match="needs 2 CPUs"):
        actors.RayRun(tiny_config(executor="ray"), tmp_path / "run", quiet=True).run()
    assert not (tmp_path / "run").exists()
