"""The full tier's side of the launcher: each arm's resolved full-scale config (the mini arm's choices
on the published set-up, every value with its source) and its Slurm submission (``--scale full``).

A full-scale job runs :func:`run_full_arm`, which hands the resolved config to
``zeromismatch.integrations.full_scale.run_arm`` (vLLM rollout + Megatron learner as Ray actors).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from ..io import atomic_write_json, check_directory_path
from ..rl.stacks import DTYPES, QUANTS
from .spec import Experiment, FullScale

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


def _precision_fields(experiment: Experiment, full: FullScale, mini: dict) -> dict[str, str]:
    """``dtype`` and ``quant`` from ``FullScale.precision``: a weight format ("fp8", "nvfp4", ...) is a
    quantization on top of the arm's dtype, a dtype name replaces the dtype, anything else is an error.
    An arm whose mini config already names a weight format on either side (a fast arm's rollout_quant,
    an aligned arm's quant) keeps its own: the published format must not land on a fast arm's learner."""
    precision = full.precision
    has_format = mini["quant"] != "none" or (mini.get("rollout_quant") or "none") != "none"
    if precision is None or (precision in QUANTS and has_format):
        return {"dtype": mini["dtype"], "quant": mini["quant"]}
    if precision in QUANTS:
        return {"dtype": mini["dtype"], "quant": precision}
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
            context_tokens=full.context_tokens,
        )  # fmt: skip
        if config["lag"] and config["lag"] == headline_lag and full.lag is not None:
            config["lag"] = full.lag
        not_carried = sorted(set(mini) - set(ARM_CHOICE_FIELDS) - set(PUBLISHED_FIELDS))
        configs[arm.name] = {"arm": arm.name, "note": arm.note, "config": config,
                             "source_of": _sources_of(full, config, mini),
                             "not_carried_from_mini": not_carried,
                             "published": dataclasses.asdict(full)}  # fmt: skip
    return configs


#: resolved config keys -> the FullScale field they come from
_FULL_FIELD_OF = {
    "model": "model", "env": "env", "steps": "updates", "rollout_engine": "rollout_engine",
    "trainer": "trainer", "context_tokens": "context_tokens", "lag": "lag",
}  # fmt: skip


def _sources_of(full: FullScale, config: dict, mini: dict) -> dict[str, str]:
    """Where each resolved value comes from, so a reviewer can tell a published value from one we
    chose: "source <S#>" (stated by the publication), "assumed" (``FullScale.assumed``: chosen by us
    for the dry run), "mini arm" (the arm's own choice, e.g. its loss or sampling, carried over to
    the full run as the experiment's design), "not stated" (the publication gives none; None here)."""
    sources = {}
    for key, value in config.items():
        field_name = _FULL_FIELD_OF.get(key)
        if key in ("dtype", "quant"):
            field_name = "precision" if full.precision is not None and value == full.precision else None
        if key == "lag" and not (full.lag is not None and value == full.lag):
            field_name = None  # a lag ablation keeps its mini lag
        if field_name is None:
            sources[key] = "launcher (full runs use the Ray executor)" if key == "executor" else "mini arm"
        elif field_name in full.assumed:
            sources[key] = "assumed"
        elif getattr(full, field_name) is None:
            sources[key] = "not stated"
        else:
            sources[key] = f"source {full.source}" if full.source else "source"
    return sources


FULL_SCALE_BACKEND = "zeromismatch.integrations.full_scale"
FULL_SCALE_ENTRY = "run_arm"


def _missing_full_scale_backend() -> str | None:
    """Why a full-scale job could not run here (None when the backend and its entry point exist)."""
    import importlib.util

    if importlib.util.find_spec(FULL_SCALE_BACKEND) is None:
        return (
            f"the full-scale backend ({FULL_SCALE_BACKEND}: vLLM rollout + Megatron learner on GPUs) is not "
            "part of this build; install the 'gpu' and 'megatron' extras on the cluster image"
        )
    return None


def run_full_arm(experiment_name: str, resolved: dict):
    """Entry point of a full-scale Slurm job: hands the resolved config to the GPU backend
    (vLLM + Megatron); fails loudly rather than returning having trained nothing."""
    import importlib

    missing = _missing_full_scale_backend()
    if missing:
        raise RuntimeError(f"{experiment_name}/{resolved['arm']}: {missing}")
    backend = importlib.import_module(FULL_SCALE_BACKEND)
    entry = getattr(backend, FULL_SCALE_ENTRY, None)
    if entry is None:
        raise NotImplementedError(
            f"{experiment_name}/{resolved['arm']}: {FULL_SCALE_BACKEND} has no "
            f"{FULL_SCALE_ENTRY}(experiment_name, resolved) entry point"
        )
    return entry(experiment_name, resolved)


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
    missing = _missing_full_scale_backend()
    if missing and not dry_run:
        raise RuntimeError(f"not submitting: {missing}")
    if missing:
        print(f"{experiment.name}: warning: the jobs would fail: {missing}", file=sys.stderr)
    folder = out_root / "full" / experiment.name
    out = {}
    for name, resolved in configs.items():
        atomic_write_json(folder / f"{name}.resolved.json", resolved)
        result = submit(
            run_full_arm, experiment.name, resolved, cluster="slurm", profile=profile,
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
