"""How large is the baseline's mismatch: every numeric stack on every experiment's warm-started weights.

For each experiment, its mini config's supervised warm start is made once (the same bits its arms start
RL from; saved under ``--warm-root``, default ``runs/warm_starts/<experiment>/``, and reused when present),
then ``zm parity --checkpoint`` runs every stack of ``rl/stacks.py`` on it: the policy's own task prompts,
staggered arrivals, the run's sampling settings. Random-init weights understate the mismatch 4-150x,
so none is measured here. Writes ``results/reproduced/baseline_mismatch/<experiment>.json`` (with
provenance and the warm start's weights hash) and prints the Markdown table docs/parity.md carries.

    python scripts/baseline_mismatch.py [--only deepseek_v4_flash_100steps ...] [--num-prompts 32] [--quiet]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "reproduced" / "baseline_mismatch"
KEYS = ("diff_max", "diff_mean", "diff_std", "k3_kl", "nonfinite_tokens", "tokens")


def experiment(name: str):
    from zeromismatch.experiment.spec import load_experiment_configs

    return load_experiment_configs(ROOT / "experiments" / name).EXPERIMENT


def warm_start_config(exp):
    """The experiment's warm start: its first mini arm's config (every arm of an experiment shares the
    env, model, seed and SFT settings), on the learner's own numerics."""
    from zeromismatch.rl.stacks import stack_fields

    return exp.arms_for("mini")[0].config.replace(**stack_fields("aligned-fp32"))


def measure(name: str, warm_root: Path, num_prompts: int, quiet: bool) -> dict:
    from zeromismatch import _provenance
    from zeromismatch.parity import run_parity
    from zeromismatch.rl.stacks import STACKS
    from zeromismatch.rl.trained import load_trained_policy, make_warm_start

    exp = experiment(name)
    config = warm_start_config(exp)
    shared_key = None
    if config.warm_start == "shared":
        # the very bits the arms start RL from: the shared warm start of the recipe (rl/warm_start.py),
        # cached under the warm root; its hash is every arm's summary ``warm_start_sha256``
        from zeromismatch.rl.warm_start import shared_warm_start

        shared = shared_warm_start(config, quiet=quiet, root=warm_root / "shared")
        where, shared_key = shared.path, shared.key
        trained = load_trained_policy(where)
    else:
        where = warm_root / name
        trained = None
        if (where / "checkpoints").is_dir():
            trained = load_trained_policy(where)
            if trained.config.to_dict() != config.to_dict():
                raise ValueError(f"{where} holds another warm start than {name}'s config; remove it")
        if trained is None:
            trained = make_warm_start(config, where, quiet=quiet)
    rows = {}
    bar = tqdm(sorted(STACKS), desc=name, disable=quiet, leave=False)
    for stack in bar:
        s = STACKS[stack]
        numerics = s.fields()
        try:
            result = run_parity(
                None, checkpoint=str(where), seed=0, num_prompts=num_prompts,
                max_tokens=config.max_new_tokens,
                temperature=config.temperature, top_k=config.top_k, top_p=config.top_p, max_num_seqs=8,
                max_num_batched_tokens=64, max_prompt_len=10_000, **numerics,
            )  # fmt: skip
            rows[stack] = {key: result[key] for key in KEYS}
        except ValueError as err:  # a format this model's shapes cannot take: said, not skipped silently
            rows[stack] = {"not_run": str(err)}
    return {
        "experiment": name,
        "model": config.model,
        "env": config.env,
        "warm_start": {
            "sft_steps": config.sft_steps,
            "weights_sha256": trained.weights_sha256,
            "shared_key": shared_key,
        },
        "num_prompts": num_prompts,
        "max_tokens": config.max_new_tokens,
        "stacks": rows,
        "provenance": _provenance.provenance(config.to_dict()),
    }


def table(results: list[dict]) -> str:
    def cell(row: dict, key: str) -> str:
        value = row.get(key)
        if value is None:
            return "n/a"
        return f"{value:.1e}" if isinstance(value, float) and value else str(value)

    lines = [
        "| experiment (preset, env) | stack | diff max | diff mean | diff std | k3 "
        "| out of support / tokens |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        where = f"{result['experiment']} ({result['model']}, {result['env']})"
        for stack, row in result["stacks"].items():
            if "not_run" in row:
                lines.append(f"| {where} | `{stack}` | not run: {row['not_run']} |||||")
                continue
            support = f"{row['nonfinite_tokens']} / {row['tokens'] + row['nonfinite_tokens']}"
            lines.append(
                f"| {where} | `{stack}` | {cell(row, 'diff_max')} | {cell(row, 'diff_mean')} | "
                f"{cell(row, 'diff_std')} | {cell(row, 'k3_kl')} | {support} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from zeromismatch.io import atomic_write_json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/configs.py"))
    parser.add_argument("--only", nargs="+", choices=names, default=names, metavar="EXPERIMENT")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--warm-root", default=str(ROOT / "runs" / "warm_starts"))
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.num_prompts < 1:
        print("baseline_mismatch: --num-prompts must be >= 1", file=sys.stderr)
        return 2
    results = []
    for name in tqdm(args.only, desc="experiments", disable=args.quiet):
        result = measure(name, Path(args.warm_root), args.num_prompts, args.quiet)
        atomic_write_json(OUT / f"{name}.json", result)
        results.append(result)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
