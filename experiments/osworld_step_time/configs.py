"""S3: the cost of alignment on OSWorld — mean step time 944.25 s with aligned kernels vs
884.17 s with importance sampling + standard kernels + a sequence bound.

Mini stand-in: the desktop env (a state machine of screens with injected per-step latency),
aligned REINFORCE Zero vs default kernels with truncated IS (TIS, token-level cap: our
closest stand-in for "IS + sequence bound"). Every arm starts from one shared warm start
(``warm_start="shared"``) on the same task seeds, so the arms differ only in their numerics; the claim
compares mean wall time per RL step per model-written token (two policies write different numbers of
tokens per step, so per-step times alone would compare different work); the per-step times are logged
beside it. ``fast`` is the high-performance numerics' stand-in, not a speed reference: FP8 on this CPU
is emulated (quantize -> dequantize), so it is slower here than it is on a GPU.
"""

from __future__ import annotations

from zeromismatch.experiment import Arm, Experiment, FullScale
from zeromismatch.rl import RLConfig
from zeromismatch.rl.stacks import stack_fields


def _base(**changes) -> RLConfig:
    return RLConfig(
        env="desktop", model="tiny-qwen3", steps=40, prompts_per_step=4, group_size=2,
        max_new_tokens=24, sft_steps=200, lr=3e-4, eval_size=8, eval_samples=2, seed=0, step_latency_s=0.005,
        warm_start="shared", sft_seed=0,
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("aligned", _base(kernels="aligned", algo="reinforce_zero"), "aligned kernels, unclipped IS"),
        Arm("default", _base(kernels="default", algo="tis"), "standard kernels + truncated IS"),
        # S3 names FP8 (and MXFP4) as its fast paths' numerics and no format for this run: per-channel FP8
        Arm("fast", _base(**stack_fields("fast-fp8"), algo="tis"),
            "the high-performance rollout (bf16 stock kernels, FP8 weights, FP8 KV cache, bf16 head) + "
            "truncated IS"),
    ]  # fmt: skip


def smoke() -> list[Arm]:
    tiny = dict(steps=1, sft_steps=1, eval_size=2, eval_samples=1)
    return [Arm(a.name, a.config.replace(**tiny), a.note) for a in mini()]


EXPERIMENT = Experiment(
    name="osworld_step_time",
    claim="aligned kernels cost some step time (944.25 s vs 884.17 s per OSWorld step)",
    arms={"smoke": smoke, "mini": mini},
    full=FullScale(
        model="not named in the source",
        rollout_engine="vllm",
        trainer="megatron",
        gpus=None,
        nodes=2,
        updates=None,
        env="osworld",
        source="S3",
        assumed=("nodes", "model"),
    ),
)
