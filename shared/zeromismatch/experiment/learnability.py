"""Learnability suite (issue 6): does a tiny policy learn each env, and does async RL keep learning?

For every env the recipe is the one the experiments use: an SFT warm start on the env's generated
demonstrations, then REINFORCE Zero on the aligned kernels, with held-out pass@1 measured before and
after RL on the env's eval split (``eval_size`` distinct tasks whose split key -- what decides the
answer: the prompt, the unordered operands of a sum, a code fix -- no training task shares; until
session 13 the key was the prompt text, which leaked answers: docs/learnability.md). ``sampled`` pass@1 is
the unbiased c/n estimate at the training temperature, the quantity RL optimises; ``greedy`` pass@1
only moves when an argmax flips.

One seed of a 2-layer model on 32-128 eval prompts is noise (on single-digit arithmetic at lag 0,
held-out greedy pass@1 rose 0.16 -> 0.28 for seed 1 and fell for seeds 0, 2 and 3, e.g. 0.64 -> 0.41),
so every case runs on several seeds and the audit reports the mean, every seed, and in how many seeds
RL raised the metric. The configs were chosen by the probes in docs/learnability.md; the cases and
seeds below are the whole suite, and none is dropped after its runs.

Runs go through the same ``rl.train`` as every experiment, one directory per (case, seed):
``results/reproduced/learnability/<case>/seed<k>/`` of the checkout in use (``zeromismatch.checkout``;
written atomically; finished runs are skipped unless ``--force``). The report's "Learnability" section
is rendered from those files alone.

    python scripts/learnability.py [--cases tools_lag64,desktop] [--seeds 0 1 2] [--force] [--quiet]
"""

from __future__ import annotations

import time
from pathlib import Path

from ..checkout import checkout_root
from ..rl.config import RLConfig
from .runner import run_arm
from .spec import Arm

SEEDS = (0, 1, 2)
SUITE_DIR = "learnability"


def _arithmetic(**changes) -> RLConfig:
    # Two-digit addition answered least-significant digit first: the carry rule is learnable by the
    # 2-layer model, so held-out problems share what RL reinforces; single-digit facts do not (a held-out
    # fact cannot be inferred from others). On the leak-free split (session 13) seed 0's held-out greedy
    # pass@1 is 0.20 / 0.45 / 0.84 after 1000 / 2000 / 3000 SFT steps; SFT 1000 and RL lr 1e-4 (1e-3
    # collapsed the policy) were chosen on the old prompt-keyed split, where commuted twins in training
    # inflated seed 0's SFT-1000 score to 0.53, and were kept unchanged rather than re-tuned on the rerun.
    return RLConfig(
        env="arithmetic", model="tiny-qwen3", algo="reinforce_zero", kernels="aligned", steps=100,
        prompts_per_step=8, group_size=8, max_new_tokens=4, sft_steps=1000, sft_lr=1e-3, lr=1e-4,
        eval_size=128, eval_samples=4, env_options={"max_digits": 2, "ops": "+", "answer_order": "lsd"},
    ).replace(**changes)  # fmt: skip


def _tools(**changes) -> RLConfig:
    return RLConfig(
        env="tools", model="tiny-qwen3", algo="reinforce_zero", kernels="aligned", steps=80,
        prompts_per_step=8, group_size=4, max_new_tokens=24, sft_steps=300, lr=3e-4,
        eval_size=64, eval_samples=2,
    ).replace(**changes)  # fmt: skip


def _code_repair(**changes) -> RLConfig:
    return RLConfig(
        env="code_repair", model="tiny-qwen3", algo="reinforce_zero", kernels="aligned", steps=40,
        prompts_per_step=8, group_size=4, max_new_tokens=32, sft_steps=100, sft_batch=8, lr=1e-3,
        eval_size=64, eval_samples=2,
    ).replace(**changes)  # fmt: skip


def _desktop(**changes) -> RLConfig:
    # Compact observations with the goal restated on app screens: with the full action lists a desktop
    # episode is ~440 tokens and 300-600 SFT steps left held-out pass@1 at 0.00-0.03 (field values not
    # copied from the task line); compact + restated, 500 SFT steps reached 0.25. Free-text mail values:
    # with the fixed value sets every train task was demonstrated many times over, RL raised train reward
    # by recall and held-out pass@1 did not move (0.25 -> 0.25 in 2 of 3 seeds); with free text the
    # skill RL reinforces on the mail tasks (copying) is the one held-out tasks need (settings and
    # calendar tasks keep fixed value sets and still repeat). SFT 750 and RL lr 3e-4
    # x 60 steps were chosen on seed 0 (lr 1e-3 collapsed; docs/learnability.md).
    return RLConfig(
        env="desktop", model="tiny-qwen3", algo="reinforce_zero", kernels="aligned", steps=60,
        prompts_per_step=8, group_size=4, max_new_tokens=24, sft_steps=750, lr=3e-4,
        eval_size=64, eval_samples=2,
        env_options={"list_actions": False, "restate_goal": True, "free_text": True},
    ).replace(**changes)  # fmt: skip


def cases() -> list[Arm]:
    return [
        Arm("arithmetic", _arithmetic(lag=0), "two-digit addition, digits least-significant first; sync"),
        Arm("arithmetic_lag64", _arithmetic(lag=64), "two-digit addition, async at policy lag 64"),
        Arm("tools", _tools(lag=0), "multi-turn calculator tool use; sync"),
        Arm("tools_lag8", _tools(lag=8), "tool use, async at policy lag 8"),
        Arm("tools_lag64", _tools(lag=64), "tool use, async at policy lag 64"),
        # the learner on fp32 master weights, the engine on per-channel FP8 weights re-quantized at every
        # weight update (`zm train --rollout-quant fp8`): RL must still learn across the format gap
        Arm(
            "tools_rollout_fp8",
            _tools(lag=0, rollout_quant="fp8"),
            "tool use, sync; rollout on FP8 weights, learner on fp32 masters",
        ),
        Arm("code_repair", _code_repair(lag=0), "fix one line of a small function; sync"),
        Arm("desktop", _desktop(lag=0), "screens and actions (OSWorld stand-in); sync"),
    ]


def smoke_cases() -> list[Arm]:
    tiny = dict(steps=2, sft_steps=1, eval_size=2, eval_samples=1)
    return [Arm(c.name, c.config.replace(**tiny), c.note) for c in cases()]


def select(names: list[str] | None, available: list[Arm]) -> list[Arm]:
    if not names:
        return available
    have = [c.name for c in available]
    unknown = sorted(set(names) - set(have))
    if unknown:
        raise ValueError(f"unknown learnability case(s) {unknown}; the suite has {have}")
    return [c for c in available if c.name in names]


def run_suite(
    chosen: list[Arm],
    seeds: tuple[int, ...] = SEEDS,
    out_root: str | Path | None = None,
    force: bool = False,
    quiet: bool = False,
) -> dict[str, dict[int, dict]]:
    """Run every (case, seed) not already finished; returns the summaries of the runs made now."""
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct non-negative integers, got {list(seeds)}")
    if out_root:
        root = Path(out_root)
    else:
        root = checkout_root("--out-root DIR") / "results" / "reproduced" / SUITE_DIR
    made: dict[str, dict[int, dict]] = {}
    for case in chosen:
        for seed in seeds:
            final = root / case.name / f"seed{seed}"
            label = f"{SUITE_DIR}/{case.name}/seed{seed}"
            if (final / "summary.json").exists() and not force:
                if not quiet:
                    print(f"{label}: done already (--force reruns it)")
                continue
            start = time.perf_counter()
            seeded = Arm(f"{case.name}_seed{seed}", case.config.replace(seed=seed), case.note)
            made.setdefault(case.name, {})[seed] = run_arm(seeded, str(final), quiet)
            if not quiet:
                print(f"{label}: done in {time.perf_counter() - start:.0f} s", flush=True)
    return made
