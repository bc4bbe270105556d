"""Run an experiment's arms at a scale, or write its full-scale Slurm scripts.

Each arm trains into a hidden temp directory next to its final place and is renamed
into ``<out-root>/<experiment>/<scale>/<arm>/`` only when it finished, so no run directory ever
holds half a run. The default out-root is in the checkout holding the experiment's ``configs.py``
(``zeromismatch.checkout``; the cwd's checkout when the configs are in none): ``results/reproduced``
at mini scale, ``runs/smoke`` at smoke scale (smoke runs check plumbing; they never go under
``results/``, which the audit judges and ``make reproduce`` verifies). An arm whose ``summary.json``
exists is skipped unless ``--force``; a re-run replaces it whole. ``--scale full`` (``--cluster slurm``
only) writes each arm's resolved config and sbatch script to ``<out-root>/full/<experiment>/``
(default ``runs/full/<experiment>/``) and submits them unless ``--dry-run``.

``--cluster local|debug|slurm`` at smoke/mini scale hands each arm to submitit with ``--profile``
(default ``local-cpu``); submitit's pickles and logs go to ``<out-root>/.submitit/<experiment>/``,
a hidden directory the audit never reads (it skips every name starting with ``.``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path

from ..checkout import checkout_in_use, checkout_root, find_checkout, inside_results
from ..io import DirectoryLockedError, atomic_write_json, check_directory_path, directory_lock
from ..manifest import write_manifest
from ..rl.stacks import DTYPES, QUANTS
from .spec import SCALES, Arm, Experiment, FullScale

CLUSTERS = ("inline", "local", "debug", "slurm")
MINI_PROFILE, FULL_PROFILE = "local-cpu", "h200-node"  # the cluster profiles used unless --profile
SUBMITIT_DIR = ".submitit"  # hidden: the audit skips dot-directories under results/


def run_arm(arm: Arm, final_dir: str, quiet: bool = True) -> dict:
    """Train one arm into ``final_dir`` atomically; returns its summary.

    A rerun replaces the old result by renames only: old -> ``.<name>.old``, new -> ``final_dir``, then
    the old copy is deleted. A crash between the renames leaves the old result aside, which the next
    call puts back first, so ``final_dir`` is never missing a finished result for longer than that.

    The whole replacement runs under an exclusive lock on ``.<name>.lock``: a second process given the
    same arm (two launchers sharing an out root) gets :class:`DirectoryLockedError` at once, before it
    touches anything -- without the lock it removed the first one's ``.partial`` mid-run, and the first
    then sealed a truncated run as finished."""
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    with directory_lock(final.parent, f"run of arm {final.name}", name=f".{final.name}.lock"):
        return _replace_arm(arm, final, quiet)


def _replace_arm(arm: Arm, final: Path, quiet: bool) -> dict:
    from ..rl import train

    tmp = final.parent / f".{final.name}.partial"
    aside = final.parent / f".{final.name}.old"
    if aside.exists():
        if final.exists():
            shutil.rmtree(aside)  # the crash came after the new result was in place: the old one is done
        else:
            os.replace(aside, final)  # the crash came between the renames: the old result is the result
    shutil.rmtree(tmp, ignore_errors=True)
    summary = train(arm.config, tmp, quiet=quiet)
    write_manifest(tmp)  # sealed before it is renamed into place, whichever executor wrote it
    if final.exists():
        os.replace(final, aside)
    os.replace(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)
    return summary


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


def experiment_source(experiment: Experiment) -> Path | None:
    """The directory of the file defining the experiment's arms (its ``configs.py``), or None."""
    for make_arms in experiment.arms.values():
        code = getattr(make_arms, "__code__", None)  # a function or lambda; a partial has none
        if code is not None and Path(code.co_filename).is_file():
            return Path(code.co_filename).resolve().parent
    return None


def experiment_checkout(experiment: Experiment) -> Path | None:
    """The checkout whose configs define the experiment: where its default outputs and profiles live."""
    source = experiment_source(experiment)
    return find_checkout(source) if source is not None else None


def default_out_root(experiment: Experiment, scale: str) -> Path:
    """``runs/`` (full), ``runs/smoke`` (smoke) or ``results/reproduced`` (mini) of the experiment's
    checkout (:func:`experiment_checkout`, else the cwd's); NoCheckoutError when there is none."""
    root = experiment_checkout(experiment) or checkout_root("--out-root DIR")
    defaults = {"full": root / "runs", "smoke": root / "runs" / "smoke"}
    return defaults.get(scale, root / "results" / "reproduced")


def run_experiment(
    experiment: Experiment,
    scale: str,
    arms: list[str] | None = None,
    cluster: str = "inline",
    dry_run: bool = False,
    force: bool = False,
    quiet: bool = False,
    out_root: str | os.PathLike | None = None,
    profile: str | None = None,
) -> dict[str, dict]:
    """``profile``: the cluster profile submitit jobs ask for (default ``local-cpu``, ``h200-node`` at
    full scale); checked against the profiles directory (of the experiment's checkout) before anything
    runs. ``out_root`` defaults to :func:`default_out_root`."""
    with checkout_in_use(experiment_checkout(experiment)):
        return _run_experiment(experiment, scale, arms, cluster, dry_run, force, quiet, out_root, profile)


def _run_experiment(
    experiment: Experiment,
    scale: str,
    arms: list[str] | None,
    cluster: str,
    dry_run: bool,
    force: bool,
    quiet: bool,
    out_root: str | os.PathLike | None,
    profile: str | None,
) -> dict[str, dict]:
    if scale not in SCALES:
        raise ValueError(f"--scale must be one of {SCALES}, got {scale!r}")
    if cluster not in CLUSTERS:
        raise ValueError(f"--cluster must be one of {CLUSTERS}, got {cluster!r}")
    if profile is not None:
        _check_profile(profile)
    if scale == "full":
        if cluster != "slurm":
            raise ValueError(f"--scale full runs on Slurm only: pass --cluster slurm (got {cluster!r})")
        out = Path(out_root) if out_root else default_out_root(experiment, scale)
        return _full(experiment, arms, dry_run, out, profile or FULL_PROFILE)
    out_root = Path(out_root) if out_root else default_out_root(experiment, scale)
    if scale == "smoke" and inside_results(out_root):
        raise ValueError(f"--out-root {out_root} is inside a checkout's results/: smoke runs never go there")
    check_directory_path(out_root, "--out-root")
    chosen = experiment.arms_for(scale)
    if arms:
        unknown = sorted(set(arms) - {a.name for a in chosen})
        if unknown:
            have = [a.name for a in chosen]
            raise ValueError(f"unknown arm(s) {unknown}; {experiment.name}/{scale} has {have}")
        chosen = [a for a in chosen if a.name in arms]
    results = {}
    runs = [(name, dataclasses.replace(arm, config=config)) for arm in chosen for name, config in arm.runs()]
    for index, (name, run) in enumerate(runs):
        final = out_root / experiment.name / scale / name
        where = f"{experiment.name}/{scale}/{name}"
        if (final / "summary.json").exists() and not force:
            print(f"{where}: done already (--force reruns it)")
            continue
        if dry_run:
            print(f"{where}: would run {run.config.to_dict()}")
            continue
        if not quiet:
            print(f"{where}: run {index + 1} of {len(runs)}", flush=True)
        start = time.perf_counter()
        if cluster == "inline":
            try:
                summary = run_arm(run, str(final), quiet)
            except DirectoryLockedError:
                # another launcher on this out root is running it: its result lands there all the same
                print(f"{where}: being run by another process, skipped", flush=True)
                continue
        else:
            from ..launch.submit import submit

            job = submit(
                run_arm, run, str(final), True, cluster=cluster, profile=profile or MINI_PROFILE,
                folder=out_root / SUBMITIT_DIR / experiment.name,
                job_name=f"{experiment.name}.{name.replace('/', '.')}",
            )  # fmt: skip
            summary = job.result()
        results[name] = summary
        print(f"{where}: done in {time.perf_counter() - start:.0f} s")
    scale_dir = out_root / experiment.name / scale
    if experiment.postprocess is not None and not dry_run and scale_dir.exists():
        experiment.postprocess(scale_dir)
    return results


def _check_profile(profile: str) -> None:
    """One ValueError naming the known profiles when ``profile`` is not one of them."""
    from ..launch.profiles import list_profiles, profiles_dir

    known = list_profiles()
    if profile not in known:
        raise ValueError(f"unknown --profile {profile!r}; {profiles_dir()} has {known}")


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


def _full(
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


def _warn_other_package(experiment: Experiment, source: Path | None) -> None:
    """An editable install from another clone runs that clone's package code on these configs: say so
    (provenance records both as well), since the two checkouts' commits need not match."""
    package_top = find_checkout(Path(__file__))
    configs_top = find_checkout(source) if source is not None else None
    if package_top is not None and configs_top is not None and package_top != configs_top:
        print(
            f"{experiment.name}: note: configs from {configs_top}, zeromismatch package imported from "
            f"{package_top}",
            file=sys.stderr,
        )


def launch_main(experiment: Experiment, argv: list[str] | None = None) -> int:
    from .._provenance import freeze_git_state

    # the arms record the checkout whose configs this launch runs, as it was when the launch started
    source = experiment_source(experiment)
    freeze_git_state(source)
    _warn_other_package(experiment, source)
    parser = argparse.ArgumentParser(description=f"{experiment.name}: {experiment.claim}")
    parser.add_argument("--scale", default="mini", choices=SCALES)
    parser.add_argument("--arms", default=None, help="comma-separated arm names (default: all)")
    parser.add_argument("--cluster", default="inline", choices=CLUSTERS,
                        help="inline = this process; local/debug/slurm go through submitit")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="write scripts/configs, run nothing")
    parser.add_argument("--force", action="store_true", help="rerun arms that already have results")
    parser.add_argument("--out-root", default=None,
                        help="default, in this launcher's checkout: results/reproduced "
                             "(runs/smoke for --scale smoke, runs/ for --scale full)")  # fmt: skip
    parser.add_argument("--profile", default=None,
                        help=f"cluster profile for submitit jobs (default: {MINI_PROFILE}; "
                             f"{FULL_PROFILE} for --scale full)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    try:
        run_experiment(
            experiment, args.scale, args.arms.split(",") if args.arms else None, args.cluster,
            args.dry_run, args.force, args.quiet, args.out_root, args.profile,
        )  # fmt: skip
    except (ValueError, OSError, RuntimeError) as err:
        print(f"{experiment.name}: {err}", file=sys.stderr)
        return 2
    return 0
