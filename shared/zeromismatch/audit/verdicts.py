"""Verdicts: each published claim against what this repository measured, decided from data only.

For a claim with ``out_of_reach`` the verdict is ``out-of-reach`` (with what it needs). Otherwise
its ``test`` picks data: a benchmark file, or the first run (scale preference, then newest name)
that records every operand the test names. With no such data: ``not-run`` plus the command that
would produce it. With data:

- every ``exact_zero`` operand must be exactly 0 (for ``agg: all``: at every step, and on at least
  ``min_steps`` steps) -- compared with ``== 0``, never a tolerance; a step whose value is null or
  absent (fewer values than step records, or than the summary's ``steps``) counts as not zero;
- every ``check`` (lhs op rhs, or lhs op factor x rhs where the claim states an effect size) must
  hold; NaN never satisfies a comparison;
- a check with ``min_z`` (both sides means of per-step series: two arms, or head vs tail windows
  of one arm) must also clear noise: the difference in the claimed direction must be at least
  ``min_z`` standard errors of the difference (Welch, each step one sample; see :func:`welch_z`).
  The z is reported in the verdict's reason either way. With both sides ``over_seeds``
  (:mod:`.seeds`) each seed is one sample instead: a noise floor at the level of seeds.

An operand ``over_seeds`` stands for the mean over its arm's seeds; its measured entry gives each
seed's value and their spread, and as exact_zero it must be 0 on every seed (not merely on average).

Data a claim reads must be comparable, or the verdict is not-run: every data dir from one git
commit, and, when any records the weights RL started from (summary ``warm_start_sha256``), every
one from the same warm start -- otherwise a difference between arms need not be one of numerics.

All hold -> ``reproduced-exact`` (rule ``exact``) or ``reproduced-direction`` (rule ``direction``);
anything fails -> ``not-reproduced``, with the failing parts and their measured values. No value is
ever filled in: a verdict carries only numbers read from the files it links to.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .registry import AuditInputError, Registry, iter_operands
from .runs import (
    JUDGED_SCALES,
    Benchmark,
    MissingData,
    Resolved,
    Run,
    all_runs,
    load_benchmark,
    order_runs,
    resolve_operand,
)

REPRODUCED_EXACT = "reproduced-exact"
REPRODUCED_DIRECTION = "reproduced-direction"
NOT_REPRODUCED = "not-reproduced"
NOT_RUN = "not-run"
OUT_OF_REACH = "out-of-reach"
VERDICTS = (REPRODUCED_EXACT, REPRODUCED_DIRECTION, NOT_REPRODUCED, NOT_RUN, OUT_OF_REACH)

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq}


@dataclass
class Measured:
    label: str
    value: float | None
    source: str
    passed: bool | None = None  # None: shown for context, not itself a condition


@dataclass
class Verdict:
    claim_id: str
    experiment: str
    verdict: str
    reason: str
    command: str | None = None
    needs: list[str] = field(default_factory=list)
    measured: list[Measured] = field(default_factory=list)
    run: str | None = None  # path relative to the results root
    scale: str | None = None
    steps: int | None = None
    provenance: dict = field(default_factory=dict)
    provenance_files: list[str] = field(default_factory=list)  # relative to the results root
    # one entry per data dir when the operands came from several (one per arm): commit and config
    # hash of each, or {"data": dir, "missing": True} for a dir without provenance.json
    arm_provenance: list[dict] = field(default_factory=list)
    speed_ratio: float | None = None  # measured speed ratio for throughput claims

    def as_dict(self) -> dict:
        return asdict(self)


def _provenance_digest(provenance: dict) -> dict:
    """The provenance fields a reviewer needs next to a verdict."""
    keep = ("git_commit", "command_line", "config_hash", "zeromismatch_version", "python")
    digest = {key: provenance[key] for key in keep if key in provenance}
    hardware = provenance.get("hardware")
    if isinstance(hardware, dict):
        digest["hardware"] = {
            key: hardware[key] for key in ("cpu_model", "gpu", "cpu_count", "cuda") if key in hardware
        }
    packages = provenance.get("packages")
    if isinstance(packages, dict) and "torch" in packages:
        digest["torch"] = packages["torch"]
    return digest


def _arm_provenance(data) -> dict:
    if not data.provenance:
        return {"data": data.rel, "missing": True}
    return {
        "data": data.rel,
        "git_commit": data.provenance.get("git_commit"),
        "config_hash": data.provenance.get("config_hash"),
    }


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4g}"


def welch_z(lhs: Resolved, rhs: Resolved, factor: float, op: str, min_z: float) -> tuple[float | None, str]:
    """How many standard errors the difference ``lhs - factor x rhs`` lies in the direction of ``op``.

    Both operands are means of per-step values (``Resolved.samples``); each step counts as one
    independent sample (Welch: SE = sqrt(var_l / n_l + factor^2 var_r / n_r), sample variances).
    Steps of a training curve are autocorrelated, so this SE is, if anything, too small: min_z is
    a floor against noise, not a significance test. Operands over seeds are means of per-seed
    values instead, and each seed is one sample. Returns (z, text); z is None with fewer than two
    samples on a side, NaN when both spreads and the difference are 0.
    """
    left, right = lhs.samples or [], rhs.samples or []
    unit = "seeds" if lhs.per_seed is not None and rhs.per_seed is not None else "steps"
    if len(left) < 2 or len(right) < 2:
        return None, f"z undefined: needs at least 2 {unit} on each side, has {len(left)} and {len(right)}"
    if not all(math.isfinite(v) for v in (*left, *right)):
        return None, f"z undefined: non-finite {unit[:-1]} values (no standard error exists)"
    sign = 1.0 if op in (">", ">=") else -1.0
    difference = sign * (lhs.value - factor * rhs.value)
    variance = np.var(left, ddof=1) / len(left) + factor**2 * np.var(right, ddof=1) / len(right)
    error = math.sqrt(float(variance)) if math.isfinite(float(variance)) else math.nan
    if error > 0:
        z = difference / error
    else:
        z = math.copysign(math.inf, difference) if difference != 0 and math.isfinite(difference) else math.nan
    text = (
        f"z = {_fmt(z)}: difference {_fmt(difference)} over its standard error {_fmt(error)} "
        f"(Welch, {len(left)} vs {len(right)} {unit} as samples); needs z >= {min_z:g}"
    )
    return z, text


def _source(got: Resolved) -> str:
    """Where a measured value was read; over seeds, also how far apart the seeds lie."""
    if not got.per_seed:
        return got.source
    values = [value for _, value in got.per_seed]
    return f"{got.source}; spread {_fmt(min(values))}..{_fmt(max(values))} across seeds"


def _nonfinite_reason(lhs: Resolved, rhs: Resolved | None) -> str | None:
    """Why a check's operands cannot decide it (``Resolved.nonfinite`` step values, a NaN), or None."""
    parts = []
    for side in (lhs, rhs):
        if side is None:
            continue
        if side.nonfinite:
            parts.append(f"{side.label}: {side.nonfinite} of {side.aggregated} step values non-finite")
        elif side.value is not None and math.isnan(side.value):
            parts.append(f"{side.label} = nan")
    if not parts:
        return None
    return "cannot be decided on non-finite values (" + "; ".join(parts) + ")"


@dataclass
class _Judged:
    measured: list[Measured]
    failures: list[str]  # empty: every condition holds
    undecided: list[str]  # checks the data cannot decide (non-finite values): the verdict is not-run
    notes: list[str]  # what a passing verdict reports besides "holds" (the z of each min_z check)
    steps: int | None
    speed_ratio: float | None


def _judge(claim: dict, resolve) -> _Judged:
    """Apply a test's exact_zero and checks with ``resolve(operand) -> Resolved``."""
    test = claim["test"]
    measured: list[Measured] = []
    failures: list[str] = []
    undecided: list[str] = []
    notes: list[str] = []
    steps: int | None = None
    speed_ratio: float | None = None
    for operand in test.get("exact_zero", []):
        got: Resolved = resolve(operand)
        if got.values is not None:
            nonzero = sum(1 for v in got.values if not v == 0.0)
            nonfinite = sum(1 for v in got.values if not math.isfinite(v))
            ok = nonzero == 0 and got.missing == 0
            steps = got.steps if steps is None else min(steps, got.steps or 0)
            over = f"{got.steps} steps"
            if got.per_seed is not None:
                seeds = len(got.per_seed)
                over = f"{len(got.values)} step values of {seeds} seeds (at least {got.steps} steps each)"
            text = f"max |value| {_fmt(got.value)} over {over}; {nonzero} steps nonzero"
            if nonfinite:
                text += f" ({nonfinite} of them non-finite)"
            if got.missing:
                text += f"; {got.missing} steps recorded null or missing"
            if not ok:
                failures.append(f"{got.label} not zero at every step ({text})")
            measured.append(Measured(got.label, got.value, f"{_source(got)} ({text})", ok))
        elif got.per_seed is not None:
            # a mean of 0 could hide seeds of opposite sign: "exactly 0" must hold on each seed
            nonzero = [seed for seed, value in got.per_seed if not value == 0.0]
            ok = not nonzero
            if not ok:
                failures.append(
                    f"{got.label} = {_fmt(got.value)}, not exactly 0 on every seed "
                    f"(nonzero on {len(nonzero)} of {len(got.per_seed)} seeds)"
                )
            measured.append(Measured(got.label, got.value, _source(got), ok))
        else:
            ok = got.value == 0.0
            if not ok:
                failures.append(f"{got.label} = {_fmt(got.value)}, not exactly 0")
            measured.append(Measured(got.label, got.value, got.source, ok))
    min_steps = test.get("min_steps")
    if min_steps is not None and test.get("exact_zero"):
        if steps is None or steps < min_steps:
            failures.append(f"zero on {steps or 0} recorded steps; the claim needs at least {min_steps}")
    for check in test.get("checks", []):
        lhs: Resolved = resolve(check["lhs"])
        factor = check.get("factor")
        if isinstance(check["rhs"], dict):
            rhs: Resolved = resolve(check["rhs"])
            rhs_value, rhs_label = rhs.value, rhs.label
            if factor is not None:
                # an effect size: "clearly larger", not merely larger (noise can win a bare >)
                rhs_value = None if rhs_value is None else factor * rhs_value
                rhs_label = f"{_fmt(factor)} x {rhs.label}"
        else:
            rhs = None
            rhs_value, rhs_label = float(check["rhs"]), _fmt(float(check["rhs"]))
        ok = lhs.value is not None and rhs_value is not None and bool(_OPS[check["op"]](lhs.value, rhs_value))
        # an inf step (a token the trainer gives probability 0) or a NaN one makes a mean over it inf or
        # NaN, which would decide a comparison on its own, whatever the curve does (Resolved.nonfinite)
        unusable = _nonfinite_reason(lhs, rhs)
        if unusable:
            ok = False
            undecided.append(f"{check['label']}: {unusable}")
        elif not ok:
            failures.append(
                f"{check['label']}: {lhs.label} = {_fmt(lhs.value)} is not {check['op']} "
                f"{rhs_label} = {_fmt(rhs_value)}"
            )
        z_entry = None
        if "min_z" in check and rhs is not None:
            z, text = welch_z(lhs, rhs, factor if factor is not None else 1.0, check["op"], check["min_z"])
            clear = z is not None and z >= check["min_z"]
            z_entry = Measured(f"z, {check['label']}", z, text, None)
            if not ok:
                if not unusable:
                    failures[-1] += f" ({text})"
            elif not clear:
                failures.append(f"{check['label']}: the difference is within noise ({text})")
            else:
                notes.append(f"{check['label']}: {text}")
            ok = ok and clear
        measured.append(Measured(lhs.label, lhs.value, _source(lhs), ok))
        if rhs is not None:
            measured.append(Measured(rhs.label, rhs.value, _source(rhs), ok))
            if lhs.value and rhs.value and math.isfinite(lhs.value) and math.isfinite(rhs.value):
                measured.append(
                    Measured(f"ratio {lhs.label} / {rhs.label}", lhs.value / rhs.value, "computed", None)
                )
        if z_entry is not None:
            measured.append(z_entry)
        plot_ratio = check.get("plot_ratio")
        if speed_ratio is None and rhs is not None and plot_ratio:
            num, den = (lhs.value, rhs.value) if plot_ratio == "lhs/rhs" else (rhs.value, lhs.value)
            speed_ratio = num / den if den else None
        elif speed_ratio is None and test["data"] == "benchmark":
            speed_ratio = lhs.value
    return _Judged(measured, failures, undecided, notes, steps, speed_ratio)


def _verdict_from(claim: dict, judged: _Judged) -> tuple[str, str]:
    if judged.failures:  # a condition that fails on finite data refutes, whatever else is undecided
        return NOT_REPRODUCED, "; ".join(judged.failures + judged.undecided)
    if judged.undecided:
        # non-finite data neither reproduces nor refutes: not-run, saying what cannot be decided
        return NOT_RUN, "; ".join(judged.undecided)
    kind = REPRODUCED_EXACT if claim["test"]["rule"] == "exact" else REPRODUCED_DIRECTION
    return kind, "; ".join(["every condition holds on the measured data", *judged.notes])


WARM_START = "warm_start_sha256"


def _warm_start_problem(data_dirs: list) -> str | None:
    """Why the data dirs are not shown to start RL from one set of weights, or None.

    Only when some data dir records a warm start: runs that record none anywhere are judged as before.
    """
    recorded = {}
    for data in data_dirs:
        value = data.summary.get(WARM_START)
        if value is not None and (not isinstance(value, str) or not value):
            raise AuditInputError(
                f"malformed summary.json {data.path / 'summary.json'}: {WARM_START} should be a hash, "
                f"got {value!r}"
            )
        recorded[data.rel] = value
    hashes = sorted({value for value in recorded.values() if value is not None})
    if not hashes:
        return None
    problems = []
    if len(hashes) > 1:
        problems.append(
            f"its arms start RL from {len(hashes)} different warm starts "
            f"({', '.join(h[:7] for h in hashes)}): a difference between arms would not be a difference "
            f"between numerics"
        )
    unrecorded = [rel for rel, value in recorded.items() if value is None]
    if unrecorded:
        problems.append(
            f"{len(unrecorded)} of the {len(recorded)} data dirs it reads record no {WARM_START} "
            f"({', '.join(unrecorded)}) while the others do: their arms are not shown to start RL from "
            f"one warm start"
        )
    return "; ".join(problems)


def evaluate_claim(claim: dict, results_root: Path, run_cache: dict | None = None) -> Verdict:
    """The verdict for one claim, from the files under ``results_root`` only."""
    base = Verdict(claim["id"], claim["experiment"], NOT_RUN, "")
    if "out_of_reach" in claim:
        base.verdict = OUT_OF_REACH
        base.reason = claim["out_of_reach"]["reason"]
        base.needs = list(claim["out_of_reach"]["needs"])
        return base
    test = claim["test"]
    base.command = test["command"]
    if test["data"] == "benchmark":
        bench: Benchmark | None = load_benchmark(results_root, test["benchmark"])
        if bench is None:
            base.reason = f"no benchmark file reproduced/benchmarks/{test['benchmark']}.json"
            return base
        try:
            judged = _judge(claim, lambda op: resolve_operand(op, benchmark=bench))
        except MissingData as missing:
            base.reason = str(missing)
            return base
        base.verdict, base.reason = _verdict_from(claim, judged)
        base.measured, base.speed_ratio = judged.measured, judged.speed_ratio
        base.run, base.scale = bench.rel, "benchmark"
        base.provenance = _provenance_digest(bench.provenance)
        base.provenance_files = [bench.provenance_rel] if bench.provenance_rel else []
        return base
    cache = run_cache if run_cache is not None else {}
    if claim["experiment"] not in cache:
        cache[claim["experiment"]] = all_runs(results_root, claim["experiment"])
    scales = tuple(test.get("scales", JUDGED_SCALES))
    runs: list[Run] = order_runs(cache[claim["experiment"]], scales)
    key = (claim["experiment"], scales)
    if not runs:
        base.reason = f"no run under reproduced/{claim['experiment']}/ at scales {', '.join(key[1])}"
        return base
    lacking = []
    for run in runs:
        used: list[Resolved] = []
        try:
            for _, operand in iter_operands(test):
                used.append(resolve_operand(operand, run=run))
        except MissingData as missing:
            lacking.append(str(missing))
            continue
        data_dirs = list({id(d): d for r in used for d in r.data_dirs}.values())
        data_commits = {
            str(d.provenance.get("git_commit"))
            for d in data_dirs
            if d.provenance and d.provenance.get("git_commit")
        }
        all_commits = sorted(data_commits.union(*(r.commits for r in used)))
        judged = _judge(claim, lambda op, run=run: resolve_operand(op, run=run))
        base.verdict, base.reason = _verdict_from(claim, judged)
        incomparable = []
        if len(all_commits) > 1:
            # arms (or a postprocess over them) from different commits: a re-run in progress or a stale
            # arm; the code between them may have changed what a metric means
            incomparable.append(
                f"its data come from {len(all_commits)} commits ({', '.join(c[:7] for c in all_commits)}); "
                f"rerun the arms together: {test['command']} --force"
            )
        warm_start = _warm_start_problem(data_dirs)
        if warm_start:
            incomparable.append(warm_start)
        if incomparable:
            base.verdict, base.reason = NOT_RUN, "; ".join(incomparable)
        base.measured, base.speed_ratio = judged.measured, judged.speed_ratio
        base.run, base.scale = run.rel, run.scale
        counted = [r.steps for r in used if r.steps is not None]
        base.steps = judged.steps if judged.steps is not None else (max(counted) if counted else None)
        recorded = [d for d in data_dirs if d.provenance]
        if recorded:
            base.provenance = _provenance_digest(recorded[0].provenance)
            commits = sorted({str(d.provenance.get("git_commit")) for d in recorded})
            if len(commits) > 1:
                base.provenance["git_commit"] = ", ".join(commits)
        if len(data_dirs) > 1:
            base.arm_provenance = [_arm_provenance(d) for d in data_dirs]
        base.provenance_files = [
            d.rel + "provenance.json" for d in data_dirs if (d.path / "provenance.json").exists()
        ]
        return base
    base.reason = f"{len(runs)} run(s) found, none records what this claim needs: " + "; ".join(lacking[:3])
    return base


def evaluate_all(registry: Registry, results_root: Path, experiment: str | None = None) -> list[Verdict]:
    """Verdicts in registry order; first parses every run file of the experiments involved."""
    cache: dict = {}
    for name in registry.experiments:
        if experiment is None or name == experiment:
            cache[name] = all_runs(Path(results_root), name)
            for run in cache[name]:
                for data in run.data_dirs():
                    data.check()
    return [
        evaluate_claim(claim, Path(results_root), cache)
        for claim in registry.claims
        if experiment is None or claim["experiment"] == experiment
    ]


def verdicts_document(verdicts: list[Verdict]) -> dict:
    """The machine-readable record written beside the report (``results/verdicts.json``).

    Deterministic (no timestamps), so regenerating it without new data leaves git clean.
    """
    return {
        "description": "Verdict per published claim, generated by paper_figures/make_all.py; "
        "`zm audit --strict` fails when a reproduced-* verdict here no longer holds.",
        "claims": {v.claim_id: v.as_dict() for v in verdicts},
    }


def strict_regressions(current: list[Verdict], committed: dict) -> list[str]:
    """Claims whose committed reproduced-* verdict no longer holds (downgrades count)."""
    rank = {REPRODUCED_EXACT: 2, REPRODUCED_DIRECTION: 1}
    now = {v.claim_id: v for v in current}
    problems = []
    for claim_id, entry in sorted(committed.get("claims", {}).items()):
        was = entry.get("verdict") if isinstance(entry, dict) else None
        if was not in rank:
            continue
        verdict = now.get(claim_id)
        if verdict is None:
            problems.append(f"{claim_id}: committed {was}, but the claim is no longer in the registry")
        elif rank.get(verdict.verdict, 0) < rank[was]:
            problems.append(f"{claim_id}: committed {was}, now {verdict.verdict} ({verdict.reason})")
    return problems
