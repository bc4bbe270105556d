"""Real submissions to a Slurm controller through submitit (cluster/local_slurm/setup.sh starts one).

Skipped, with the reason, when ``SLURM_CONF`` is unset or no controller answers (``scontrol ping``,
``sinfo``). Each job asks
Slurm for its own ``SLURM_*`` variables, so a result can only come from a job that Slurm started.
"""

from __future__ import annotations

import operator
import os
import subprocess
import time
from pathlib import Path

import pytest
from slurm_helpers import accounted_state, result_of

from zeromismatch.launch import submit
from zeromismatch.launch.ray_cluster import ray_cluster_report

pytestmark = [pytest.mark.slurm, pytest.mark.cluster("submitit")]


def test_single_job_runs_under_slurm(slurm_controller, tmp_path):
    job = submit(
        os.getenv, "SLURM_JOB_ID", cluster="slurm", profile="local-cpu", folder=tmp_path, timeout_min=5
    )
    assert result_of(job) == job.job_id
    if slurm_controller["accounting"]:
        # Without slurmdbd, sacct is disabled and submitit can only say UNKNOWN.
        assert accounted_state(job) == "COMPLETED"
    # The script Slurm ran is the one a dry run writes for the same call, byte for byte.
    dry = submit(
        os.getenv, "SLURM_JOB_ID", cluster="slurm", profile="local-cpu", folder=tmp_path, timeout_min=5,
        dry_run=True,
    )  # fmt: skip
    assert Path(job.paths.submission_file).read_text() == dry.scripts[0].read_text()


@pytest.mark.slow
def test_array_of_two_runs_as_one_slurm_array(slurm_controller, tmp_path):
    jobs = submit(
        operator.pow, 2, cluster="slurm", profile="local-cpu", folder=tmp_path, job_name="pow-array",
        array=[(3,), (5,)], timeout_min=5,
    )  # fmt: skip
    assert [result_of(job) for job in jobs] == [8, 32]
    array_ids = {job.job_id.split("_")[0] for job in jobs}
    assert len(array_ids) == 1, [job.job_id for job in jobs]
    assert [job.job_id.split("_")[1] for job in jobs] == ["0", "1"]
    if slurm_controller["accounting"]:
        assert [accounted_state(job) for job in jobs] == ["COMPLETED", "COMPLETED"]
    # Each element saw its own array index from Slurm.
    indices = submit(
        os.getenv, cluster="slurm", profile="local-cpu", folder=tmp_path, job_name="index-array",
        array=[("SLURM_ARRAY_TASK_ID",), ("SLURM_ARRAY_TASK_ID",)], timeout_min=5,
    )  # fmt: skip
    assert [result_of(job) for job in indices] == ["0", "1"]


@pytest.mark.slow
def test_ray_recipe_starts_a_cluster_inside_a_slurm_job(slurm_controller, tmp_path):
    """The sbatch-side Ray recipe, for real on one node: head up, driver joins, Ray stopped at the end."""
    job = submit(
        ray_cluster_report, cluster="slurm", profile="local-cpu", folder=tmp_path, ray=True, cpus_per_task=2,
        mem_gb=2, timeout_min=5,
    )  # fmt: skip
    report = result_of(job, timeout_s=180)
    assert report["alive_nodes"] == 1 and report["task_slurm_nodes"] == ["local"]
    assert report["resources"]["CPU"] == 2.0  # the head took the task's CPUs, as the recipe says
    # The teardown stopped Ray, so the blocking head step ended and the job left the queue promptly
    # instead of waiting for Slurm's KillWait.
    deadline = time.monotonic() + 20
    while subprocess.run(["squeue", "-h", "-j", job.job_id], capture_output=True, text=True).stdout.strip():
        assert time.monotonic() < deadline, f"job {job.job_id} still in the queue 20 s after its result"
        time.sleep(0.5)
    if slurm_controller["accounting"]:
        assert accounted_state(job) == "COMPLETED"


@pytest.mark.slow
def test_ray_recipe_joins_the_second_node_of_a_two_node_slurm_job(slurm_controller, tmp_path):
    """The multi-node half of the recipe, for real: a two-node allocation (partition twin: two more
    slurmd on this machine, cluster/local_slurm), the head on its first node, a worker started on
    the second with that node's task CPUs, the driver waiting until both joined."""
    job = submit(
        ray_cluster_report, cluster="slurm", profile="local-cpu-two-nodes", folder=tmp_path, ray=True,
        timeout_min=5,
    )  # fmt: skip
    report = result_of(job, timeout_s=240)
    assert report["alive_nodes"] == 2
    assert report["resources"]["CPU"] == 2.0  # one task CPU from each node, not the machine's twice
    # a task pinned to each Ray node ran under that node's slurmd: the worker is the second node's
    assert report["task_slurm_nodes"] == ["twin1", "twin2"]
    if slurm_controller["accounting"]:
        assert accounted_state(job) == "COMPLETED"
