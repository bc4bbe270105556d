"""The full tier's side of the launcher: each arm's resolved full-scale config (the mini arm's choices
on the published set-up, every value with its source) and its Slurm submission (``--scale full``).

A full-tier job (:class:`ArmJob`, checkpointable) hands the resolved config to
``zeromismatch.integrations.full_scale.run_arm`` (vLLM rollout + Megatron learner as Ray actors).
``--scale full-smoke`` (:func:`run_full_smoke`) runs the experiment's smoke arms on that same path on
the local Slurm.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..io import atomic_write_json, check_directory_path
from ..rl.stacks import DTYPES, QUANTS
from .spec import FULL_SIZE_FIELDS, PUBLISHED_ENVS, Arm, Experiment, FullScale

FULL_PROFILE = "h200-node"  # the cluster profile a full-scale job asks for unless --profile


# What a full-scale arm takes from its mini arm: the choices that define the arm (kernels, lag, loss,
# logprob semantics, cache and weight-update modes, sampling). Everything else a mini config holds is
# sized for a tiny model on a laptop (4 new tokens, 800 SFT steps, eval on 32 prompts, env_options of the
# toy envs) and is NOT carried: the resolved config lists those fields under "not_carried_from_mini" for
# the full-scale backend to set from the published recipe, instead of silently running Qwen3-4B with
# max_new_tokens=4.
ARM_CHOICE_FIELDS = (
    "algo", "algo_options", "kernels", "rollout_kernels", "lag", "logprobs_mode", "update_mode",
    "enable_prefix_caching", "prefix_cache_versioned", "rollout_lm_head", "quant", "rollout_dtype",
    "rollout_quant", "kv_cache_dtype", "temperature", "top_k", "top_p", "grad_clip", "audit_rollout_version",
    "seed",
)  # fmt: skip
# set from FullScale below
PUBLISHED_FIELDS = ("model", "env", "steps", "dtype", "executor", "trainer", "rollout_engine")

#: a mini arm's CPU kernel set -> the set its full run asks for on GPUs. The CPU aligned sets' checks
#: failed on the H200, so an aligned arm asks for the GPU set with their contract; stock kernels stay
#: stock (vLLM's and Megatron-core's own on GPUs).
GPU_KERNELS = {"aligned": "aligned-triton", "aligned-native": "aligned-triton", "default": "default"}
#: a full job checkpoints every this many steps: what a requeued job (a preemption, the time limit)
#: resumes from; chosen by us, like the executor
FULL_CHECKPOINT_EVERY = 50
#: resolved config keys the launcher sets, and why
_LAUNCHER_SET = {
    "executor": "launcher (full runs use the Ray executor)",
    "checkpoint_every": "launcher (what a requeued job resumes from)",
}
#: the compute dtype of a full run unless FullScale.precision names one: bf16, with fp32 master weights
#: in the learner (Megatron-core's mixed precision) -- the GPU stacks' dtype, not the CPU tier's fp32
GPU_DTYPE = "bfloat16"
_GPU_DTYPE_SOURCE = (
    "assumed: bf16 compute, fp32 master weights in the learner (Megatron-core's mixed precision); "
    "the sources name no training dtype"
)


def _precision_fields(experiment: Experiment, full: FullScale, mini: dict) -> dict[str, str]:
    """``dtype`` and ``quant`` from ``FullScale.precision``: a weight format ("fp8", "nvfp4", ...) is a
    quantization on top of ``GPU_DTYPE``, a dtype name replaces it, anything else is an error.
    An arm whose mini config already names a weight format on either side (a fast arm's rollout_quant,
    an aligned arm's quant) keeps its own: the published format must not land on a fast arm's learner."""
    precision = full.precision
    has_format = mini["quant"] != "none" or (mini.get("rollout_quant") or "none") != "none"
    if precision is None or (precision in QUANTS and has_format):
        return {"dtype": GPU_DTYPE, "quant": mini["quant"]}
    if precision in QUANTS:
        return {"dtype": GPU_DTYPE, "quant": precision}
    if precision in DTYPES:
        return {"dtype": precision, "quant": mini["quant"]}
    raise ValueError(
        f"{experiment.name}: FullScale.precision {precision!r} is neither a dtype {DTYPES} "
        f"nor a quantization {QUANTS}"
    )


def full_scale_configs(experiment: Experiment) -> dict[str, dict]:
    """The resolved full-scale config of every arm: the mini arm's choices (``ARM_CHOICE_FIELDS``) on the
    published model, env, engine, trainer and scale; the mini-only settings are named, not carried."""
    mini_arms = experiment.arms_for("mini")
    unknown = sorted(set(experiment.full_by_arm) - {arm.name for arm in mini_arms})
    if unknown:
        raise ValueError(f"{experiment.name}: full_by_arm names no mini arm: {unknown}")
    # Only the headline arms (the mini scale's largest lag stands in for the published lag) take the
    # published lag; a lag-8 ablation stays at lag 8.
    headline_lag = max(arm.config.lag for arm in mini_arms)
    configs = {}
    for arm in mini_arms:
        full = experiment.full_for(arm.name)
        mini = arm.config.to_dict()
        config = {key: mini[key] for key in ARM_CHOICE_FIELDS}
        config.update(
            model=full.model, env=full.env, steps=full.updates, **_precision_fields(experiment, full, mini),
            executor="ray", rollout_engine=full.rollout_engine, trainer=full.trainer,
            context_tokens=full.context_tokens, checkpoint_every=FULL_CHECKPOINT_EVERY, **full.sizes,
        )  # fmt: skip
        for side in ("kernels", "rollout_kernels"):
            if config[side] is not None:
                config[side] = _gpu_kernels(experiment, arm.name, config[side])
        if config["lag"] and config["lag"] == headline_lag and full.lag is not None:
            config["lag"] = full.lag
        not_carried = sorted(set(mini) - set(config))
        configs[arm.name] = {"arm": arm.name, "scale": "full", "note": arm.note, "config": config,
                             "env_is": PUBLISHED_ENVS[full.env],
                             "source_of": _sources_of(full, config, mini),
                             "sizes_not_stated": [f for f in FULL_SIZE_FIELDS if f not in full.sizes],
                             "not_carried_from_mini": not_carried,
                             "published": dataclasses.asdict(full)}  # fmt: skip
    return configs


def _gpu_kernels(experiment: Experiment, arm: str, kernels: str) -> str:
    if kernels not in GPU_KERNELS:
        raise ValueError(
            f"{experiment.name}/{arm}: kernel set {kernels!r} has no GPU counterpart in GPU_KERNELS"
        )
    return GPU_KERNELS[kernels]


#: resolved config keys -> the FullScale field they come from
_FULL_FIELD_OF = {
    "model": "model", "env": "env", "steps": "updates", "rollout_engine": "rollout_engine",
    "trainer": "trainer", "context_tokens": "context_tokens", "lag": "lag",
}  # fmt: skip


def _sources_of(full: FullScale, config: dict, mini: dict) -> dict[str, str]:
    """Where each resolved value comes from, so a reviewer can tell a published value from one we
    chose: "source <S#>" (stated by the publication), "assumed" (``FullScale.assumed``: chosen by us
    for the dry run), "mini arm" (the arm's own choice, e.g. its loss or sampling, carried over to
    the full run as the experiment's design), "not stated" (the publication gives none; None here);
    the GPU dtype and kernel set say what they replace, and every ``FULL_SIZE_FIELDS`` entry the source
    does not state is listed as one to set before a real run."""
    sources = {}
    for key, value in config.items():
        field_name = _FULL_FIELD_OF.get(key)
        if key in FULL_SIZE_FIELDS:
            field_name = key
        if key == "dtype" and value == GPU_DTYPE and full.precision != GPU_DTYPE:
            sources[key] = _GPU_DTYPE_SOURCE
            continue
        if key in ("kernels", "rollout_kernels") and value is not None and value != mini[key]:
            sources[key] = f"mini arm's {mini[key]!r}, as its GPU counterpart (GPU_KERNELS)"
            continue
        if key in ("dtype", "quant"):
            field_name = "precision" if full.precision is not None and value == full.precision else None
        if key == "lag" and not (full.lag is not None and value == full.lag):
            field_name = None  # a lag ablation keeps its mini lag
        if field_name is None:
            sources[key] = _LAUNCHER_SET.get(key, "mini arm")
        elif field_name in full.assumed:
            sources[key] = "assumed"
        elif field_name not in FULL_SIZE_FIELDS and getattr(full, field_name) is None:
            sources[key] = "not stated"
        else:
            sources[key] = f"source {full.source}" if full.source else "source"
    for key in FULL_SIZE_FIELDS:
        if key not in config:
            sources[key] = f"not stated in {full.source or 'the source'}: to be set before a real run"
    return sources


FULL_SCALE_BACKEND = "zeromismatch.integrations.full_scale"  # imported by name: integrations sit outside
FULL_SMOKE_PROFILE = "local-cpu-ray"  # the single-node Slurm of cluster/local_slurm, with the CPUs Ray needs
#: what makes a smoke arm a full-smoke arm: the full tier's executor, engine and learner, and a checkpoint
#: after every step (what a requeued job resumes from)
FULL_SMOKE_STACK = {"executor": "ray", "rollout_engine": "vllm", "trainer": "megatron", "checkpoint_every": 1}


def _backend():
    import importlib

    return importlib.import_module(FULL_SCALE_BACKEND)


def run_full_arm(experiment_name: str, resolved: dict, final_dir: str) -> dict:
    """Entry point of a full-tier job: hands the resolved config to the backend (vLLM + Megatron under
    Ray), which fails loudly rather than returning having trained nothing."""
    return _backend().run_arm(experiment_name, resolved, final_dir)


class ArmJob:
    """A full-tier Slurm job, checkpointable by submitit's protocol: at ``SIGUSR2`` (the time limit
    near, or a preemption) submitit calls :meth:`checkpoint` and requeues the job with what it returns.
    The run checkpoints on its own (``checkpoint_every``: every step at full-smoke,
    ``FULL_CHECKPOINT_EVERY`` at full), so the resubmission is the same call: it resumes the arm's
    ``.partial`` run from the last checkpoint on disk."""

    def __call__(self, experiment_name: str, resolved: dict, final_dir: str) -> dict:
        return run_full_arm(experiment_name, resolved, final_dir)

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(ArmJob(), *args, **kwargs)


def full_smoke_arms(experiment: Experiment) -> tuple[list[Arm], dict[str, str]]:
    """The experiment's smoke arms on the full tier's code path (``FULL_SMOKE_STACK``), and the arms
    that path cannot serve, each with why (the config's own refusal: the vLLM plugin serves the aligned
    kernel sets, unquantized weights, an activation-dtype KV cache and the fp32 head only)."""
    arms, unservable = [], {}
    for arm in experiment.arms_for("smoke"):
        try:
            config = arm.config.replace(**FULL_SMOKE_STACK)
        except ValueError as err:
            unservable[arm.name] = str(err)
            continue
        arms.append(dataclasses.replace(arm, config=config))
    return arms, unservable


def run_full_smoke(
    experiment: Experiment, arms: list[str] | None, cluster: str, out_root: Path, profile: str | None,
    force: bool, dry_run: bool,
) -> dict[str, dict]:  # fmt: skip
    """``--scale full-smoke``: each servable smoke arm as a full-tier job (``ArmJob``) into
    ``<out-root>/<experiment>/full-smoke/<arm>/``; an arm named in ``arms`` that the path cannot serve
    is an error, an unnamed one is skipped with its reason."""
    from ..launch.submit import submit

    chosen, unservable = full_smoke_arms(experiment)
    if arms:
        known = [arm.name for arm in chosen] + list(unservable)
        unknown = sorted(set(arms) - set(known))
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}; {experiment.name}/full-smoke has {known}")
        refused = sorted(set(arms) & set(unservable))
        if refused:
            raise ValueError(
                f"{experiment.name}/full-smoke/{refused[0]} cannot run there: {unservable[refused[0]]}"
            )
        chosen = [arm for arm in chosen if arm.name in arms]
    else:
        for name, why in unservable.items():
            print(f"{experiment.name}/full-smoke/{name}: skipped: {why}", file=sys.stderr)
        if not chosen:
            raise ValueError(f"{experiment.name}/full-smoke: no smoke arm can run on the full tier's path")
    missing = _backend().missing_modules()
    if missing and not dry_run:
        raise RuntimeError(f"not submitting: the full-smoke path needs {'; '.join(missing)}")
    check_directory_path(out_root, "--out-root")
    results = {}
    for arm in chosen:
        final = out_root / experiment.name / "full-smoke" / arm.name
        where = f"{experiment.name}/full-smoke/{arm.name}"
        if (final / "summary.json").exists() and not force:
            print(f"{where}: done already (--force reruns it)")
            continue
        resolved = {"arm": arm.name, "scale": "full-smoke", "note": arm.note, "config": arm.config.to_dict()}
        if cluster == "inline":
            if dry_run:
                print(f"{where}: would run {resolved['config']}")
                continue
            results[arm.name] = run_full_arm(experiment.name, resolved, str(final))
        else:
            job = submit(
                ArmJob(), experiment.name, resolved, str(final), cluster=cluster,
                profile=profile or FULL_SMOKE_PROFILE, folder=out_root / ".submitit" / experiment.name,
                job_name=f"{experiment.name}.full-smoke.{arm.name}", ray=True, dry_run=dry_run,
            )  # fmt: skip
            if dry_run:
                print(f"{where}: wrote {', '.join(str(p) for p in job.scripts) or job.config_path}")
                continue
            print(f"{where}: job {job.job_id} submitted; logs in {job.paths.folder}", flush=True)
            results[arm.name] = job.result()
        print(f"{where}: done")
    return results


def _warn_unresolved(experiment: Experiment, dry: object) -> None:
    """A dry run keeps ``${VAR}`` placeholders in the script; say which variables make it submittable."""
    unresolved = getattr(dry, "config", {}).get("unresolved_placeholders") or {}
    if unresolved:
        needed = ", ".join(sorted(set(unresolved.values())))
        fields = ", ".join(sorted(unresolved))
        print(
            f"{experiment.name}: note: the sbatch scripts keep placeholders for {fields}; "
            f"set {needed} before submitting",
            file=sys.stderr,
        )


def submit_full(
    experiment: Experiment, arms: list[str] | None, dry_run: bool, out_root: Path, profile: str = FULL_PROFILE
) -> dict[str, dict]:
    from ..launch.submit import submit

    configs = full_scale_configs(experiment)
    if arms:
        unknown = sorted(set(arms) - set(configs))
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}; {experiment.name}/full has {list(configs)}")
        configs = {k: v for k, v in configs.items() if k in arms}
    check_directory_path(out_root, "--out-root")
    missing = sorted(
        {piece for resolved in configs.values() for piece in _backend().missing_pieces(resolved)}
    )
    if missing and not dry_run:
        raise RuntimeError(f"not submitting {experiment.name}/full: not built yet: {'; '.join(missing)}")
    if missing:
        print(
            f"{experiment.name}: warning: the jobs would fail: not built yet: {'; '.join(missing)}",
            file=sys.stderr,
        )
    folder = out_root / "full" / experiment.name
    out = {}
    for name, resolved in configs.items():
        atomic_write_json(folder / f"{name}.resolved.json", resolved)
        result = submit(
            ArmJob(), experiment.name, resolved, str(out_root / experiment.name / "full" / name),
            cluster="slurm", profile=profile,
            folder=folder, job_name=f"{experiment.name}.{name}", nodes=experiment.full_for(name).nodes,
            ray=True, dry_run=dry_run,
        )  # fmt: skip
        out[name] = {"dry_run": dry_run, "folder": str(folder), "result": str(result)}
        what = "wrote sbatch + config to" if dry_run else "submitted; logs in"
        print(f"{experiment.name}/full/{name}: {what} {folder}")
        last = result
    if dry_run and out:
        _warn_unresolved(experiment, last)
    return out
