"""S1: Nemotron-3.5 (Mamba hybrid, NVFP4) on SWE-bench Pro — the consistent run's 5-step
rolling reward stays ~0.6 while the baseline falls from 0.56 to 0.23 (0.22 in the write-up).

Mini stand-in: tiny-nemotron-h (Mamba2 + attention + MLP layers) on the code-repair env
(reward = fraction of unit tests passing). The aligned arm runs NVFP4 weights on both sides (the
learner fake-quantizes fp32 master weights: ``rl/stacks.py`` ``aligned-nvfp4``), as the published
consistent run did; ``fast`` is the NVFP4 high-performance baseline (``fast-nvfp4``: bf16 stock-kernel
rollout, NVFP4 weights, FP8 KV cache, bf16 head, against the fp32-master learner); ``default`` runs the
stock kernels on both sides in fp32.
"""

from __future__ import annotations

from zeromismatch.expt import Arm, Experiment, FullScale
from zeromismatch.rl import RLConfig
from zeromismatch.rl.stacks import stack_fields


# max_new_tokens 32: the longest correct patch ("<fix>3|for i in range(1, n + 1):</fix>") is 29 tokens;
# a shorter budget makes every range-line bug unfixable. Warm start and RL sizes: /work/notes/learnability.md.
def _base(**changes) -> RLConfig:
    return RLConfig(
        env="code_repair", model="tiny-nemotron-h", algo="reinforce_zero", steps=30,
        prompts_per_step=8, group_size=4, max_new_tokens=32, sft_steps=100, sft_batch=8, lr=1e-3,
        eval_size=32, eval_samples=2, seed=0,
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("aligned", _base(**stack_fields("aligned-nvfp4")), "aligned kernels, NVFP4 weights, both sides"),
        Arm("default", _base(kernels="default"), "stock kernels on both sides in fp32 (re-association only)"),
        Arm("fast", _base(**stack_fields("fast-nvfp4")),
            "the NVFP4 high-performance baseline: bf16 stock-kernel rollout, NVFP4 weights, FP8 KV cache, "
            "bf16 head, against the fp32-master aligned learner"),
    ]  # fmt: skip


def smoke() -> list[Arm]:
    tiny = dict(steps=1, sft_steps=1, eval_size=2, eval_samples=1)
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
        env="SWE-bench Pro",
        precision="nvfp4",
        source="S1",
        assumed=("nodes",),
    ),
)
