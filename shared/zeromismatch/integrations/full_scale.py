"""The full tier's job body: one experiment arm with a vLLM rollout actor and a Megatron learner actor
under Ray, the entry point every full-tier Slurm job calls (``experiment/full.py::ArmJob``).

    .venv-vllm/bin/python experiments/<name>/launch.py --scale full-smoke --cluster slurm  # here
    python experiments/<name>/launch.py --scale full --cluster slurm                      # GPU cluster

``full-smoke`` is the full tier's exact code path (submitit -> Slurm job -> Ray cluster over the
allocation -> the Ray executor of ``rl/actors.py`` with the vLLM plugin engine as rollout and the
Megatron backend as learner) at the experiment's smoke size, on CPUs. The run goes where a mini run
goes, with the same files (``metrics.jsonl``, ``summary.json``, ``provenance.json``, ``manifest.json``)
and ``resolved.json`` (the config the job was given), so ``paper_figures/make_all.py`` and the audit
read it like any run; its scale directory (``full-smoke``) labels it.

Weights go from the learner actor to the rollout actor through Ray's object store (the driver hands
the learner's state snapshot to the rollout actor, which loads it into its engine between batches);
on GPUs it would be an NCCL broadcast between the two actors' ranks, a transport swap inside
``rl/actors.py`` that nothing here would see (not built).

Fault tolerance (tests/cluster/test_full_smoke_slurm.py, tests/rl/test_rl_ray_resume.py): the run
checkpoints (every step at full-smoke); a killed rollout actor is restarted by Ray and regenerates
its batch; a dead learner actor is replaced from the last checkpoint; a job interrupted by Slurm
(``SIGUSR2`` before the time limit, or ``scancel --signal=USR2``) is checkpointed through
submitit's protocol and requeued, and this function, called again, resumes the arm's ``.partial``
run from its last checkpoint.

``full`` (the published runs on GPUs) cannot run yet: :func:`missing_pieces` names what is not built,
and the launcher refuses before submitting anything.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: the kernel sets the full tier can run on GPUs: none is built yet. ``experiment/full.py::GPU_KERNELS``
#: names what each arm asks for; why each is missing:
GPU_KERNEL_SETS: tuple[str, ...] = ()
WHY_NO_GPU_KERNELS = {
    "aligned-triton": "the GPU aligned kernel set (the aligned contract in Triton) is not built; "
    "the CPU aligned sets' checks failed on the H200",
    "default": "the stock GPU path (stock vLLM and Megatron-core kernels for an unaligned arm) is not "
    "wired into the vLLM plugin and the Megatron learner",
}

#: what the full-smoke path imports in the job's interpreter, and where it comes from
FULL_SMOKE_MODULES = {
    "vllm": "vLLM (make vllm-venv; launch with .venv-vllm/bin/python)",
    "megatron.core": "megatron-core (in .venv-vllm: make vllm-venv)",
    "ray": "Ray (in .venv-vllm: make vllm-venv)",
    "submitit": "submitit (in .venv-vllm: make vllm-venv)",
}


def missing_modules() -> list[str]:
    """What the full-smoke path needs in this interpreter and cannot import, each with where it is."""
    return [where for module, where in FULL_SMOKE_MODULES.items() if _find_spec(module) is None]


def _find_spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        return None


def missing_pieces(resolved: dict, on_job_node: bool = False) -> list[str]:
    """Why the arm ``resolved`` (a resolved config of ``experiment/full.py``) cannot run on the full
    tier, one item per missing piece (empty when nothing is missing). The code-level pieces hold on
    any machine, so the launcher can say them before it submits; ``on_job_node`` adds the machine's
    (a CUDA GPU, the GPU build of vLLM), which a login node need not have."""
    from ..envs import ENVS
    from ..models.presets import PRESETS

    config = resolved["config"]
    if resolved.get("scale") == "full-smoke":
        return missing_modules()
    problems = []
    for side in ("kernels", "rollout_kernels"):
        kernels = config.get(side)
        if kernels is not None and kernels not in GPU_KERNEL_SETS:
            why = WHY_NO_GPU_KERNELS.get(kernels, "not a GPU kernel set")
            problems.append(f"{side}={kernels!r}: no GPU kernel set is built ({why})")
    if config["model"] not in PRESETS:
        problems.append(
            f"model={config['model']!r}: loading a published checkpoint into the vLLM plugin and the "
            "Megatron learner is not built (the project's models are its own presets, trained from scratch)"
        )
    if config["env"] not in ENVS:
        problems.append(
            f"env={config['env']!r} ({resolved.get('env_is', 'a published env')}): not built "
            f"(this build has {', '.join(sorted(ENVS))})"
        )
    if resolved.get("sizes_not_stated"):
        problems.append(
            f"sizes the source does not state: {', '.join(resolved['sizes_not_stated'])} "
            "(choose them in the experiment's FullScale.sizes and list them in FullScale.assumed)"
        )
    if on_job_node:
        import torch

        if not torch.cuda.is_available():
            problems.append("no CUDA GPU on this node")
        problems += missing_modules()
    return problems


def run_arm(experiment_name: str, resolved: dict, final_dir: str) -> dict:
    """Run the arm ``resolved`` into ``final_dir`` (atomically: in ``.<arm>.partial`` until it is done,
    resumed from there when a requeued job calls this again); returns its summary."""
    from ..experiment.runner import run_arm as run_arm_atomically
    from ..experiment.spec import Arm
    from ..rl import RLConfig

    where = f"{experiment_name}/{resolved.get('scale', 'full')}/{resolved['arm']}"
    missing = missing_pieces(resolved, on_job_node=True)
    if missing:
        raise RuntimeError(f"{where} cannot run here: " + "; ".join(missing))
    config = RLConfig.from_dict(resolved["config"])
    arm = Arm(resolved["arm"], config, resolved.get("note", ""))
    return run_arm_atomically(
        arm, str(Path(final_dir)), quiet=True, resumable=True, extra_json={"resolved.json": resolved}
    )
