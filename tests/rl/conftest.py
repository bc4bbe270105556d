"""Fixtures shared by the RL tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """A real local Ray with the 2 CPUs the executor's two actors need, shut down after the module.
    Its tests carry ``@pytest.mark.cluster("ray")``: skipped without Ray outside CI, failing in CI."""
    import ray

    from zeromismatch.rl.actors import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()
