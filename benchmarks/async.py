"""Async ÷ sync learner throughput on this machine, measured side by side in one run.

Both arms use the Ray executor with the same two actors (one rollout worker, one
learner, one CPU and one torch thread each) and the same workload; the only
difference is the lag schedule: sync trains batch s on weights version s (rollout and
learner alternate), async (lag k) lets the rollout of batch s+1 run while the
learner trains on batch s. Arms alternate (sync, async, sync, async, ...) so machine
noise hits both; we report medians of learner steps per second and their ratio.
The ceiling on two cores is (rollout + learner) / max(rollout, learner) per step,
computed from the sync arm's median step times and printed beside the measured ratio.
Both headline arms run with ``audit_rollout_version=False`` so the learner does the same work in
each; a third arm, ``async_audited``, is async as the experiments run it (at lag > 0 the learner
re-scores every batch with the weights that generated it, one extra forward per step, to split
kernel mismatch from weight lag) and is reported beside it.
Published (S3): 2.40x on 16 GPUs over 12,000 updates (68.55 h vs 164.77 h).

    python benchmarks/async.py [--steps 24] [--repeats 3] [--lag 4] [--quiet] [--out FILE.json]

It prints the ratios and writes JSON only with ``--out`` (``make bench`` and
``scripts/reproduce_mini.py`` pass ``results/reproduced/benchmarks/async.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from zeromismatch.argtypes import check_out_or_exit, int_at_least

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int_at_least(1), default=24)
    parser.add_argument("--repeats", type=int_at_least(1), default=3)
    parser.add_argument("--lag", type=int_at_least(1), default=4, help="the async arms' lag")
    parser.add_argument("--env", default="arithmetic")
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--out", default="", help="write the result as JSON here (default: print only)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    check_out_or_exit(parser, args.out)  # before any measuring
    from zeromismatch.envs import ENVS
    from zeromismatch.models.presets import PRESETS

    if args.model not in PRESETS:
        parser.error(f"unknown --model {args.model!r}; choose from {sorted(PRESETS)}")
    if args.env not in ENVS:
        parser.error(f"unknown --env {args.env!r}; choose from {sorted(ENVS)}")

    import ray

    from zeromismatch._provenance import provenance
    from zeromismatch.io import atomic_write_json
    from zeromismatch.rl import RLConfig, train
    from zeromismatch.rl.actors import init_ray

    init_ray(num_cpus=2)
    base = dict(
        env=args.env, model=args.model, steps=args.steps, prompts_per_step=8, group_size=4,
        max_new_tokens=16, eval_size=4, executor="ray",
    )  # fmt: skip
    # "async" and "sync" do the same learner work (no re-scoring at the rollout's version);
    # "async_audited" is async as the experiments run it: at lag > 0 the learner also re-scores
    # each batch with the weights that generated it (one extra no-grad forward per step), which
    # the sync arm never needs
    arms = (("sync", 0, False), ("async", args.lag, False), ("async_audited", args.lag, True))
    rates: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    step_times: dict[str, list[float]] = {"time_rollout_s": [], "time_learner_s": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for arm, lag, audit in arms:
                config = RLConfig(lag=lag, audit_rollout_version=audit, **base)
                summary = train(config, Path(tmp) / f"{arm}-{rep}", quiet=True)
                rates[arm].append(summary["learner_steps_per_s"])
                if arm == "sync":
                    with open(Path(tmp) / f"{arm}-{rep}" / "metrics.jsonl") as f:
                        for line in f:
                            record = json.loads(line)
                            for key in step_times:
                                step_times[key].append(record[key])
                if not args.quiet:
                    rate = summary["learner_steps_per_s"]
                    print(f"{arm:13s} rep {rep}: {rate:.3f} learner steps/s", flush=True)
    ray.shutdown()
    sync, async_ = statistics.median(rates["sync"]), statistics.median(rates["async"])
    async_audited = statistics.median(rates["async_audited"])
    rollout_s = statistics.median(step_times["time_rollout_s"])
    learner_s = statistics.median(step_times["time_learner_s"])
    result = {
        "benchmark": "async_vs_sync",
        "async_over_sync": async_ / sync,
        "sync_steps_per_s_median": sync,
        "async_steps_per_s_median": async_,
        "async_audited_over_sync": async_audited / sync,
        "async_audited_steps_per_s_median": async_audited,
        "samples": rates,
        "sync_step_median_s": {"rollout": rollout_s, "learner": learner_s},
        "ideal_over_sync": (rollout_s + learner_s) / max(rollout_s, learner_s),
        "lag": args.lag,
        "workload": base,
        "provenance": provenance(base),
    }
    if args.out:
        atomic_write_json(args.out, result)
    print(f"async (lag {args.lag}) / sync learner steps per second: {result['async_over_sync']:.2f}x "
          f"(medians {async_:.3f} vs {sync:.3f}; two-core ceiling {result['ideal_over_sync']:.2f}x from "
          f"step times {rollout_s * 1e3:.0f} ms rollout + {learner_s * 1e3:.0f} ms learner; "
          f"published 2.40x on 16 GPUs); with the learner's rollout-version audit on in the async arm: "
          f"{result['async_audited_over_sync']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
