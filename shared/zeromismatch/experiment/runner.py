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
from .full import FULL_PROFILE, FULL_SMOKE_PROFILE, run_full_smoke, submit_full
from .spec import SCALES, Arm, Experiment

CLUSTERS = ("inline", "local", "debug", "slurm")
MINI_PROFILE = "local-cpu"  # the cluster profile mini/smoke jobs ask for unless --profile
SUBMITIT_DIR = ".submitit"  # hidden: the audit skips dot-directories under results/


def run_arm(
    arm: Arm, final_dir: str, quiet: bool = True, resumable: bool = False, extra_json: dict | None = None
) -> dict:
    """Train one arm into ``final_dir`` atomically; returns its summary.

    ``resumable``: a ``.<name>.partial`` left by an interrupted call (a requeued Slurm job) that holds
    the run's config.json is resumed from its last checkpoint instead of being started over.
    ``extra_json``: files (name -> JSON value) written into the run before it is sealed.

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
        return _replace_arm(arm, final, quiet, resumable, extra_json or {})


def _replace_arm(arm: Arm, final: Path, quiet: bool, resumable: bool, extra_json: dict) -> dict:
    from ..rl import train

    tmp = final.parent / f".{final.name}.partial"
    aside = final.parent / f".{final.name}.old"
    if aside.exists():
        if final.exists():
            shutil.rmtree(aside)  # the crash came after the new result was in place: the old one is done
        else:
            os.replace(aside, final)  # the crash came between the renames: the old result is the result
    resume = resumable and (tmp / "config.json").is_file()
    if not resume:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = train(arm.config, tmp, resume=resume, quiet=quiet)
    for name, value in extra_json.items():
        atomic_write_json(tmp / name, value)
    write_manifest(tmp)  # sealed before it is renamed into place, whichever executor wrote it
    if final.exists():
        os.replace(final, aside)
    os.replace(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)
    return summary


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
    defaults = {"full": root / "runs", "full-smoke": root / "runs", "smoke": root / "runs" / "smoke"}
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
        return submit_full(experiment, arms, dry_run, out, profile or FULL_PROFILE)
    out_root = Path(out_root) if out_root else default_out_root(experiment, scale)
    if scale in ("smoke", "full-smoke") and inside_results(out_root):
        raise ValueError(
            f"--out-root {out_root} is inside a checkout's results/: {scale} runs never go there"
        )
    if scale == "full-smoke":
        return run_full_smoke(experiment, arms, cluster, out_root, profile, force, dry_run)
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
                             "(runs/smoke for --scale smoke, runs/ for full-smoke and full)")  # fmt: skip
    parser.add_argument("--profile", default=None,
                        help=f"cluster profile for submitit jobs (default: {MINI_PROFILE}; "
                             f"{FULL_SMOKE_PROFILE} for full-smoke, {FULL_PROFILE} for full)")  # fmt: skip
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
