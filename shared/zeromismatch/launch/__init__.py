"""Launching work: cluster profiles, submitit submission (local / debug / Slurm, with dry runs), Ray.

``submit`` and ``init_ray`` import submitit and Ray only when called, so importing this package is cheap.
"""

from zeromismatch.launch.profiles import ClusterProfile, list_profiles, load_profile, profile_from_dict
from zeromismatch.launch.ray_cluster import (
    init_ray,
    ray_cluster_report,
    ray_slurm_setup_lines,
    ray_slurm_teardown_lines,
    wait_for_nodes,
)
from zeromismatch.launch.submit import CLUSTERS, DryRun, sbatch_script, submit

__all__ = [
    "CLUSTERS",
    "ClusterProfile",
    "DryRun",
    "init_ray",
    "list_profiles",
    "load_profile",
    "profile_from_dict",
    "ray_cluster_report",
    "ray_slurm_setup_lines",
    "ray_slurm_teardown_lines",
    "sbatch_script",
    "submit",
    "wait_for_nodes",
]
