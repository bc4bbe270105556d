"""zeromismatch.metrics: train–inference mismatch, importance weights, lag, rewards (docs/metrics.md)."""

from zeromismatch.metrics.mismatch import (
    LogprobGapDecomposition,
    clip_fraction,
    decompose_logprob_gap,
    entropy_from_logprobs,
    is_weight_stats,
    lag_stats,
    logprob_diff_stats,
    pass_at_k,
    pre_clip_grad_norm,
    reward_stats,
    support_aware_diff_stats,
)

__all__ = [
    "LogprobGapDecomposition",
    "clip_fraction",
    "decompose_logprob_gap",
    "entropy_from_logprobs",
    "is_weight_stats",
    "lag_stats",
    "logprob_diff_stats",
    "pass_at_k",
    "pre_clip_grad_norm",
    "reward_stats",
    "support_aware_diff_stats",
]
