"""One RL step, aligned vs fast: rollout + learner seconds per step and per token, side by side.

Both arms run ``zeromismatch.rl.train`` (in-process, synchronous: lag 0) from the same checkpoint
(the same seeded initial weights) on the same env and workload, in the same dtype, with no
quantization; they differ only in the kernel set on both sides: ``aligned`` runs aligned-native in
the engine and the learner (bitwise-equal logprobs), ``fast`` runs fast-native in both (the
unaligned baseline of equal effort). Sampled episodes differ between the arms once their bits do,
so each step's time is also divided by the tokens it generated (the learner's ``tokens``). Arms
alternate (ABAB) over ``--repeats`` runs of ``--steps`` steps; the first step of each run (the
engine's step-graph captures, lazy inits) is left out; medians over the remaining steps.

Usage: ``python benchmarks/rl_step.py [--model tiny-qwen3] [--dtype float32] [--steps 6]
[--repeats 3] [--threads 1] [--quiet] [--out results/reproduced/benchmarks/rl_step.json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ARMS = {"aligned": "aligned-native", "fast": "fast-native"}
PHASES = ("time_rollout_s", "time_learner_s")


def run_arm(kernels: str, args, out: Path) -> list[dict]:
    from zeromismatch.rl import RLConfig, train

    config = RLConfig(
        env=args.env, model=args.model, kernels=kernels, rollout_kernels=kernels, dtype=args.dtype,
        steps=args.steps, prompts_per_step=args.prompts, group_size=args.group_size,
        max_new_tokens=args.max_new_tokens, eval_size=4, seed=args.seed,
    )  # fmt: skip
    train(config, out, quiet=True)
    with open(out / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if "time_rollout_s" in r][1:]  # the first step captures graphs


def summarize(records: list[dict]) -> dict:
    per_step = {p: statistics.median(r[p] for r in records) for p in PHASES}
    step = [r["time_rollout_s"] + r["time_learner_s"] for r in records]
    per_token = [s / r["tokens"] for s, r in zip(step, records, strict=True)]
    return {
        "steps_timed": len(records),
        "median_step_s": statistics.median(step),
        "median_phase_s": per_step,
        "median_step_s_per_token": statistics.median(per_token),
        "median_tokens_per_step": statistics.median(r["tokens"] for r in records),
    }


def main(argv: list[str] | None = None) -> int:
    from zeromismatch.argtypes import check_out_or_exit, int_at_least

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="arithmetic")
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--steps", type=int_at_least(2), default=6)
    parser.add_argument("--prompts", type=int_at_least(1), default=8)
    parser.add_argument("--group-size", type=int_at_least(1), default=4)
    parser.add_argument("--max-new-tokens", type=int_at_least(1), default=32)
    parser.add_argument("--repeats", type=int_at_least(1), default=3)
    parser.add_argument("--threads", type=int_at_least(1), default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--out", default="", help="write the result as JSON here (default: print only)")
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)
    from zeromismatch.envs import ENVS
    from zeromismatch.kernels.native import unavailable_reason
    from zeromismatch.models.presets import PRESETS

    if args.model not in PRESETS:
        parser.error(f"unknown --model {args.model!r}; choose from {sorted(PRESETS)}")
    if args.env not in ENVS:
        parser.error(f"unknown --env {args.env!r}; choose from {sorted(ENVS)}")
    if unavailable_reason():
        print(f"rl_step.py: the native kernel sets cannot run: {unavailable_reason()}", file=sys.stderr)
        return 2
    from zeromismatch._provenance import freeze_git_state, provenance
    from zeromismatch.io import atomic_write_json

    freeze_git_state()
    torch.set_num_threads(args.threads)
    records: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for arm in list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]:
                timed = run_arm(ARMS[arm], args, Path(tmp) / f"{arm}-{rep}")
                records[arm] += timed
                if not args.quiet:
                    rollout, learner = (statistics.median(r[p] for r in timed) for p in PHASES)
                    print(f"rep {rep} {arm:8s} {rollout:.3f} s rollout, {learner:.3f} s learner")
    arms = {arm: summarize(r) for arm, r in records.items()}
    aligned, fast = arms["aligned"], arms["fast"]
    result = {
        "benchmark": "rl_step",
        "config": vars(args),
        "kernels": ARMS,
        "arms": arms,
        # throughput ratios (above 1: aligned is faster), like the rollout benchmarks'
        "ratio_aligned_over_fast_per_step": fast["median_step_s"] / aligned["median_step_s"],
        "ratio_aligned_over_fast_per_token": fast["median_step_s_per_token"]
        / aligned["median_step_s_per_token"],
        "ratio_aligned_over_fast_by_phase": {
            p: fast["median_phase_s"][p] / aligned["median_phase_s"][p] for p in PHASES
        },
        "provenance": provenance(config=vars(args)),
    }
    if args.out:
        atomic_write_json(Path(args.out), result)
    print({k: v for k, v in result.items() if k.startswith("ratio")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
