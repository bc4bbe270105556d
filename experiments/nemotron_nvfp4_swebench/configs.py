"""S1: Nemotron-3.5 (Mamba hybrid, NVFP4) on SWE-bench Pro — the consistent run's 5-step
rolling score stays ~0.6 while the baseline falls from 0.56 to 0.23 (0.22 in the write-up).

Mini stand-in: tiny-nemotron-h (Mamba2, attention, MLP and MoE layers) on the *procedural* code-repair
env (``env_options={"procedural": True}``): an issue text and a numbered buggy function, identifiers and
constants drawn per task, the fix one edited copy of a prompt line, hidden tests deciding "solved". The
score S1 plots is the share of tasks solved *during training*, as a 5-step rolling mean: each step
records it as ``solved_rate`` (the hidden tests, not the visible-test reward the loss sees); held-out
greedy pass@1 every 25 steps sits beside it. Every arm starts RL from ONE shared warm start (an SFT built
once in fp32, ``rl/warm_start.py``) that already solves about half the held-out tasks, as S1's score
starts at 0.56. All arms train with plain REINFORCE and **no correction** (``algo="reinforce"``), as S1's
baseline did.

- ``aligned`` (3 seeds): NVFP4 weights on both sides (the learner fake-quantizes its fp32 masters,
  ``rl/stacks.py`` ``aligned-nvfp4``) on the aligned-native kernels: the consistent run.
- ``fast`` (3 seeds): the NVFP4 high-performance baseline (``fast-nvfp4``: a bf16 rollout on stock
  kernels with NVFP4 weights, an FP8 KV cache and a bf16 head) against the same fp32-master learner.
- ``default`` (one seed): stock kernels on both sides in fp32 (re-association only).

Hyper-parameters (docs/learnability.md): SFT lr 1e-3 (at 3e-3 the hybrid's SFT loss stalls near 0.37 and
held-out pass@1 stays 0 to 600 steps), SFT length the shortest probed that starts held-out pass@1 near
S1's 0.56; the RL lr chosen on seed 0 by the aligned arm's held-out pass@1 from a short sweep. The fast
arm runs the same settings; seeds 1-2 ran untouched afterwards.
"""

from __future__ import annotations

from zeromismatch.experiment import Arm, Experiment, FullScale
from zeromismatch.rl import RLConfig
from zeromismatch.rl.stacks import stack_fields

SEEDS = (0, 1, 2)
STEPS = 200  # hundreds of steps, for a drift to have time to show (S1 states no step count)
SFT_STEPS = 900  # the shortest probed SFT whose held-out greedy pass@1 starts near S1's 0.56 (0.55)
LR = 1e-4  # chosen on seed 0 by the aligned arm's held-out pass@1 (docs/learnability.md)
NATIVE = "aligned-native"


# max_new_tokens 40: the longest procedural fix (a numbered range line) is 33 tokens; less would make
# some bugs unfixable
def _base(**changes) -> RLConfig:
    return RLConfig(
        env="code_repair", env_options={"procedural": True}, model="tiny-nemotron-h", algo="reinforce",
        steps=STEPS, prompts_per_step=8, group_size=4, max_new_tokens=40, sft_steps=SFT_STEPS, sft_batch=16,
        sft_lr=1e-3, lr=LR, eval_size=64, eval_samples=2, eval_every=25, warm_start="shared", sft_seed=0,
        seed=0,
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("aligned", _base(**stack_fields("aligned-nvfp4", kernels=NATIVE)),
            "aligned-native kernels, NVFP4 weights on engine and trainer", seeds=SEEDS),
        Arm("fast", _base(**stack_fields("fast-nvfp4", kernels=NATIVE)),
            "the NVFP4 high-performance baseline: bf16 stock-kernel rollout, NVFP4 weights, FP8 KV cache, "
            "bf16 head, against the fp32-master aligned-native learner; no correction", seeds=SEEDS),
        Arm("default", _base(kernels="default"), "stock kernels on both sides in fp32 (re-association only)"),
    ]  # fmt: skip


def smoke() -> list[Arm]:
    tiny = dict(steps=1, sft_steps=1, eval_size=2, eval_samples=1, eval_every=0)
    return [Arm(a.name, a.config.replace(**tiny), a.note) for a in mini()]


EXPERIMENT = Experiment(
    name="nemotron_nvfp4_swebench",
    claim="aligned kernels keep SWE-bench-style reward stable where the baseline collapses",
    arms={"smoke": smoke, "mini": mini},
    full=FullScale(
        model="Nemotron-3.5 (Mamba hybrid)",
        rollout_engine="vllm",
        trainer="megatron",
        gpus=None,
        nodes=4,
        updates=None,
        env="swe-bench-pro",
        precision="nvfp4",
        source="S1",
        assumed=("nodes",),
    ),
)
