"""S2: PipelineRL's vLLM V0 -> V1 migration — correctness before corrections. The first V1
run left the V0 reference (raw logprobs, prefix cache across weight updates, bf16-vs-fp32 head);
after the four fixes V1 returns close to V0 in clip rate, KL, entropy and reward.

Mini stand-in: GSPO on tiny-qwen3 / arithmetic with temperature 0.8 and top-p 0.9 (so raw and
processed logprobs differ), async lag 1. "v0" = aligned stack with processed
logprobs; "v1_first" = default kernels, raw logprobs, unversioned prefix cache, activation-dtype
head; "v1_fixed" = default kernels with the four fixes applied (processed logprobs, versioned
prefix cache, fp32 head, keep-mode weight updates). Two pairs of arms then isolate single fixes
on the aligned stack: prefix cache versioned vs not (code-repair prompts share long prefixes across
tasks, so a cache that ignores weight versions serves stale K/V), and a bf16 vs fp32 rollout head
with bf16 activations.

What "v1_first" actually changes here: only the logprob semantics. Its unversioned cache never hits
(arithmetic prompts are shorter than one 16-token block: ``prefix_cache_hits`` 0) and its
activation-dtype head is fp32 (the model is fp32), so fixes 2 and 4 show only in their own arm pairs.
Fix 3 (the in-flight weight-update path) is exercised by no arm: the mini loop swaps weights between
batches, with no request in flight, so keep / wait / abort cannot differ (engine tests cover them).
"""

from __future__ import annotations

from pathlib import Path

from zeromismatch.expt import Arm, Experiment, FullScale
from zeromismatch.expt.spec import add_to_summary, read_records, tail_mean
from zeromismatch.rl import RLConfig
from zeromismatch.rl.stacks import stack_fields


def _base(**changes) -> RLConfig:
    return RLConfig(
        env="arithmetic", model="tiny-qwen3", algo="gspo", steps=40, prompts_per_step=4, group_size=4,
        max_new_tokens=4, sft_steps=800, lr=3e-4, eval_size=32, seed=0, lag=1, temperature=0.8, top_p=0.9,
        env_options={"max_digits": 1},
    ).replace(**changes)  # fmt: skip


def mini() -> list[Arm]:
    return [
        Arm("v0", _base(kernels="aligned"), "reference: aligned, processed logprobs"),
        Arm(
            "v1_first",
            _base(
                kernels="default",
                logprobs_mode="raw",
                prefix_cache_versioned=False,
                rollout_lm_head="activation",
            ),  # fmt: skip
            "first V1 attempt: raw logprobs, unversioned prefix cache, activation-dtype head (in this "
            "fp32, short-prompt workload only the raw logprobs take effect)",
        ),
        Arm("v1_fixed", _base(kernels="default"), "V1 after the four fixes (kernels still unaligned)"),
        Arm("fast", _base(**stack_fields("fast-bf16")),
            "a bf16 V1-style rollout on stock kernels with a bf16 head (fix 4 undone), processed logprobs "
            "and a versioned prefix cache, against the fp32 learner"),
        # one fix at a time, on the aligned stack, so nothing else can explain the difference:
        Arm("prefix_cache_versioned", _prefix(True), "code-repair prompts share prefixes; versioned cache"),
        Arm("prefix_cache_unversioned", _prefix(False), "the same with a cache that ignores weight versions"),
        Arm("lm_head_fp32", _head("fp32"), "bf16 activations, fp32 head on both sides"),
        Arm("lm_head_bf16", _head("activation"), "bf16 activations, bf16 rollout head vs fp32 trainer head"),
    ]


def _prefix(versioned: bool) -> RLConfig:
    # Stale K/V only differs from fresh K/V if the weights change between versions, so the policy
    # needs a learning signal: after 5 warm-start steps every code-repair reward was 0, every group
    # flat, and the weights moved only through the warm start's Adam moments (a learner bug, fixed
    # in session 7). 100 warm-start steps give nonzero rewards, as in the learnability suite.
    return _base(
        env="code_repair", kernels="aligned", steps=10, max_new_tokens=32, sft_steps=100, env_options={},
        prefix_cache_versioned=versioned, eval_size=4,
    )  # fmt: skip


def _head(precision: str) -> RLConfig:
    return _base(kernels="aligned", dtype="bfloat16", rollout_lm_head=precision, steps=10, eval_size=4)


def smoke() -> list[Arm]:
    tiny = dict(steps=2, sft_steps=1, eval_size=2, eval_samples=1)
    return [Arm(a.name, a.config.replace(**tiny), a.note) for a in mini()]


EXPERIMENT = Experiment(
    name="pipelinerl_v0_v1",
    claim="backend correctness first: V1 returns to V0 after the four fixes",
    arms={"smoke": smoke, "mini": mini},
    postprocess=lambda scale_dir: gaps_to_v0(scale_dir),
    full=FullScale(
        model="not named in the excerpt",
        rollout_engine="vllm 0.8.5 (V0) / 0.18.1 (V1)",
        trainer="pipelinerl",
        gpus=None,
        nodes=2,
        updates=None,
        env="math reasoning",
        source="S2",
        assumed=("nodes", "model", "env"),
    ),
)


def gaps_to_v0(scale_dir: Path) -> None:
    """Each V1 arm's distance from the V0 reference over the last 20% of steps (S2 Figure 1's
    quantities: reward, clip rate, KL, entropy), written into that arm's summary.json."""
    if not (scale_dir / "v0" / "summary.json").exists():
        return
    reference = read_records(scale_dir / "v0")
    metrics = {"reward": "reward_mean", "clip_rate": "loss_clip_rate", "k3_kl": "k3_kl", "entropy": "entropy"}
    for arm in ("v1_first", "v1_fixed"):
        if not (scale_dir / arm / "summary.json").exists():
            continue
        records = read_records(scale_dir / arm)
        gaps = {
            f"{name}_gap_to_v0": abs(tail_mean(records, key) - tail_mean(reference, key))
            for name, key in metrics.items()
        }
        add_to_summary(scale_dir / arm, gaps, inputs=(scale_dir / "v0",))
