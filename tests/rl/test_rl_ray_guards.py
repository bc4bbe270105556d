"""The Ray executor refuses what it cannot do, up front, with one clear error (no Ray started)."""

from __future__ import annotations

import pytest
from rl_helpers import tiny_config

from zeromismatch.rl import actors


@pytest.mark.cluster("ray")
def test_ray_run_needs_two_cpus(tmp_path, monkeypatch):
    """With a 1-CPU Ray cluster the second actor could never be scheduled: fail before any work."""
    import ray

    monkeypatch.setattr(actors, "init_ray", lambda num_cpus=2: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0})
    with pytest.raises(ValueError, match="needs 2 CPUs"):
        actors.RayRun(tiny_config(executor="ray"), tmp_path / "run", quiet=True).run()
    assert not (tmp_path / "run").exists()
