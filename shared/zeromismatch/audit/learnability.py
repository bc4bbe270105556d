"""The report's learnability section: held-out pass@1 before and after RL, per env and seed.

Reads ``results/reproduced/learnability/<case>/seed<k>/{summary,config}.json`` (written by
``scripts/learnability.py``) and renders one table row per case: the mean over seeds, every seed's
value, and in how many seeds RL raised sampled pass@1. "Learns" is computed, never typed: the mean
sampled pass@1 rose and it rose in a majority of seeds. Every (case, seed) of the suite
(``zeromismatch.experiment.learnability``: ``cases()`` x ``SEEDS``) that has no finished run is listed as
"not run" with the command that makes it, so a gap never disappears from the report; a file that is
malformed (not an object, a key missing, a number that is not one) is an :class:`AuditInputError`
naming it. Directories starting with ``.`` (runs in progress) are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..nanmath import max_nan_wins
from .inputs import Node
from .registry import AuditInputError

SUITE = ("reproduced", "learnability")
SUITE_COMMAND = "python scripts/learnability.py"


SAMPLED = ("eval_sampled_pass_at_1_before", "eval_sampled_pass_at_1_after")


_BEFORE_AFTER = (
    SAMPLED,
    ("eval_pass_at_1_before", "eval_pass_at_1_after"),
    ("reward_mean_first_fifth", "reward_mean_last_fifth"),
)


def _run(summary_path: Path, config_path: Path) -> dict:
    """One seed run's numbers, read and type-checked (a malformed file is one AuditInputError)."""
    summary = Node.load(summary_path, "learnability summary")
    summary.obj()
    if any(not summary.has(key) for key in SAMPLED):
        raise AuditInputError(f"{summary_path}: no sampled pass@1 (the suite's runs need eval_samples > 0)")
    config = Node.load(config_path, "learnability config")
    run = {key: summary[key].number() for pair in _BEFORE_AFTER for key in pair}
    run["k3_kl_max_over_steps"] = summary["k3_kl_max_over_steps"].number()
    run["config"] = {key: config[key].text() for key in ("env", "model", "kernels")}
    run["config"].update({key: config[key].integer() for key in ("lag", "steps")})
    run["seed"] = config["seed"].integer()
    # everything but the seed: a case's seeds must be one set-up to be averaged as one
    run["setup"] = json.dumps({k: v for k, v in config.obj().items() if k != "seed"}, sort_keys=True)
    provenance = summary_path.parent / "provenance.json"
    commit = None
    if provenance.is_file():
        commit = Node.load(provenance, "learnability provenance").obj().get("git_commit")
    run["commit"] = str(commit) if commit else "unknown"  # whole: "-dirty" must tell two runs apart
    return run


def expected_runs() -> dict[str, tuple[int, ...]]:
    """The suite as defined in code: every case name with the seeds it runs on."""
    from ..experiment.learnability import (  # imports the RL stack (torch); only the names are used
        SEEDS,
        cases,
    )

    return {case.name: tuple(SEEDS) for case in cases()}


def _finished_seed_dirs(case_dir: Path) -> list[Path]:
    """The ``seed<k>`` directories of a case whose run finished (summary and config both written)."""
    return [
        seed_dir
        for seed_dir in sorted(case_dir.glob("seed*"))
        if (seed_dir / "summary.json").is_file() and (seed_dir / "config.json").is_file()
    ]


def _finished_seeds(case_dir: Path) -> set[int]:
    """Seeds with a finished run, by directory name (``seed<k>``)."""
    numbers = (seed_dir.name[len("seed") :] for seed_dir in _finished_seed_dirs(case_dir))
    return {int(number) for number in numbers if number.isdigit()}


def missing_runs(
    root: Path, expected: dict[str, tuple[int, ...]] | None = None
) -> list[tuple[str, list[int]]]:
    """``(case, seeds without a finished run)`` for every case of the suite that lacks one, in suite order."""
    expected = expected_runs() if expected is None else expected
    suite = Path(root).joinpath(*SUITE)
    gaps = []
    for case, seeds in expected.items():
        done = _finished_seeds(suite / case) if (suite / case).is_dir() else set()
        absent = [seed for seed in seeds if seed not in done]
        if absent:
            gaps.append((case, absent))
    return gaps


def _runs(case_dir: Path) -> list[dict]:
    """Each finished seed run of a case, by seed."""
    runs = [_run(d / "summary.json", d / "config.json") for d in _finished_seed_dirs(case_dir)]
    return sorted(runs, key=lambda run: run["seed"])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _before_after(runs: list[dict], before: str, after: str) -> list[tuple[float, float]]:
    return [(run[before], run[after]) for run in runs]


def case_rows(root: Path, expected: dict[str, tuple[int, ...]] | None = None) -> list[dict]:
    """One dict per case with its numbers: before/after pairs per seed (in seed order) and their means.

    ``learns`` is True/False only when every seed ran one set-up at one commit: "mixed" when the seeds'
    configs (seed aside) or commits differ (a re-run in progress, or a stale seed), since their mean
    would average two experiments; the majority counts the suite's seeds (``expected``), not only the
    finished ones."""
    suite = root.joinpath(*SUITE)
    if not suite.is_dir():
        return []
    rows = []
    for case_dir in sorted(p for p in suite.iterdir() if p.is_dir() and not p.name.startswith(".")):
        runs = _runs(case_dir)
        if not runs:
            continue
        sampled = _before_after(runs, *SAMPLED)
        raised = sum(after > before for before, after in sampled)
        config = runs[0]["config"]
        seeds_expected = len((expected or {}).get(case_dir.name, runs))
        commits = sorted({run["commit"] for run in runs})
        uniform = len({run["setup"] for run in runs}) == 1 and len(commits) == 1
        learns = (
            _mean([a for _, a in sampled]) > _mean([b for b, _ in sampled]) and 2 * raised > seeds_expected
        )
        if uniform and len(runs) < seeds_expected:
            learns = f"pending: {len(runs)} of {seeds_expected} seeds"
        rows.append(
            {
                "case": case_dir.name,
                **config,
                "seeds": [run["seed"] for run in runs],
                "greedy": _before_after(runs, "eval_pass_at_1_before", "eval_pass_at_1_after"),
                "sampled": sampled,
                "train_reward": _before_after(runs, "reward_mean_first_fifth", "reward_mean_last_fifth"),
                "raised_in": raised,
                "learns": learns if uniform else "mixed",
                "commits": commits,
                "k3_kl_max": max_nan_wins([run["k3_kl_max_over_steps"] for run in runs]),
            }
        )
    return sorted(rows, key=lambda row: (row["env"], row["lag"], row["case"]))


def _learns_text(learns) -> str:
    if learns == "mixed":
        return "mixed runs: seeds differ in config or commit"
    if isinstance(learns, str):
        return learns
    return "yes" if learns else "no"


def _short(commit: str) -> str:
    return commit[:7] + ("-dirty" if "dirty" in commit else "") if commit != "unknown" else commit


def _means(pairs: list[tuple[float, float]]) -> str:
    return f"{_mean([b for b, _ in pairs]):.3f} → {_mean([a for _, a in pairs]):.3f}"


def _per_seed(pairs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{before:.2f}→{after:.2f}" for before, after in pairs)


def _not_run_lines(gaps: list[tuple[str, list[int]]], expected: dict[str, tuple[int, ...]]) -> list[str]:
    lines = []
    for case, seeds in gaps:
        if list(seeds) == list(expected[case]):
            what, command = f"{case} (every seed)", f"{SUITE_COMMAND} --cases {case}"
        else:
            what = f"{case} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
            command = f"{SUITE_COMMAND} --cases {case} --seeds {' '.join(map(str, seeds))}"
        lines.append(f"- not run: {what} (run: `{command}`)")
    return lines


HEADING = "## Learnability (mini, every env, several seeds)"


def learnability_lines(root: Path, expected: dict[str, tuple[int, ...]] | None = None) -> list[str]:
    """The section's Markdown: one row per case with runs, then a "not run" line per gap in the suite.
    ``expected`` (case -> seeds) defaults to the suite in :mod:`zeromismatch.experiment.learnability`."""
    expected = expected_runs() if expected is None else expected
    rows = case_rows(Path(root), expected)
    gaps = missing_runs(Path(root), expected)
    if not rows:
        if not expected:
            return []
        return ["", HEADING, "", f"- not run: the whole learnability suite (run: `{SUITE_COMMAND}`)"]
    lines = [
        "",
        HEADING,
        "",
        "SFT warm start, then REINFORCE Zero; held-out pass@1 on the env's eval split before → after RL "
        "(`results/reproduced/learnability/`, `scripts/learnability.py`). Sampled = the c/n estimate at the "
        "training temperature; train reward = mean episode reward over the first → last fifth of RL steps. "
        "*Learns* = mean sampled pass@1 rose and rose in a majority of the suite's seeds; only decided "
        "when every seed ran one config at one commit.",
        "",
        "| case | env | model | lag | RL steps | seeds | greedy pass@1 | sampled pass@1 | sampled, per seed "
        "| raised in | train reward | k3 KL max | commit | learns |",
        "|---|---|---|---:|---:|---|---|---|---|---:|---|---:|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['env']} | {r['model']} | {r['lag']} | {r['steps']} | "
            f"{','.join(map(str, r['seeds']))} | {_means(r['greedy'])} | {_means(r['sampled'])} | "
            f"{_per_seed(r['sampled'])} | {r['raised_in']}/{len(r['seeds'])} | {_means(r['train_reward'])} | "
            f"{r['k3_kl_max']:.1e} | {', '.join(map(_short, r['commits']))} | "
            f"{_learns_text(r['learns'])} |"
        )
    if gaps:
        lines += ["", *_not_run_lines(gaps, expected)]
    return lines
