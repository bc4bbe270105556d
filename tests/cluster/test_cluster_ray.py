"""init_ray: a private local Ray instance that runs remote tasks and shuts down cleanly."""

from __future__ import annotations

import pytest

from zeromismatch.launch import init_ray, ray_slurm_setup_lines


@pytest.mark.slow
@pytest.mark.cluster("ray")
def test_init_ray_runs_two_remote_tasks_and_shuts_down():
    # About 6-9 s on the 2-core CI machine, most of it Ray's own start-up.
    import ray

    init_ray(num_cpus=2, object_store_memory=100 * 1024**2)
    try:
        # Nested, so cloudpickle ships it by value and workers need not import this test module.
        @ray.remote
        def square(value: int) -> int:
            return value * value

        assert ray.get([square.remote(3), square.remote(4)]) == [9, 16]
        assert ray.cluster_resources()["CPU"] == 2
        with pytest.raises(RuntimeError, match="already initialised"):
            init_ray()
    finally:
        ray.shutdown()
    assert not ray.is_initialized()


def test_init_ray_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_cpus"):
        init_ray(num_cpus=0)
    with pytest.raises(ValueError, match="object_store_memory"):
        init_ray(object_store_memory=1024)


def test_ray_slurm_recipe_rejects_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="gpus_per_node"):
        ray_slurm_setup_lines(tmp_path, gpus_per_node=-1)
    with pytest.raises(ValueError, match="port"):
        ray_slurm_setup_lines(tmp_path, gpus_per_node=8, port=80)
