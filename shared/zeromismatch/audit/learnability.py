"""The report's learnability section: held-out pass@1 before and after RL, per env and seed.

Reads ``results/reproduced/learnability/<case>/seed<k>/{summary,config}.json`` (written by
``scripts/learnability.py``) and renders one table row per case: the mean over seeds, every seed's
value, and in how many seeds RL raised sampled pass@1. "Learns" is computed, never typed: the mean
sampled pass@1 rose and it rose in a majority of seeds. A case whose files are absent is not shown.
"""

from __future__ import annotations

from pathlib import Path

from .registry import read_json

SUITE = ("reproduced", "learnability")


def _runs(case_dir: Path) -> list[tuple[int, dict, dict]]:
    runs = []
    for seed_dir in sorted(case_dir.glob("seed*")):
        summary_path, config_path = seed_dir / "summary.json", seed_dir / "config.json"
        if not summary_path.is_file() or not config_path.is_file():
            continue
        summary = read_json(summary_path, "learnability summary")
        config = read_json(config_path, "learnability config")
        runs.append((int(config.get("seed", seed_dir.name.removeprefix("seed"))), summary, config))
    return sorted(runs, key=lambda run: run[0])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _pair(runs, before: str, after: str) -> tuple[str, str, int]:
    b = [float(s[before]) for _, s, _ in runs]
    a = [float(s[after]) for _, s, _ in runs]
    raised = sum(y > x for x, y in zip(b, a))
    per_seed = ", ".join(f"{x:.2f}→{y:.2f}" for x, y in zip(b, a))
    return f"{_mean(b):.3f} → {_mean(a):.3f}", per_seed, raised


def case_rows(root: Path) -> list[dict]:
    """One dict per case with its aggregated numbers (what the table shows), for tests and reuse."""
    suite = root.joinpath(*SUITE)
    rows = []
    if not suite.is_dir():
        return rows
    for case_dir in sorted(p for p in suite.iterdir() if p.is_dir() and not p.name.startswith(".")):
        runs = _runs(case_dir)
        if not runs or any("eval_sampled_pass_at_1_after" not in s for _, s, _ in runs):
            continue
        greedy, greedy_seeds, _ = _pair(runs, "eval_pass_at_1_before", "eval_pass_at_1_after")
        sampled, sampled_seeds, raised = _pair(
            runs, "eval_sampled_pass_at_1_before", "eval_sampled_pass_at_1_after"
        )
        reward, _, _ = _pair(runs, "reward_mean_first_fifth", "reward_mean_last_fifth")
        before = _mean([float(s["eval_sampled_pass_at_1_before"]) for _, s, _ in runs])
        after = _mean([float(s["eval_sampled_pass_at_1_after"]) for _, s, _ in runs])
        config = runs[0][2]
        rows.append(
            {
                "case": case_dir.name,
                "env": config["env"],
                "model": config["model"],
                "lag": config["lag"],
                "kernels": config["kernels"],
                "steps": config["steps"],
                "seeds": [seed for seed, _, _ in runs],
                "greedy": greedy,
                "greedy_per_seed": greedy_seeds,
                "sampled": sampled,
                "sampled_per_seed": sampled_seeds,
                "train_reward": reward,
                "raised_in": raised,
                "learns": after > before and raised * 2 > len(runs),
                "k3_kl_max": max(float(s.get("k3_kl_max_over_steps", 0.0)) for _, s, _ in runs),
            }
        )
    return sorted(rows, key=lambda row: (row["env"], row["lag"], row["case"]))


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
            f"{','.join(map(str, r['seeds']))} | {r['greedy']} | {r['sampled']} | {r['sampled_per_seed']} | "
            f"{r['raised_in']}/{len(r['seeds'])} | {r['train_reward']} | {r['k3_kl_max']:.1e} | "
            f"{'yes' if r['learns'] else 'no'} |"
        )
    return lines
