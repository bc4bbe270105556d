"""S1: Nemotron-3.5 (Mamba hybrid, NVFP4) on SWE-bench Pro — the consistent run's 5-step
rolling reward stays ~0.6 while the baseline falls from 0.56 to 0.23 (0.22 in the write-up).

Mini stand-in: tiny-nemotron-h (Mamba2 + attention + MLP layers) on the code-repair env
(reward = fraction of unit tests passing), aligned vs default kernels. NVFP4 weights are
exercised by `zm parity --quant nvfp4`; RL on quantized weights is not in this build.
"""

from __future__ import annotations

from zeromismatch.expt import Arm, Experiment, FullScale
from zeromismatch.rl import RLConfig


def _base(**changes) -> RLConfig:
    return RLConfig(
        env="code_repair", model="tiny-nemotron-h", algo="reinforce_zero", steps=20,
        prompts_per_step=4, group_size=2, max_new_tokens=20, sft_steps=50, sft_batch=8, lr=3e-4,
        eval_size=8, seed=0,
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("aligned", _base(kernels="aligned"), "aligned kernels (consistent run)"),
        Arm("default", _base(kernels="default"), "stock fast kernels on both sides (baseline)"),
    ]


def smoke() -> list[Arm]:
    return [Arm(a.name, a.config.replace(steps=1, sft_steps=1, eval_size=2), a.note) for a in mini()]


EXPERIMENT = Experiment(
    name="nemotron_nvfp4_swebench",
    claim="aligned kernels keep SWE-bench-style reward stable where the baseline collapses",
    arms={"smoke": smoke, "mini": mini},
    full=FullScale(
        model="Nemotron-3.5 (Mamba hybrid)", rollout_engine="vllm", trainer="megatron", gpus=None,
        nodes=4, updates=None, env="SWE-bench Pro", precision="nvfp4", source="S1",
        assumed=("nodes",),
    ),
)
