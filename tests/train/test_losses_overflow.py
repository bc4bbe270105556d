"""REINFORCE Zero / TIS: a flat group (advantage exactly 0) contributes exactly 0 to the loss and
its gradient even where the fp32 importance ratio overflows (log-ratio > 88.7 gives rho = inf), and
the fix leaves every finite loss and gradient bit as it was."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from zeromismatch.train.losses import PolicyBatch, reinforce_zero, tis


def _overflow_batch(rewards):
    learner = torch.tensor([[-0.1, -0.2], [-0.3, -0.4]], requires_grad=True)
    rollout = torch.tensor([[-0.1, -95.0], [-0.3, -0.4]])  # row 0, token 1: exp(94.8) = inf in fp32
    batch = PolicyBatch(
        learner, rollout, torch.ones(2, 2, dtype=torch.bool), torch.tensor(rewards), torch.tensor([0, 0])
    )
    return batch, learner


@pytest.mark.parametrize(
    "loss_fn",
    [reinforce_zero, functools.partial(tis, cap=math.inf), tis],
    ids=["reinforce_zero", "tis_inf", "tis"],
)
def test_flat_group_with_overflowing_ratio_contributes_exactly_zero(loss_fn):
    """(TIS with a finite cap clamps the inf ratio and was never affected; with cap=inf it was.)"""
    batch, learner = _overflow_batch([1.0, 1.0])
    out = loss_fn(batch)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(learner.grad, torch.zeros(2, 2))
    assert torch.isinf(torch.exp(torch.tensor(-0.2) - torch.tensor(-95.0)))  # the ratio did overflow


def test_finite_loss_and_gradient_bits_are_unchanged():
    """Against the pre-fix expression ``w * A * l`` on random finite batches with flat and
    non-flat groups, both signs of zero advantage included: bitwise equal losses and gradients."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        learner = (-torch.rand(6, 5, generator=gen) * 3).requires_grad_(True)
        rollout = -torch.rand(6, 5, generator=gen) * 3
        mask = torch.rand(6, 5, generator=gen) > 0.2
        mask[:, 0] = True
        rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])  # groups 0 and 2 flat, group 1 not
        batch = PolicyBatch(learner, rollout, mask, rewards, torch.tensor([0, 0, 1, 1, 2, 2]))
        out = reinforce_zero(batch)
        (grad,) = torch.autograd.grad(out.loss, learner)

        reference_learner = learner.detach().clone().requires_grad_(True)
        masked = torch.where(mask, reference_learner, torch.zeros(()))
        ratio = torch.where(mask, torch.exp(learner.detach() - rollout), torch.zeros(()))
        per_token = torch.where(mask, ratio * out.advantages[:, None] * masked, torch.zeros(()))
        reference = -(per_token.sum(-1) / mask.sum(-1).float()).mean()
        (reference_grad,) = torch.autograd.grad(reference, reference_learner)
        assert torch.equal(out.loss, reference) and out.loss.item() != 0.0, trial
        assert torch.equal(grad, reference_grad), trial
        assert torch.equal(torch.signbit(grad), torch.signbit(reference_grad)), trial


# ---- the clipped objectives (GRPO, GSPO, PPO-clip): the gradient flows through exp(log-ratio) ----
from zeromismatch.train.losses import grpo, gspo, ppo_clip  # noqa: E402


def _clipped_overflow_batch(rewards, advantages=None):
    learner = torch.tensor([[-0.1, -0.2], [-0.3, -0.4]], requires_grad=True)
    old = torch.tensor([[-0.1, -195.0], [-0.3, -0.4]])  # row 0: exp(194.8) = inf, its mean exp(97.4) too
    batch = PolicyBatch(
        learner, old, torch.ones(2, 2, dtype=torch.bool), torch.tensor(rewards), torch.tensor([0, 0]),
        advantages=advantages,
    )  # fmt: skip
    return batch, learner


@pytest.mark.parametrize(
    "loss_fn, advantages",
    [(grpo, None), (gspo, None), (ppo_clip, torch.zeros(2))],
    ids=["grpo", "gspo", "ppo_clip"],
)
def test_clipped_losses_give_exact_zero_not_nan_for_a_flat_group_whose_ratio_overflows(loss_fn, advantages):
    batch, learner = _clipped_overflow_batch([1.0, 1.0], advantages)
    out = loss_fn(batch)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(learner.grad, torch.zeros(2, 2))  # before: NaN through exp's backward (0 * inf)
    assert out.stats["ratio_max"] == math.inf  # the stats still report the ratio as measured


def test_a_non_flat_overflow_is_left_to_the_clip():
    # with a nonzero advantage nothing is masked: the overflowing token takes the clipped branch
    batch, _ = _clipped_overflow_batch([1.0, 0.0])
    out = grpo(batch)
    assert math.isfinite(out.loss.item()) and out.stats["clip_rate"] == 1 / 4


@pytest.mark.parametrize("loss_fn", [grpo, ppo_clip], ids=["grpo", "ppo_clip"])
def test_a_positive_advantage_overflow_takes_the_clip_with_zero_gradient_not_nan(loss_fn):
    # the clipped branch (1 + eps) A is a constant there, but exp's backward gave 0 * inf = NaN, which
    # reached every parameter through the optimizer step
    advantages = torch.tensor([1.0, -1.0]) if loss_fn is ppo_clip else None
    batch, learner = _clipped_overflow_batch([1.0, 0.0], advantages)
    out = loss_fn(batch)
    out.loss.backward()
    assert math.isfinite(out.loss.item())
    assert torch.isfinite(learner.grad).all()
    assert learner.grad[0, 1].item() == 0.0  # the overflowing, clipped token
    assert out.stats["ratio_max"] == math.inf
