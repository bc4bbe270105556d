"""Experiment specs and the one launcher every ``experiments/<name>/launch.py`` uses.

An experiment is a set of named *arms* (runs that differ in one thing: kernels,
lag, logprob semantics ...) at a *scale*:

- ``smoke``: seconds; what the tests run.
- ``mini``: CPU minutes, tiny models of the real architectures; results land in
  ``results/reproduced/<experiment>/mini/<arm>/`` and are labelled mini everywhere.
- ``full``: the published configuration, submitted through submitit to Slurm on GPU
  nodes (vLLM rollout, Megatron learner). ``--dry-run`` writes the sbatch scripts and
  the resolved configs for review without submitting.

    python experiments/<name>/launch.py --scale mini [--arms a,b] [--cluster local|debug|slurm] [--dry-run]
"""

from .runner import launch_main, run_experiment
from .spec import Arm, Experiment, FullScale

__all__ = ["Arm", "Experiment", "FullScale", "launch_main", "run_experiment"]
