"""Operands of seeded arms: ``<arm>/seed<k>/`` data dirs (see :mod:`.runs`) combined over seeds.

An operand with ``"over_seeds": "mean"`` reads its ordinary value (summary key or metrics
aggregate, ``abs_dev_from`` applied, exactly as on an unseeded arm) from each seed's data dir, and
stands for the mean of those values. Each seed is one sample (``Resolved.samples``), so a check's
``min_z`` between two such operands is a noise floor at the level of seeds: how much the result
varies when only the seed changes. ``min_seeds`` sets how many seeds that takes.

``agg: all`` (exact_zero) over seeds is "0 at every step of every seed": the step values of all
seeds together, the fewest steps any seed recorded, and every seed's null or missing steps.

Whatever does not fit is MissingData (the claim is then not-run, saying why): ``over_seeds`` on an
arm that did not run on seeds, fewer seeds than ``min_seeds``, a seed that does not record the
operand, and an operand *without* ``over_seeds`` on a seeded arm -- one seed's number, or a
number pooled over seeds some other way, is not what the claim was written against.
"""

from __future__ import annotations

import numpy as np

from .runs import DataDir, MissingData, Resolved, Run, resolve_in


def _seed_names(seeds: list[tuple[int, DataDir]]) -> str:
    return ", ".join(data.path.name for _, data in seeds)


def _arm_rel(seeds: list[tuple[int, DataDir]]) -> str:
    data = seeds[0][1]
    return data.path.parent.relative_to(data.results_root).as_posix() + "/"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def seeds_for(operand: dict, run: Run, label: str) -> list[tuple[int, DataDir]]:
    """The seeds an operand reads in ``run``; MissingData when the run cannot supply them."""
    arm = operand.get("arm")
    seeds = run.seeds.get(arm) if arm else None
    if "over_seeds" not in operand:
        raise MissingData(
            f"{_arm_rel(seeds)} ran on {len(seeds)} seeds ({_seed_names(seeds)}); the claim must say "
            f"how to combine them (over_seeds) for {label}"
        )
    if seeds is None:
        if arm in run.arms:
            raise MissingData(f"{run.arms[arm].rel} ran on one seed (no seed<k>/ dirs); {label} needs seeds")
        raise MissingData(f"{run.rel} has no seeded arm {arm}/ (seed<k>/ dirs) for {label}")
    needed = operand.get("min_seeds")
    if needed is not None and len(seeds) < needed:
        raise MissingData(
            f"{_arm_rel(seeds)} ran on {len(seeds)} seed(s) ({_seed_names(seeds)}); {label} needs at "
            f"least {needed}"
        )
    return seeds


def _source(seeds: list[tuple[int, DataDir]], per_seed: list[Resolved]) -> str:
    """Where the per-seed values were read, with one ``seed{0,1,2}/`` path when they read alike."""
    rests = [got.source.removeprefix(data.rel) for (_, data), got in zip(seeds, per_seed, strict=True)]
    if len(set(rests)) == 1:
        digits = ",".join(data.path.name.removeprefix("seed") for _, data in seeds)
        return f"{_arm_rel(seeds)}seed{{{digits}}}/{rests[0]}"
    return f"{_arm_rel(seeds)}{{" + "; ".join(f"{d.path.name}/{r}" for (_, d), r in zip(seeds, rests)) + "}"


def resolve_over_seeds(operand: dict, run: Run, label: str) -> Resolved:
    """The operand over the seeds of its arm in ``run`` (see the module docstring)."""
    seeds = seeds_for(operand, run, label)
    # a seed dir is the arm's own data dir: its keys carry no arm prefix
    plain = {key: value for key, value in operand.items() if key != "arm"}
    per_seed = [resolve_in(plain, [(data, False)], label, data.rel) for _, data in seeds]
    values = [got.value for got in per_seed]
    steps = [got.steps for got in per_seed if got.steps is not None]
    resolved = Resolved(label, float("nan"), steps=min(steps) if len(steps) == len(per_seed) else None)
    resolved.per_seed = [(seed, got.value) for (seed, _), got in zip(seeds, per_seed, strict=True)]
    resolved.seed_data = [data for _, data in seeds]
    resolved.commits = set().union(*(got.commits for got in per_seed))
    listed = ", ".join(_fmt(v) for v in values)
    if operand.get("agg") == "all":
        # the largest |value| of any step of any seed: what "max |value|" reports
        resolved.value = max(values)
        resolved.values = [v for got in per_seed for v in got.values or []]
        resolved.missing = sum(got.missing for got in per_seed)
        detail = f"every step of {len(seeds)} seeds (max |value| per seed: {listed})"
    else:
        resolved.value = float(np.mean(values))
        resolved.samples = list(values)
        resolved.nonfinite = sum(got.nonfinite for got in per_seed)
        resolved.aggregated = sum(got.aggregated for got in per_seed)
        detail = f"{operand['over_seeds']} over {len(seeds)} seeds ({listed})"
    resolved.source = f"{_source(seeds, per_seed)}, {detail}"
    return resolved
