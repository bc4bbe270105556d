"""S1: DeepSeek-V4-Flash — diff zero at every one of >100 RL steps with aligned kernels,
while the high-performance baseline's train-inference KL grows (2e-3 -> 29.9).

Mini stand-in: tiny-deepseek-v3 (MLA attention, shared + routed experts, first-k dense
layers) trained from scratch on the arithmetic env for 101 steps, once on the aligned
stack and once on the default (fast, unaligned) kernels on both sides; a third arm runs the
aligned-native set (attention, scan, GEMMs, norms, rope, the SwiGLU product and MoE experts in
fixed-order C), which must keep the zero diff too.
"""

from __future__ import annotations

from pathlib import Path

from zeromismatch.expt import Arm, Experiment, FullScale
from zeromismatch.expt.spec import add_to_summary
from zeromismatch.rl import RLConfig


def _base(**changes) -> RLConfig:
    return RLConfig(
        env="arithmetic", model="tiny-deepseek-v3", algo="reinforce_zero", steps=101,
        prompts_per_step=4, group_size=4, max_new_tokens=4, sft_steps=800, lr=3e-4, eval_size=32, seed=0,
        env_options={"max_digits": 1},
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("aligned", _base(kernels="aligned"), "aligned kernels on engine and trainer"),
        Arm("default", _base(kernels="default"), "stock fast kernels on both sides (the baseline)"),
        Arm(
            "aligned_native",
            _base(kernels="aligned-native"),
            "the aligned set with attention, scan, GEMMs, norms, rope, the SwiGLU product and MoE experts in "
            "fixed-order C (kernels/native) on both sides",
        ),
    ]


def smoke() -> list[Arm]:
    tiny = dict(steps=2, sft_steps=1, eval_size=2, eval_samples=1)
    return [Arm(a.name, a.config.replace(**tiny), a.note) for a in mini()]


# S1's three invariances, each an engine-vs-trainer parity run that isolates one change:
# batch = many sequences sharing steps (whole prompts); phase = one sequence at a time through
# chunked prefill and decode; layout = trainer at TP 2 against the engine at TP 1.
INVARIANCE_RUNS = {
    "batch_invariance_diff_max": dict(max_num_seqs=8, prefill_chunk=None, max_num_batched_tokens=256),
    "phase_invariance_diff_max": dict(max_num_seqs=1, prefill_chunk=4),
    "layout_invariance_diff_max": dict(max_num_seqs=1, prefill_chunk=None, trainer_tp=2),
}


def invariances(scale_dir: Path) -> None:
    """Add the three invariance measurements (max |rollout − trainer| logprob) to each arm."""
    from zeromismatch.commands.parity import run_parity

    kernel_sets = {"aligned": "aligned", "default": "default", "aligned_native": "aligned-native"}
    for arm, kernels in kernel_sets.items():
        if not (scale_dir / arm / "summary.json").exists():
            continue
        values = {
            key: run_parity("tiny-deepseek-v3", kernels=kernels, seed=0, num_prompts=6, max_tokens=8,
                            temperature=1.0, **options)["diff_max"]
            for key, options in INVARIANCE_RUNS.items()
        }  # fmt: skip
        add_to_summary(scale_dir / arm, values)


EXPERIMENT = Experiment(
    name="deepseek_v4_flash_100steps",
    claim="aligned kernels keep the rollout-trainer logprob diff exactly zero for >100 RL steps",
    arms={"smoke": smoke, "mini": mini},
    postprocess=invariances,
    full=FullScale(
        model="DeepSeek-V4-Flash-Base",
        rollout_engine="vllm",
        trainer="megatron",
        gpus=None,
        nodes=4,
        updates=101,
        env="math reasoning RL (dataset not named in the source)",
        precision="fp8",
        source="S1",
        # S1 says "more than 100" updates and names no weight format for DeepSeek-V4-Flash (FP8/MXFP4
        # appear in S3, for DeepSeek-V4.1-Flash)
        assumed=("nodes", "env", "updates", "precision"),
    ),
)
