"""S3: REINFORCE Zero — aligned kernels + unclipped token-level IS keep async RL stable at
policy lag 64; with standard kernels the IS weights' peak/median explodes (1.50x vs 442.54x),
KL grows 83.33x, AIME pass@1 falls 34.27% -> 13.96%, and pre-clip grad norm peaks at 38.27
(vs 0.0555 aligned).

Mini stand-in: tiny-qwen3 on the arithmetic env (two-digit addition, answered least-significant
digit first), 100 RL steps after an SFT warm start, at lag 0, 8 and 64 on the aligned stack and at
lag 0 and 64 on default kernels ("aligned" and "default" are the lag-64 arms the published comparison
is about), plus the tool-use env at lag 64. Several seeds of the same set-ups: the learnability suite
(``scripts/learnability.py``).
"""

from __future__ import annotations

from zeromismatch.expt import Arm, Experiment, FullScale
from zeromismatch.rl import RLConfig
from zeromismatch.rl.stacks import stack_fields


# Learnability (docs/learnability.md): held-out single-digit facts cannot be inferred from training facts,
# so RL could not raise their pass@1 (it fell in 3 of 4 seeds). Two-digit addition written units-first is a
# rule the 2-layer model learns, so held-out problems share what RL reinforces. RL lr 1e-4: at 1e-3 the
# policy collapsed. Both were chosen on the old prompt-keyed split, where commuted twins in training made
# seed 0's held-out score after SFT 1000 read 0.53; on the leak-free split it is 0.20 (0.45 after SFT 2000,
# 0.84 after 3000). The config was kept as chosen, not re-tuned on the rerun's results.
# Held-out pass@1 over 128 eval prompts, greedy and sampled (4 per prompt).
def _base(**changes) -> RLConfig:
    return RLConfig(
        env="arithmetic", model="tiny-qwen3", algo="reinforce_zero", steps=100, prompts_per_step=8,
        group_size=8, max_new_tokens=4, sft_steps=1000, sft_lr=1e-3, lr=1e-4, eval_size=128, eval_samples=4,
        seed=0, env_options={"max_digits": 2, "ops": "+", "answer_order": "lsd"},
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("aligned_lag0", _base(kernels="aligned", lag=0), "synchronous, aligned"),
        Arm("default_lag0", _base(kernels="default", lag=0), "synchronous, standard kernels"),
        Arm("aligned_lag8", _base(kernels="aligned", lag=8), "async lag 8, aligned"),
        Arm("aligned", _base(kernels="aligned", lag=64), "async lag 64, aligned"),
        Arm("default", _base(kernels="default", lag=64), "async lag 64, standard kernels"),
        # S3 names FP8 (and MXFP4) as its fast paths' numerics and no format for this run: per-channel FP8
        Arm("fast", _base(**stack_fields("fast-fp8"), lag=64),
            "async lag 64, the high-performance rollout (bf16 stock kernels, FP8 weights, FP8 KV cache, "
            "bf16 head), fp32-master learner"),
        # tools at lag 64: lr 1e-3 made held-out pass@1 fall (0.20 -> 0.14), lr 3e-4 raised it (0.27 -> 0.42)
        Arm(
            "tools_aligned",
            _base(
                env="tools",
                kernels="aligned",
                lag=64,
                steps=80,
                prompts_per_step=8,
                group_size=4,
                lr=3e-4,
                max_new_tokens=24,
                sft_steps=300,
                sft_lr=3e-3,
                eval_size=64,
                eval_samples=2,
                env_options={},
            ),
            "multi-turn calculator tool use at lag 64, aligned (the Qwen3-4B + Python tools stand-in)",
        ),
    ]


def smoke() -> list[Arm]:
    tiny = dict(steps=2, sft_steps=1, eval_size=2, eval_samples=1)
    return [Arm(a.name, a.config.replace(**tiny), a.note) for a in mini()]


# The arithmetic arms stand in for S3's math-reasoning runs (a 1.5B reasoning model stable over 20,000
# updates with aligned kernels; the standard-kernel comparison's online AIME24 pass@1), not for the
# Qwen3-4B tool-use run the tools arm stands in for. S3 names neither that model nor its hardware or
# trainer: the checkpoint below is our choice for the dry-run scripts, and so marked.
_MATH_ARMS = ("aligned_lag0", "default_lag0", "aligned_lag8", "aligned", "default")
_MATH_REASONING = FullScale(
    model="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
    rollout_engine="vllm",
    trainer="megatron",
    gpus=None,
    nodes=1,
    updates=20000,
    env="math reasoning (online AIME24 pass@1)",
    source="S3",
    assumed=("model", "nodes", "trainer"),
)

EXPERIMENT = Experiment(
    name="reinforce_zero_lag64",
    claim="aligned kernels + unclipped IS keep async RL stable at lag 64",
    arms={"smoke": smoke, "mini": mini},
    full=FullScale(
        model="Qwen/Qwen3-4B",
        rollout_engine="vllm",
        trainer="megatron",
        gpus=16,
        nodes=2,
        updates=5000,
        env="Python tool use",
        lag=64,
        context_tokens=16384,
        source="S3",
        # S3 ties 16 GPUs to its 12,000-update throughput run only, not to the Qwen3-4B run
        assumed=("gpus", "nodes"),
        extra={"throughput_run": {"gpus": 16, "updates": 12000, "hours_async": 68.55, "hours_sync": 164.77}},
    ),
    full_by_arm=dict.fromkeys(_MATH_ARMS, _MATH_REASONING),
)
