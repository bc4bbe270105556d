"""Mismatch metrics: exact zeros for identical inputs, hand-computed values otherwise.

Value checks compare float64 results with hand derivations at absolute tolerance 1e-12 unless stated.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.metrics import (
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

F64 = torch.float64
ATOL = 1e-12


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 64), st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), st.integers(0, 10**6)
)
def test_identical_inputs_give_exact_zeros(n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(n, generator=gen) * 20).to(dtype)
    stats = logprob_diff_stats(logprobs, logprobs.clone())
    assert stats["diff_max"] == 0.0
    assert stats["diff_mean"] == 0.0
    assert stats["diff_std"] == 0.0
    assert stats["k3_kl"] == 0.0
    assert stats["tokens"] == n
    assert stats["identical"] is True


def test_one_ulp_difference_is_not_zero():
    # inverse of the test above: the smallest possible fp32 change is visible in every statistic
    rollout = torch.tensor([-1.5, -0.25, -3.0], dtype=torch.float32)
    trainer = rollout.clone()
    trainer[1] = torch.nextafter(trainer[1], torch.tensor(0.0))
    stats = logprob_diff_stats(rollout, trainer)
    assert stats["identical"] is False
    assert stats["diff_max"] > 0 and stats["diff_mean"] > 0 and stats["diff_std"] > 0 and stats["k3_kl"] > 0


def test_diff_stats_by_hand():
    # diff = trainer - rollout = [0.5, -0.5, 0, 1]: max|d| 1, mean|d| 0.5, mean 0.25,
    # population var = (0.0625 + 0.5625 + 0.0625 + 0.5625)/4 = 0.3125
    rollout = torch.tensor([-1.0, -2.0, -3.0, -4.0], dtype=F64)
    trainer = rollout + torch.tensor([0.5, -0.5, 0.0, 1.0], dtype=F64)
    stats = logprob_diff_stats(rollout, trainer)
    assert stats["diff_max"] == 1.0
    assert math.isclose(stats["diff_mean"], 0.5, abs_tol=ATOL)
    assert math.isclose(stats["diff_std"], math.sqrt(0.3125), abs_tol=ATOL)
    k3 = sum(math.exp(d) - 1 - d for d in (0.5, -0.5, 0.0, 1.0)) / 4
    assert math.isclose(stats["k3_kl"], k3, abs_tol=ATOL)


def test_k3_estimates_kl_of_rollout_from_trainer():
    # samples from rollout distribution r; k3 mean should approach KL(r || t) (tolerance 0.01 at 400k samples)
    gen = torch.Generator().manual_seed(0)
    r = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    t = torch.tensor([0.4, 0.4, 0.2], dtype=F64)
    samples = torch.multinomial(r, 400_000, replacement=True, generator=gen)
    stats = logprob_diff_stats(r.log()[samples], t.log()[samples])
    kl = float((r * (r.log() - t.log())).sum())
    assert abs(stats["k3_kl"] - kl) < 0.01


def test_mask_selects_tokens_and_ignores_padding():
    rollout = torch.tensor([[-1.0, -math.inf], [-2.0, -2.0]], dtype=F64)
    trainer = torch.tensor([[-1.0, 5.0], [-2.0, -2.0]], dtype=F64)
    mask = torch.tensor([[1, 0], [1, 1]])
    stats = logprob_diff_stats(rollout, trainer, mask)
    assert stats["tokens"] == 3 and stats["identical"] and stats["diff_max"] == 0.0


def test_diff_stats_bad_input():
    with pytest.raises(ValueError, match="shape"):
        logprob_diff_stats(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="no tokens"):
        logprob_diff_stats(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="non-finite"):
        logprob_diff_stats(torch.tensor([math.nan]), torch.tensor([0.0]))
    with pytest.raises(TypeError, match="floating-point"):
        logprob_diff_stats(torch.tensor([1]), torch.tensor([1]))


def test_is_weight_stats_by_hand():
    # log ratios ln [0.5, 1, 1, 2, 8]: median 1, peak 8 -> peak/median 8
    log_ratio = torch.log(torch.tensor([0.5, 1.0, 1.0, 2.0, 8.0], dtype=F64))
    rollout = torch.full((5,), -2.0, dtype=F64)
    stats = is_weight_stats(rollout + log_ratio, rollout)
    assert math.isclose(stats["peak_over_median"], 8.0, abs_tol=ATOL)
    assert math.isclose(stats["is_mean"], 12.5 / 5, abs_tol=ATOL)
    # even count: median is the mean of the two middle values (1 and 2)
    even_log_ratio = torch.log(torch.tensor([0.5, 1.0, 2.0, 8.0], dtype=F64))
    even = is_weight_stats(rollout[:4] + even_log_ratio, rollout[:4])
    assert math.isclose(even["is_median"], 1.5, abs_tol=ATOL)
    same = is_weight_stats(rollout, rollout.clone())
    assert same["peak_over_median"] == 1.0 and same["is_max"] == 1.0


def test_clip_fraction():
    ratio = torch.tensor([0.7, 0.9, 1.0, 1.1, 1.3, 1.25], dtype=F64)
    assert clip_fraction(ratio, 0.2) == 3 / 6
    assert clip_fraction(torch.tensor([0.75, 1.25], dtype=F64), 0.25) == 0.0  # band edges are inside
    # in the ratio's dtype: fp32(1.2) and fp32(0.8) are the fp32 band's edges (as torch.clamp has them)
    assert clip_fraction(torch.tensor([0.8, 0.79, 1.2, 1.21, 1.0]), 0.2) == 2 / 5
    assert clip_fraction(torch.tensor([0.7, 1.0, 1.3], dtype=F64), 0.2, 0.28) == 2 / 3
    assert clip_fraction(torch.tensor([0.7, 1.0, 1.3], dtype=F64), 0.2, 0.35) == 1 / 3
    with pytest.raises(ValueError, match="epsilons"):
        clip_fraction(ratio, -0.1)


def test_entropy_by_hand_and_masked_vocab():
    uniform4 = torch.full((1, 4), math.log(0.25), dtype=F64)
    assert math.isclose(entropy_from_logprobs(uniform4), math.log(4), abs_tol=ATOL)
    truncated = torch.tensor([[math.log(0.5), math.log(0.5), -math.inf]], dtype=F64)  # top-k removed token 2
    assert math.isclose(entropy_from_logprobs(truncated), math.log(2), abs_tol=ATOL)
    both = torch.cat([uniform4, torch.tensor([[0.0, -math.inf, -math.inf, -math.inf]], dtype=F64)])
    assert math.isclose(entropy_from_logprobs(both), math.log(4) / 2, abs_tol=ATOL)
    assert math.isclose(entropy_from_logprobs(both, mask=torch.tensor([0, 1])), 0.0, abs_tol=ATOL)


def test_pre_clip_grad_norm_matches_torch_and_leaves_grads():
    a = torch.nn.Parameter(torch.tensor([3.0, 0.0]))
    b = torch.nn.Parameter(torch.tensor([[4.0]]))
    c = torch.nn.Parameter(torch.tensor([1.0]))  # no grad: skipped
    (a * a / 2).sum().backward()
    (b * b / 2).sum().backward()
    before = a.grad.clone()
    assert pre_clip_grad_norm([a, b, c]) == 5.0
    assert torch.equal(a.grad, before)
    assert pre_clip_grad_norm([c]) == 0.0


def test_reward_stats():
    stats = reward_stats(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert stats["reward_mean"] == 0.75 and stats["reward_min"] == 0.0 and stats["reward_max"] == 1.0
    assert math.isclose(stats["reward_std"], math.sqrt(0.1875), abs_tol=ATOL)
    assert stats["zero_signal_group_fraction"] == 0.5 and stats["groups"] == 2
    with pytest.raises(ValueError, match="1-D"):
        reward_stats(torch.zeros(2, 2))


def test_lag_stats():
    stats = lag_stats(torch.tensor([10, 8, 8, 2]), learner_version=10)  # lags [0, 2, 2, 8]
    assert stats == {"lag_mean": 3.0, "lag_max": 8, "lag_min": 0, "lag_std": math.sqrt(9.0), "tokens": 4}
    with pytest.raises(ValueError, match="newer than learner_version"):
        lag_stats(torch.tensor([11]), learner_version=10)
    with pytest.raises(TypeError, match="integer"):
        lag_stats(torch.tensor([1.0]), learner_version=3)


def test_decompose_logprob_gap_by_hand():
    rollout = torch.tensor([-1.0, -2.0, -3.0], dtype=F64)
    at_version = torch.tensor([-1.0, -2.5, -3.0], dtype=F64)  # kernel term [0, -0.5, 0]
    now = torch.tensor([-0.75, -2.5, -3.5], dtype=F64)  # weight-lag term [0.25, 0, -0.5]
    parts = decompose_logprob_gap(now, at_version, rollout)
    assert torch.equal(parts.kernel_mismatch, torch.tensor([0.0, -0.5, 0.0], dtype=F64))
    assert torch.equal(parts.weight_lag, torch.tensor([0.25, 0.0, -0.5], dtype=F64))
    assert torch.equal(parts.total, parts.weight_lag + parts.kernel_mismatch)
    stats = parts.stats()
    assert stats["kernel_abs_mean"] == 0.5 / 3 and stats["weight_lag_abs_mean"] == 0.25
    assert math.isclose(stats["kernel_share"], (0.5 / 3) / (0.5 / 3 + 0.25), abs_tol=ATOL)


def test_decompose_aligned_kernels_have_exactly_zero_kernel_term():
    gen = torch.Generator().manual_seed(3)
    rollout = -torch.rand(50, generator=gen)
    now = rollout - 0.01 * torch.rand(50, generator=gen)
    parts = decompose_logprob_gap(now, rollout.clone(), rollout)
    assert torch.equal(parts.kernel_mismatch, torch.zeros(50, dtype=F64))
    assert parts.stats()["kernel_share"] == 0.0
    assert torch.equal(parts.weight_lag, parts.total)


def test_ragged_per_request_lists_are_concatenated():
    rollout = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0])]
    trainer = [torch.tensor([-1.0, -2.0]), torch.tensor([-2.5])]
    stats = logprob_diff_stats(rollout, trainer)
    assert stats["tokens"] == 3 and stats["diff_max"] == 0.5 and not stats["identical"]


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == 0.4
    assert math.isclose(pass_at_k(5, 2, 2), 1 - 3 / 10, abs_tol=ATOL)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 4, 2) == 1.0 and pass_at_k(3, 0, 3) == 0.0
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k(3, 4, 1)
    with pytest.raises(TypeError, match="k must be an int"):
        pass_at_k(3, 1, 1.0)


def test_support_aware_diff_stats_counts_tokens_outside_the_support():
    """A token one side excludes (-inf under top-k/top-p) is counted, not refused: the statistics
    cover the finite tokens and identical compares every token."""
    rollout = torch.tensor([-0.5, -1.0, -2.0, -0.25])
    trainer = torch.tensor([-0.5, float("-inf"), -2.5, -0.25])
    stats = support_aware_diff_stats(rollout, trainer)
    assert stats["nonfinite_tokens"] == 1 and stats["tokens"] == 3 and stats["identical"] is False
    finite_only = logprob_diff_stats(rollout[[0, 2, 3]], trainer[[0, 2, 3]])
    assert stats["diff_max"] == 0.5 and stats == {**finite_only, "identical": False, "nonfinite_tokens": 1}
    same = support_aware_diff_stats(trainer, trainer.clone())  # two -inf are equal
    assert same["identical"] and same["nonfinite_tokens"] == 1 and same["diff_max"] == 0.0
    nothing = support_aware_diff_stats(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    assert nothing == {"diff_max": 0.0, "diff_mean": 0.0, "diff_std": 0.0, "k3_kl": 0.0, "tokens": 0,
                       "identical": False, "nonfinite_tokens": 1}  # fmt: skip
    exact = support_aware_diff_stats(rollout, rollout.clone())
    assert exact == {**logprob_diff_stats(rollout, rollout), "nonfinite_tokens": 0}


def test_support_aware_diff_stats_validates_as_logprob_diff_stats_does():
    with pytest.raises(ValueError, match="no tokens to compare"):
        support_aware_diff_stats(torch.tensor([]), torch.tensor([]))
    with pytest.raises(ValueError, match="shape"):
        support_aware_diff_stats(torch.tensor([float("nan")]), torch.tensor([float("nan")] * 2))
    with pytest.raises(TypeError, match="floating-point"):
        support_aware_diff_stats(torch.tensor([1, 2]), torch.tensor([1, 2]))
    per_request = [torch.tensor([-0.5, float("-inf")]), torch.tensor([-1.0])]
    stats = support_aware_diff_stats(per_request, [t.clone() for t in per_request])
    assert stats["identical"] and stats["tokens"] == 2 and stats["nonfinite_tokens"] == 1
