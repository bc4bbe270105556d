"""The report's learnability section: held-out pass@1 before and after RL, per env and seed.

Reads ``results/reproduced/learnability/<case>/seed<k>/{summary,config}.json`` (written by
``scripts/learnability.py``) and renders one table row per case: the mean over seeds, every seed's
value, and in how many seeds RL raised sampled pass@1. "Learns" is computed, never typed: the mean
sampled pass@1 rose and it rose in a majority of seeds. A case whose files are absent is not shown.
"""

from __future__ import annotations

from pathlib import Path

from .registry import AuditInputError, read_json

SUITE = ("reproduced", "learnability")


SAMPLED = ("eval_sampled_pass_at_1_before", "eval_sampled_pass_at_1_after")


def _runs(case_dir: Path) -> list[tuple[dict, dict]]:
    """(summary, config) of each finished seed run of a case, by seed."""
    runs = []
    for seed_dir in sorted(case_dir.glob("seed*")):
        summary_path, config_path = seed_dir / "summary.json", seed_dir / "config.json"
        if not summary_path.is_file() or not config_path.is_file():
            continue
        summary = read_json(summary_path, "learnability summary")
        if any(summary.get(key) is None for key in SAMPLED):
            raise AuditInputError(
                f"{summary_path}: no sampled pass@1 (the suite's runs need eval_samples > 0)"
            )
        runs.append((summary, read_json(config_path, "learnability config")))
    return sorted(runs, key=lambda run: run[1]["seed"])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _before_after(runs, before: str, after: str) -> list[tuple[float, float]]:
    return [(float(summary[before]), float(summary[after])) for summary, _ in runs]


def case_rows(root: Path) -> list[dict]:
    """One dict per case with its numbers: before/after pairs per seed (in seed order) and their means."""
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
        config = runs[0][1]
        rows.append(
            {
                "case": case_dir.name,
                "env": config["env"],
                "model": config["model"],
                "lag": config["lag"],
                "kernels": config["kernels"],
                "steps": config["steps"],
                "seeds": [run_config["seed"] for _, run_config in runs],
                "greedy": _before_after(runs, "eval_pass_at_1_before", "eval_pass_at_1_after"),
                "sampled": sampled,
                "train_reward": _before_after(runs, "reward_mean_first_fifth", "reward_mean_last_fifth"),
                "raised_in": raised,
                "learns": _mean([a for _, a in sampled]) > _mean([b for b, _ in sampled])
                and 2 * raised > len(runs),
                "k3_kl_max": max(float(summary["k3_kl_max_over_steps"]) for summary, _ in runs),
            }
        )
    return sorted(rows, key=lambda row: (row["env"], row["lag"], row["case"]))


def _means(pairs: list[tuple[float, float]]) -> str:
    return f"{_mean([b for b, _ in pairs]):.3f} → {_mean([a for _, a in pairs]):.3f}"


def _per_seed(pairs: list[tuple[float, float]]) -> str:
    return ", ".join(f"{before:.2f}→{after:.2f}" for before, after in pairs)


def learnability_lines(root: Path) -> list[str]:
    rows = case_rows(Path(root))
    if not rows:
        return []
    lines = [
        "",
        "## Learnability (mini, every env, several seeds)",
        "",
        "SFT warm start, then REINFORCE Zero; held-out pass@1 on the env's eval split before → after RL "
        "(`results/reproduced/learnability/`, `scripts/learnability.py`). Sampled = the c/n estimate at the "
        "training temperature; train reward = mean episode reward over the first → last fifth of RL steps. "
        "*Learns* = mean sampled pass@1 rose and rose in a majority of seeds.",
        "",
        "| case | env | model | lag | RL steps | seeds | greedy pass@1 | sampled pass@1 | sampled, per seed "
        "| raised in | train reward | k3 KL max | learns |",
        "|---|---|---|---:|---:|---|---|---|---|---:|---|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['env']} | {r['model']} | {r['lag']} | {r['steps']} | "
            f"{','.join(map(str, r['seeds']))} | {_means(r['greedy'])} | {_means(r['sampled'])} | "
            f"{_per_seed(r['sampled'])} | {r['raised_in']}/{len(r['seeds'])} | {_means(r['train_reward'])} | "
            f"{r['k3_kl_max']:.1e} | "
            f"{'yes' if r['learns'] else 'no'} |"
        )
    return lines
