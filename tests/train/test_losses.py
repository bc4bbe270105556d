"""Loss values and gradients against hand derivations (float64, tolerance 1e-12 absolute).

Shared fixture: B = 4 responses, L = 3, lengths [2, 1, 3, 2], groups [7, 7, 3, 3],
rewards [1, 0, 0.25, 0.75]. Learner logprobs l and per-token ratios rho = exp(l - l_rollout):
  row 0: l = [-0.5, -1.0]        rho = [2, 1]
  row 1: l = [-2.0]              rho = [0.5]
  row 2: l = [-1.0, -1.0, -1.0]  rho = [1, 2, 4]
  row 3: l = [-0.25, -4.0]       rho = [1, 1]
Group-mean advantages: [0.5, -0.5, -0.25, 0.25]. Population-std-normalised (std 0.5 and 0.25):
[1, -1, -1, 1]. Padding holds garbage (learner 123, rollout -inf) to prove masking.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.train.losses import (
    LOSSES,
    PolicyBatch,
    compute_loss,
    group_mean_advantages,
    group_normalized_advantages,
    grpo,
    gspo,
    ppo_clip,
    reinforce,
    reinforce_zero,
    tis,
)

ATOL = 1e-12
F64 = torch.float64
LN2 = math.log(2.0)


def make_batch(advantages=None, old_logprobs=None) -> PolicyBatch:
    learner = torch.tensor(
        [[-0.5, -1.0, 123.0], [-2.0, 123.0, 123.0], [-1.0, -1.0, -1.0], [-0.25, -4.0, 123.0]], dtype=F64
    )
    log_rho = torch.tensor(
        [[LN2, 0.0, 0.0], [-LN2, 0.0, 0.0], [0.0, LN2, 2 * LN2], [0.0, 0.0, 0.0]], dtype=F64
    )
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rollout = torch.where(mask, learner - log_rho, torch.full_like(learner, -math.inf))
    return PolicyBatch(
        learner_logprobs=learner.clone().requires_grad_(True),
        rollout_logprobs=rollout,
        mask=mask,
        rewards=torch.tensor([1.0, 0.0, 0.25, 0.75], dtype=F64),
        group_ids=torch.tensor([7, 7, 3, 3]),
        advantages=advantages,
        old_logprobs=old_logprobs,
    )


def grad_of(output, batch) -> torch.Tensor:
    output.loss.backward()
    return batch.learner_logprobs.grad


def assert_close(actual, expected):
    expected = torch.as_tensor(expected, dtype=F64)
    assert torch.allclose(torch.as_tensor(actual, dtype=F64), expected, rtol=0, atol=ATOL), (actual, expected)


def test_advantages_by_hand():
    batch = make_batch()
    assert_close(group_mean_advantages(batch.rewards, batch.group_ids), [0.5, -0.5, -0.25, 0.25])
    assert_close(group_normalized_advantages(batch.rewards, batch.group_ids, eps=0.0), [1.0, -1.0, -1.0, 1.0])
    flat = group_normalized_advantages(torch.tensor([1.0, 1.0, 0.0], dtype=F64), torch.tensor([0, 0, 1]))
    assert torch.equal(flat, torch.zeros(3, dtype=F64))  # flat groups and singletons carry no signal


def test_reinforce_zero_value_and_gradient():
    # per-response sum rho*A*l / |y|: -0.5, 0.5, 7/12, -17/32 -> total 5/96, loss = -(1/4)(5/96)
    batch = make_batch()
    out = reinforce_zero(batch)
    assert_close(out.loss, -5.0 / 384.0)
    # d loss / d l = -(1/B)(1/|y_i|) rho A
    expected_grad = [
        [-1 / 8, -1 / 16, 0.0],
        [1 / 16, 0.0, 0.0],
        [1 / 48, 2 / 48, 4 / 48],
        [-1 / 32, -1 / 32, 0.0],
    ]
    assert_close(grad_of(out, batch), expected_grad)
    assert out.stats["clip_rate"] == 0.0
    assert math.isclose(out.stats["ratio_max"], 4.0, abs_tol=ATOL)  # unclipped: rho = 4 survives
    # median of the rho values [.5, 1, 1, 1, 1, 2, 2, 4] is 1
    assert math.isclose(out.stats["is_peak_over_median"], 4.0, abs_tol=ATOL)


def test_reinforce_ignores_the_ratio_it_reports():
    # weights 1: per-response sum A*l / |y|: -0.375, 1.0, 0.25, -0.53125 -> total 0.34375
    batch = make_batch()
    out = reinforce(batch)
    assert_close(out.loss, -0.34375 / 4.0)
    expected_grad = [
        [-1 / 16, -1 / 16, 0.0], [1 / 8, 0.0, 0.0], [1 / 48, 1 / 48, 1 / 48], [-1 / 32, -1 / 32, 0.0],
    ]  # fmt: skip
    assert_close(grad_of(out, batch), expected_grad)
    assert math.isclose(out.stats["is_peak_over_median"], 4.0, abs_tol=ATOL)  # measured, not applied
    # inverse: with the same rollout logprobs REINFORCE Zero's gradient differs (it applies rho)
    other = make_batch()
    assert not torch.equal(grad_of(reinforce_zero(other), other), torch.tensor(expected_grad, dtype=F64))


def test_reinforce_equals_reinforce_zero_on_policy():
    # rho = 1 everywhere (rollout logprobs = the learner's): no correction and unclipped IS coincide
    def on_policy():
        batch = make_batch()
        batch.rollout_logprobs = torch.where(batch.mask, batch.learner_logprobs.detach(), -math.inf)
        return batch

    first, second = on_policy(), on_policy()
    assert torch.equal(grad_of(reinforce(first), first), grad_of(reinforce_zero(second), second))


def test_tis_value_and_gradient():
    # cap 1.5: weights row0 [1.5, 1], row2 [1, 1.5, 1.5]; per-response: -7/16, 1/2, 1/3, -17/32
    batch = make_batch()
    out = tis(batch, cap=1.5)
    assert_close(out.loss, 13.0 / 384.0)
    expected_grad = [
        [-3 / 32, -1 / 16, 0.0],
        [1 / 16, 0.0, 0.0],
        [1 / 48, 1.5 / 48, 1.5 / 48],
        [-1 / 32, -1 / 32, 0.0],
    ]
    assert_close(grad_of(out, batch), expected_grad)
    assert out.stats["clip_rate"] == 3 / 8  # token counts: exact; rho = 2, 2, 4 exceed the cap


def test_grpo_value_and_gradient():
    # A = [1, -1, -1, 1], eps 0.2. Objectives min(rA, clip(r)A):
    # row0 [1.2 (clipped), 1]; row1 [-0.8 (clipped)]; row2 [-1, -2, -4]; row3 [1, 1]
    # per-response means 1.1, -0.8, -7/3, 1 -> loss = -(1/4)(1.1 - 0.8 - 7/3 + 1) = 3.1/12
    batch = make_batch()
    out = grpo(batch, clip_eps=0.2, std_eps=0.0)
    assert_close(out.loss, 3.1 / 12.0)
    expected_grad = [
        [0.0, -1 / 8, 0.0],
        [0.0, 0.0, 0.0],
        [1 / 12, 2 / 12, 4 / 12],
        [-1 / 8, -1 / 8, 0.0],
    ]
    assert_close(grad_of(out, batch), expected_grad)
    assert out.stats["clip_rate"] == 2 / 8  # a ratio of token counts: exact


def test_gspo_value_and_gradient():
    # sequence ratios: sqrt(2), 0.5, 2, 1 with A = [1, -1, -1, 1], eps 0.2:
    # objectives 1.2 (clipped), -0.8 (clipped), -2, 1 -> loss = -(1/4)(-0.6) = 0.15
    # d s_i / d l_t = s_i / |y_i|: row2 grad -(1/4)(-1)(2/3) = 1/6, row3 -(1/4)(1)(1/2) = -1/8
    batch = make_batch()
    out = gspo(batch, clip_eps=0.2, clip_eps_high=0.2, std_eps=0.0)
    assert_close(out.loss, 0.15)
    expected_grad = [
        [0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [1 / 6, 1 / 6, 1 / 6],
        [-1 / 8, -1 / 8, 0.0],
    ]
    assert_close(grad_of(out, batch), expected_grad)
    assert out.stats["clip_rate"] == 0.5  # a ratio of token counts: exact
    assert math.isclose(out.stats["ratio_max"], 2.0, abs_tol=ATOL)


def test_ppo_clip_value_and_gradient():
    # token advantages; objectives: row0 [1.2 (clipped), -1]; row1 [1.0]; row2 [-1, 0.6 (clipped),
    # 1.2 (clipped)]; row3 [1, -2]; sum 1.0 over 8 tokens -> loss -1/8; grad = -(1/8) dobj/dl
    advantages = torch.tensor(
        [[1.0, -1.0, 9.0], [2.0, 9.0, 9.0], [-1.0, 0.5, 1.0], [1.0, -2.0, 9.0]], dtype=F64
    )
    batch = make_batch(advantages=advantages)
    out = ppo_clip(batch, clip_eps=0.2)
    assert_close(out.loss, -1.0 / 8.0)
    expected_grad = [
        [0.0, 1 / 8, 0.0],
        [-1 / 8, 0.0, 0.0],
        [1 / 8, 0.0, 0.0],
        [-1 / 8, 2 / 8, 0.0],
    ]
    assert_close(grad_of(out, batch), expected_grad)
    assert out.stats["clip_rate"] == 3 / 8  # a ratio of token counts: exact


def test_old_logprobs_replace_rollout_for_ratio_losses():
    # with old = learner (first epoch of PPO), every ratio is 1 and nothing clips; GRPO's gradient is
    # then -(1/B)(1/|y|) A, independent of the rollout logprobs.
    learner = make_batch().learner_logprobs.detach()
    batch = make_batch(old_logprobs=learner.clone())
    out = grpo(batch, std_eps=0.0)
    assert out.stats["clip_rate"] == 0.0
    expected = [[-1 / 8, -1 / 8, 0.0], [1 / 4, 0.0, 0.0], [1 / 12, 1 / 12, 1 / 12], [-1 / 8, -1 / 8, 0.0]]
    assert_close(grad_of(out, batch), expected)


def test_reinforce_zero_gradient_is_importance_sampled_policy_gradient():
    # sg(rho) * grad(l) == grad(rho) because d exp(l - l_r)/dl = rho: compare with the un-stopped ratio.
    batch = make_batch()
    grad = grad_of(reinforce_zero(batch), batch)
    learner = batch.learner_logprobs.detach().clone().requires_grad_(True)
    rho = torch.exp(torch.where(batch.mask, learner - batch.rollout_logprobs, torch.zeros((), dtype=F64)))
    adv = group_mean_advantages(batch.rewards, batch.group_ids)
    per_response = torch.where(batch.mask, rho * adv[:, None], torch.zeros((), dtype=F64)).sum(-1)
    (-(per_response / batch.lengths).mean()).backward()
    assert_close(grad, learner.grad)


def test_rollout_logprobs_receive_no_gradient():
    batch = make_batch()
    rollout = batch.rollout_logprobs.clone().requires_grad_(True)
    batch.rollout_logprobs = rollout
    for name in ("reinforce_zero", "tis", "grpo", "gspo"):
        compute_loss(name, batch).loss.backward()
    assert rollout.grad is None


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
)
def test_reinforce_zero_matches_python_loop(batch_size, length, seed):
    gen = torch.Generator().manual_seed(seed)
    learner = -torch.rand(batch_size, length, generator=gen, dtype=F64) * 3
    rollout = learner + (torch.rand(batch_size, length, generator=gen, dtype=F64) - 0.5)
    lengths = torch.randint(1, length + 1, (batch_size,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    rewards = torch.rand(batch_size, generator=gen, dtype=F64)
    groups = torch.randint(0, 2, (batch_size,), generator=gen)
    batch = PolicyBatch(learner.clone().requires_grad_(True), rollout, mask, rewards, groups)
    out = reinforce_zero(batch)
    out.loss.backward()
    expected_loss, expected_grad = 0.0, torch.zeros(batch_size, length, dtype=F64)
    for i in range(batch_size):
        members = [j for j in range(batch_size) if int(groups[j]) == int(groups[i])]
        advantage = float(rewards[i]) - sum(float(rewards[j]) for j in members) / len(members)
        n = int(lengths[i])
        for t in range(n):
            rho = math.exp(float(learner[i, t]) - float(rollout[i, t]))
            expected_loss -= rho * advantage * float(learner[i, t]) / n / batch_size
            expected_grad[i, t] = -rho * advantage / n / batch_size
    assert math.isclose(float(out.loss.detach()), expected_loss, rel_tol=0, abs_tol=1e-12)
    assert_close(batch.learner_logprobs.grad, expected_grad)


def test_zero_advantage_gives_zero_gradient():
    batch = make_batch()
    batch.rewards = torch.ones(4, dtype=F64)
    grad = grad_of(reinforce_zero(batch), batch)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_all_losses_registered_and_finite_on_float32():
    batch = make_batch(advantages=torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=F64))
    batch32 = PolicyBatch(
        learner_logprobs=batch.learner_logprobs.detach().float().requires_grad_(True),
        rollout_logprobs=batch.rollout_logprobs.float(),
        mask=batch.mask,
        rewards=batch.rewards.float(),
        group_ids=batch.group_ids,
        advantages=batch.advantages.float(),
    )
    assert set(LOSSES) == {"reinforce_zero", "reinforce", "grpo", "gspo", "ppo_clip", "tis"}
    for name in LOSSES:
        out = compute_loss(name, batch32)
        out.loss.backward()
        assert out.loss.dtype == torch.float32
        assert torch.isfinite(batch32.learner_logprobs.grad).all(), name
        assert all(math.isfinite(v) for v in out.stats.values()), name
        batch32.learner_logprobs.grad = None


def test_bad_inputs_raise_clear_errors():
    good = make_batch()
    with pytest.raises(ValueError, match="responses \\[1\\] have no tokens"):
        PolicyBatch(
            good.learner_logprobs,
            good.rollout_logprobs,
            torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1], [1, 1, 0]]),
            good.rewards,
            good.group_ids,
        )
    with pytest.raises(ValueError, match="rollout_logprobs has shape"):
        PolicyBatch(
            good.learner_logprobs, good.rollout_logprobs[:, :2], good.mask, good.rewards, good.group_ids
        )
    with pytest.raises(ValueError, match="rewards must be a tensor of shape"):
        PolicyBatch(good.learner_logprobs, good.rollout_logprobs, good.mask, good.rewards[:3], good.group_ids)
    with pytest.raises(ValueError, match="non-finite"):
        bad = good.rollout_logprobs.clone()
        bad[0, 0] = math.nan
        PolicyBatch(good.learner_logprobs, bad, good.mask, good.rewards, good.group_ids)
    with pytest.raises(TypeError, match="group_ids must be an integer"):
        PolicyBatch(good.learner_logprobs, good.rollout_logprobs, good.mask, good.rewards, good.rewards)
    with pytest.raises(ValueError, match="ppo_clip needs"):
        ppo_clip(good)
    with pytest.raises(ValueError, match="unknown loss"):
        compute_loss("dpo", good)
    with pytest.raises(ValueError, match="aggregation"):
        reinforce_zero(good, aggregation="sum")
    with pytest.raises(ValueError, match="cap"):
        tis(good, cap=0.0)


@pytest.mark.parametrize("name", ["reinforce_zero", "tis", "grpo", "gspo"])
def test_each_loss_learns_a_bandit_with_stale_rollouts(name):
    # 4-armed bandit, reward 1 for arm 2; rollouts come from the policy one update old (lag 1), so the
    # importance weights are not 1. Every loss must raise p(arm 2) from 0.25 to above 0.9 in 150 updates.
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(4, dtype=F64, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=2.0)
    stale = logits.detach().clone()
    for _ in range(150):
        rollout_logprobs_all = torch.log_softmax(stale, -1)
        arms = torch.multinomial(rollout_logprobs_all.exp(), 16, replacement=True, generator=gen)
        learner_all = torch.log_softmax(logits, -1)
        batch = PolicyBatch(
            learner_logprobs=learner_all[arms][:, None],
            rollout_logprobs=rollout_logprobs_all[arms][:, None],
            mask=torch.ones(16, 1, dtype=torch.bool),
            rewards=(arms == 2).to(F64),
            group_ids=torch.zeros(16, dtype=torch.int64),
        )
        stale = logits.detach().clone()
        optimizer.zero_grad()
        options = {"clip_eps": 0.2, "clip_eps_high": 0.2} if name == "gspo" else {}
        compute_loss(name, batch, **options).loss.backward()
        optimizer.step()
    assert float(torch.softmax(logits.detach(), -1)[2]) > 0.9


# ---- flat groups and unsupported tokens (session 7 review) -------------------------------------
@pytest.mark.parametrize("reward", [0.2, 0.4, 0.6, 0.8, 1 / 3])
@pytest.mark.parametrize("size", [6, 7, 8, 16])
def test_flat_groups_get_exactly_zero_advantage_in_float32(reward, size):
    # an fp32 group mean of k/5 rewards is not exactly R: before the float64 statistics a flat
    # group of 7 x 0.2 got a GRPO advantage of ~0.05, all in one direction
    rewards = torch.full((size,), reward, dtype=torch.float32)
    groups = torch.zeros(size, dtype=torch.int64)
    assert torch.equal(group_mean_advantages(rewards, groups), torch.zeros(size))
    assert torch.equal(group_normalized_advantages(rewards, groups), torch.zeros(size))


@pytest.mark.parametrize("name", ["reinforce_zero", "grpo", "gspo", "tis"])
def test_a_flat_group_gives_exactly_zero_gradient(name):
    learner = torch.randn(7, 3, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    batch = PolicyBatch(
        learner_logprobs=learner,
        rollout_logprobs=learner.detach() - 0.1,
        mask=torch.ones(7, 3, dtype=torch.bool),
        rewards=torch.full((7,), 0.2),
        group_ids=torch.zeros(7, dtype=torch.int64),
    )
    compute_loss(name, batch).loss.backward()
    assert torch.equal(learner.grad, torch.zeros_like(learner))


def _support_batch(support):
    batch = make_batch()
    return PolicyBatch(
        learner_logprobs=batch.learner_logprobs,
        rollout_logprobs=batch.rollout_logprobs,
        mask=batch.mask,
        rewards=batch.rewards,
        group_ids=batch.group_ids,
        support=support,
    )


def test_unsupported_tokens_have_weight_zero_but_keep_their_response_length():
    # row 2's second token (rho 2) leaves the current policy's support: its term drops out, the
    # response still divides by |y| = 3, and its group's baseline is unchanged
    support = torch.ones(4, 3, dtype=torch.bool)
    support[2, 1] = False
    batch = _support_batch(support)
    out = reinforce_zero(batch)
    # row 2's per-response term: A = -0.25, (1 * -1 + 4 * -1) / 3 instead of (1 + 2 + 4) * -1 / 3
    full = -0.5 + 0.5 + 7 / 12 - 17 / 32
    expected = full - 7 / 12 + (-0.25) * (-5.0) / 3
    assert_close(out.loss, -expected / 4)
    grad = grad_of(out, batch)
    assert grad[2, 1] == 0.0
    assert_close(grad[2, 2], 4 / 48)  # the other tokens keep their 1/|y| = 1/3 share
    assert out.stats["ratio_min"] == 0.0


def test_gspo_gives_a_response_with_an_unsupported_token_zero_gradient():
    support = torch.ones(4, 3, dtype=torch.bool)
    support[2, 0] = False
    batch = _support_batch(support)
    grad = grad_of(gspo(batch), batch)
    assert torch.equal(grad[2], torch.zeros(3, dtype=F64))  # its geometric-mean ratio is 0
    assert bool((grad[3, :2] != 0).any())


def test_support_with_the_wrong_shape_is_rejected():
    with pytest.raises(ValueError, match="support"):
        _support_batch(torch.ones(4, 2, dtype=torch.bool))
