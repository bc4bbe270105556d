"""Policy-gradient losses on per-token logprobs: REINFORCE Zero and the baselines it is compared with.

All losses take one ``PolicyBatch`` (B responses padded to length L) and return a ``LossOutput``
(a scalar loss to minimise + a dict of float statistics). Per-token quantities at padded positions
(mask 0) never enter the loss or its gradient, whatever values they hold (even -inf or NaN).

- ``reinforce_zero`` (S3): A_i = R_i - mean of R over i's group; rho_t = exp(l_learner - l_rollout),
  unclipped, stop-gradient; loss = -(1/B) sum_i (1/|y_i|) sum_t sg(rho_i,t) * A_i * l_learner_i,t.
  A response with A_i = 0 contributes exactly 0 even where rho overflows fp32 (inf).
  No KL term, no value model, no rejection. Its gradient, sum rho * A * grad(l), is the ordinary
  token-level importance-sampled policy gradient for samples drawn by the rollout policy.
- ``tis``: the same, with truncated importance weights sg(min(rho, C)) (biased when rho > C).
- ``reinforce``: the same with every weight 1: no algorithmic correction (S1's baseline, "training
  without any algorithmic correction"). The rollout's samples are treated as the learner's own, so a
  train-inference mismatch biases the gradient unchecked; rho is still measured and reported.
- ``grpo``: A_i = (R_i - group mean) / (group std + eps) (population std; a group whose rewards are
  all equal gets A = 0); token ratio r_t = exp(l_learner - l_old); objective
  min(r A, clip(r, 1 - eps_low, 1 + eps_high) A); token mean within a response, mean over responses.
- ``gspo``: the GRPO advantage with one sequence ratio s_i = exp(mean_t(l_learner - l_old)) (the
  geometric mean of token ratios), clipped like PPO at the sequence level; mean over responses.
- ``ppo_clip``: token-level clipped objective with advantages supplied by the caller ([B] or [B, L]);
  token mean over the whole batch by default.

Tokens outside ``PolicyBatch.support`` (probability 0 under the current policy's top-k/top-p) have
ratio exactly 0: no contribution and no gradient, but they still count in |y_i| (GSPO: one of them makes
the sequence ratio 0). Group statistics are float64; a flat group's advantage is exactly 0, and such a
response contributes exactly 0 (no NaN in the loss or gradient) in every loss even where its ratio
overflows fp32; the ratio statistics still report the overflow (inf).

``l_old`` is ``PolicyBatch.old_logprobs`` when given (the learner's logprobs at the start of the
update, for multi-epoch PPO-style updates) and otherwise the rollout logprobs.

``clip_rate`` is the *active* clip rate: the share of tokens (sequences for GSPO) where the clipped
branch is strictly smaller than the unclipped one, i.e. where clipping removes the gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from zeromismatch.metrics.mismatch import is_weight_stats

__all__ = [
    "LOSSES",
    "LossOutput",
    "PolicyBatch",
    "compute_loss",
    "group_mean_advantages",
    "group_normalized_advantages",
    "gspo",
    "grpo",
    "ppo_clip",
    "reinforce",
    "reinforce_zero",
    "tis",
]

AGGREGATIONS = ("seq_mean_token_mean", "token_mean")


@dataclass
class PolicyBatch:
    """B responses padded to length L. ``learner_logprobs`` carries the gradient; the rest are data."""

    learner_logprobs: torch.Tensor  # [B, L] float, log pi_theta of the sampled tokens (differentiable)
    rollout_logprobs: torch.Tensor  # [B, L] float, logprobs the rollout engine recorded for them
    mask: torch.Tensor  # [B, L] bool or 0/1: which positions are response tokens
    rewards: torch.Tensor  # [B] float, one scalar reward per response
    group_ids: torch.Tensor  # [B] int, responses to the same prompt share an id
    old_logprobs: torch.Tensor | None = None  # [B, L] proximal-policy logprobs for ratio losses
    advantages: torch.Tensor | None = None  # [B] or [B, L], required by ppo_clip only
    #: [B, L] bool: tokens the current policy gives a nonzero probability (None: all). A response
    #: token outside it (its top-k/top-p support moved at lag > 0) has importance weight exactly 0:
    #: it adds nothing to the loss or its gradient, yet counts in |y_i|, and its response in B
    support: torch.Tensor | None = None

    def __post_init__(self) -> None:
        learner = self.learner_logprobs
        if not isinstance(learner, torch.Tensor) or not learner.is_floating_point() or learner.dim() != 2:
            raise TypeError("learner_logprobs must be a 2-D floating-point tensor [B, L]")
        shape = learner.shape
        for name in ("rollout_logprobs", "old_logprobs"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor")
            if value.shape != shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}, learner_logprobs {tuple(shape)}")
        if not isinstance(self.mask, torch.Tensor) or self.mask.shape != shape:
            raise ValueError(f"mask must be a tensor of shape {tuple(shape)}")
        if self.mask.dtype != torch.bool:
            if bool(((self.mask != 0) & (self.mask != 1)).any()):
                raise ValueError("mask must hold only 0/1 (or bool) values")
            self.mask = self.mask != 0
        if self.support is not None:
            if not isinstance(self.support, torch.Tensor) or self.support.shape != shape:
                raise ValueError(f"support must be a tensor of shape {tuple(shape)}")
            if self.support.dtype != torch.bool:
                raise TypeError(f"support must be a bool tensor, got dtype {self.support.dtype}")
        lengths = self.mask.sum(-1)
        if bool((lengths == 0).any()):
            empty = torch.nonzero(lengths == 0).flatten().tolist()
            raise ValueError(f"responses {empty} have no tokens in mask; drop them before the loss")
        batch = shape[0]
        if not isinstance(self.rewards, torch.Tensor) or self.rewards.shape != (batch,):
            raise ValueError(f"rewards must be a tensor of shape ({batch},)")
        if not bool(torch.isfinite(self.rewards.to(torch.float64)).all()):
            raise ValueError("rewards contains non-finite values")
        if not isinstance(self.group_ids, torch.Tensor) or self.group_ids.shape != (batch,):
            raise ValueError(f"group_ids must be a tensor of shape ({batch},)")
        if self.group_ids.is_floating_point():
            raise TypeError(f"group_ids must be an integer tensor, got dtype {self.group_ids.dtype}")
        if self.advantages is not None:
            adv = self.advantages
            if not isinstance(adv, torch.Tensor) or adv.shape not in ((batch,), shape):
                raise ValueError(f"advantages must have shape ({batch},) or {tuple(shape)}")
        for name in ("learner_logprobs", "rollout_logprobs", "old_logprobs"):
            value = getattr(self, name)
            if value is not None and not bool(torch.isfinite(value.detach()[self.active]).all()):
                raise ValueError(f"{name} has non-finite values at masked-in, supported tokens")

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    @property
    def active(self) -> torch.Tensor:
        """Response tokens that carry an importance weight: ``mask`` and ``support``."""
        return self.mask if self.support is None else self.mask & self.support


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, minimise it
    stats: dict[str, float] = field(default_factory=dict)
    advantages: torch.Tensor | None = None  # [B] or [B, L], detached, as used by the loss


def _float_dtype(batch: PolicyBatch) -> torch.dtype:
    return batch.learner_logprobs.dtype


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    _, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, int(inverse.max()) + 1


def _group_reduce(values: torch.Tensor, inverse: torch.Tensor, count: int, how: str) -> torch.Tensor:
    if how == "sum":
        return torch.zeros(count, dtype=values.dtype).index_add_(0, inverse, values)
    fill = -math.inf if how == "amax" else math.inf
    return torch.full((count,), fill, dtype=values.dtype).scatter_reduce(0, inverse, values, how)


def _flat_groups(rewards64: torch.Tensor, inverse: torch.Tensor, count: int) -> torch.Tensor:
    """Per response: does every response of its group have exactly the same reward?"""
    highest = _group_reduce(rewards64, inverse, count, "amax")
    lowest = _group_reduce(rewards64, inverse, count, "amin")
    return (highest == lowest)[inverse]


def _centred(rewards: torch.Tensor, group_ids: torch.Tensor):
    """R_i - group mean in float64 (an fp32 mean of k/5-valued rewards is not exactly R in a flat
    group: that gave flat groups a spurious advantage), exactly 0 in flat groups."""
    rewards64 = rewards.to(torch.float64)
    inverse, count = _group_index(group_ids)
    sums = _group_reduce(rewards64, inverse, count, "sum")
    sizes = _group_reduce(torch.ones_like(rewards64), inverse, count, "sum")
    flat = _flat_groups(rewards64, inverse, count)
    centred = torch.where(flat, torch.zeros_like(rewards64), rewards64 - (sums / sizes)[inverse])
    return centred, flat, inverse, count, sizes


def group_mean_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean of R over the responses that share i's group id (computed in float64,
    returned in the rewards' dtype); exactly 0 for a group whose rewards are all equal."""
    centred, *_ = _centred(rewards, group_ids)
    return centred.to(rewards.dtype)


def group_normalized_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage: (R_i - group mean) / (population std of the group + eps); exactly 0 for flat
    groups (float64 inside, returned in the rewards' dtype)."""
    centred, flat, inverse, count, sizes = _centred(rewards, group_ids)
    squares = _group_reduce(centred * centred, inverse, count, "sum")
    std = torch.sqrt(squares / sizes)[inverse]
    normalized = torch.where(flat, torch.zeros_like(centred), centred / (std + eps))
    return normalized.to(rewards.dtype)


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # torch.where (not multiplication) so -inf / NaN padding cannot leak into values or gradients.
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype))


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Reduce masked per-token objectives to a scalar."""
    if aggregation == "seq_mean_token_mean":
        per_response = per_token.sum(-1) / mask.sum(-1).to(per_token.dtype)
        return per_response.mean()
    if aggregation == "token_mean":
        return per_token.sum() / mask.sum().to(per_token.dtype)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def _base_stats(batch: PolicyBatch, advantages: torch.Tensor) -> dict[str, float]:
    """Statistics every loss reports: rollout-vs-learner IS weights (over the supported tokens)
    and advantages."""
    if bool(batch.active.any()):
        learner, rollout = batch.learner_logprobs.detach(), batch.rollout_logprobs.detach()
        is_stats = is_weight_stats(learner, rollout, batch.active)
    else:  # every token left the current support: no weight to describe
        is_stats = dict.fromkeys(("is_mean", "is_max", "is_min", "peak_over_median"), math.nan)
    adv = advantages.detach().to(torch.float64)
    adv_tokens = adv[batch.mask] if adv.dim() == 2 else adv
    return {
        "tokens": float(batch.mask.sum()),
        "responses": float(batch.mask.shape[0]),
        "is_mean": is_stats["is_mean"],
        "is_max": is_stats["is_max"],
        "is_min": is_stats["is_min"],
        "is_peak_over_median": is_stats["peak_over_median"],
        "advantage_mean": float(adv_tokens.mean()),
        "advantage_abs_mean": float(adv_tokens.abs().mean()),
    }


def _reinforce_with_weights(
    batch: PolicyBatch, weights: torch.Tensor, advantages: torch.Tensor, aggregation: str
) -> torch.Tensor:
    learner = _masked(batch.learner_logprobs, batch.active)
    token_advantages = advantages[:, None]
    # A zero advantage (a flat group) zeroes the weight before the product, so an fp32 ratio that
    # overflowed to inf (log-ratio > 88.7) gives a term of exactly 0 instead of inf * 0 = NaN in
    # the loss and, through d/dl = w * A, in every gradient entry. This changes no finite result
    # bit: weights are >= 0, and for finite w >= 0, w * (+-0) and 0 * (+-0) are the same signed
    # zero, so w * A, the term (w * A) * l and its gradient w * A are bitwise what they were.
    weights = torch.where(token_advantages == 0, torch.zeros((), dtype=weights.dtype), weights.detach())
    per_token = _masked(weights * token_advantages * learner, batch.active)
    return -_aggregate(per_token, batch.mask, aggregation)


def _log_ratio(batch: PolicyBatch, learner: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """learner - reference at the supported response tokens, 0 elsewhere (no -inf/NaN leaks)."""
    return _masked(learner, batch.active) - _masked(reference, batch.active)


def _token_ratio(batch: PolicyBatch, learner: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """exp(learner - reference): exactly 0 (and no gradient) at unsupported tokens, so a clipped
    objective min(0, clip(0) A) is a constant there; 1 at padding (never aggregated)."""
    return _masked(torch.exp(_log_ratio(batch, learner, reference)), batch.active | ~batch.mask)


def _flat_overflow_safe(log_ratio: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """``log_ratio`` made safe where exp(log_ratio) would overflow and the advantage is >= 0.

    For the clipped objectives the gradient flows through exp(log_ratio), and the exp's backward
    multiplies by its output: at an overflowing token, 0 * inf = NaN even where the objective takes
    no gradient from it. Advantage exactly 0: the log-ratio becomes 0, so the term is exactly 0 with a
    zero gradient. Advantage > 0: the clipped branch (1 + eps_high) A is active, a constant, so the
    log-ratio becomes a detached finite constant above every clip band; the value stays the clipped
    one and the gradient is 0 instead of NaN. (Advantage < 0 never clips an overflowing ratio: its
    objective is -inf, as measured.) Everywhere else the where() selects ``log_ratio`` itself, so every
    finite loss and gradient keeps its bits."""
    overflow_at = math.log(torch.finfo(log_ratio.dtype).max)
    overflow = log_ratio.detach() > overflow_at
    if not bool(overflow.any()):
        return log_ratio
    safe = torch.where(advantages == 0, 0.0, overflow_at - 1.0).to(log_ratio.dtype)
    return torch.where(overflow & (advantages >= 0), safe, log_ratio)


def _clipped_token_ratio(batch: PolicyBatch, token_advantages: torch.Tensor) -> torch.Tensor:
    """:func:`_token_ratio` of the learner to the proximal policy, overflow-safe at zero advantages."""
    log_ratio = _flat_overflow_safe(
        _log_ratio(batch, batch.learner_logprobs, _proximal_logprobs(batch)),
        token_advantages.expand_as(batch.mask),
    )
    return _masked(torch.exp(log_ratio), batch.active | ~batch.mask)


def _ratio_to_rollout(batch: PolicyBatch) -> torch.Tensor:
    """rho = exp(l_learner - l_rollout), detached (the REINFORCE weights)."""
    return _token_ratio(batch, batch.learner_logprobs.detach(), batch.rollout_logprobs.detach())


def reinforce_zero(batch: PolicyBatch, aggregation: str = "seq_mean_token_mean") -> LossOutput:
    """REINFORCE Zero (S3): unclipped, stop-gradient token IS weights x group-mean advantage."""
    dtype = _float_dtype(batch)
    advantages = group_mean_advantages(batch.rewards.to(dtype), batch.group_ids)
    ratio = _ratio_to_rollout(batch)
    loss = _reinforce_with_weights(batch, ratio, advantages, aggregation)
    stats = _base_stats(batch, advantages)
    stats.update(loss=float(loss.detach()), clip_rate=0.0, **_ratio_stats(ratio, batch.mask))
    return LossOutput(loss=loss, stats=stats, advantages=advantages.detach())


def reinforce(batch: PolicyBatch, aggregation: str = "seq_mean_token_mean") -> LossOutput:
    """REINFORCE with no correction: weight 1 per token x group-mean advantage (rho only measured)."""
    dtype = _float_dtype(batch)
    advantages = group_mean_advantages(batch.rewards.to(dtype), batch.group_ids)
    ratio = _ratio_to_rollout(batch)
    # 1 at supported tokens, 0 where the learner gives the token probability 0 (as every loss here)
    ones = _masked(torch.ones_like(ratio), batch.active)
    loss = _reinforce_with_weights(batch, ones, advantages, aggregation)
    stats = _base_stats(batch, advantages)
    stats.update(loss=float(loss.detach()), clip_rate=0.0, **_ratio_stats(ratio, batch.mask))
    return LossOutput(loss=loss, stats=stats, advantages=advantages.detach())


def tis(batch: PolicyBatch, cap: float = 2.0, aggregation: str = "seq_mean_token_mean") -> LossOutput:
    """Truncated IS REINFORCE: weights sg(min(rho, cap)) instead of sg(rho)."""
    if not cap > 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    dtype = _float_dtype(batch)
    advantages = group_mean_advantages(batch.rewards.to(dtype), batch.group_ids)
    ratio = _ratio_to_rollout(batch)
    truncated = torch.clamp(ratio, max=cap)
    loss = _reinforce_with_weights(batch, truncated, advantages, aggregation)
    stats = _base_stats(batch, advantages)
    truncation = float(((ratio > cap) & batch.mask).sum()) / float(batch.mask.sum())
    stats.update(loss=float(loss.detach()), clip_rate=truncation, **_ratio_stats(ratio, batch.mask))
    return LossOutput(loss=loss, stats=stats, advantages=advantages.detach())


def _true_ratio(batch: PolicyBatch) -> torch.Tensor:
    """The learner-to-proximal token ratio as measured (inf where it overflowed), for the stats."""
    return _token_ratio(batch, batch.learner_logprobs.detach(), _proximal_logprobs(batch))


def _ratio_stats(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    selected = ratio.detach()[mask].to(torch.float64)
    return {
        "ratio_mean": float(selected.mean()),
        "ratio_max": float(selected.max()),
        "ratio_min": float(selected.min()),
    }


def _check_clip(eps_low: float, eps_high: float | None) -> tuple[float, float]:
    eps_high = eps_low if eps_high is None else eps_high
    if not (0 <= eps_low < 1) or eps_high < 0:
        raise ValueError(f"clip epsilons need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
    return eps_low, eps_high


def _clipped_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """min(r A, clip(r) A) and where the clipped branch is strictly smaller (its gradient is zero).

    torch.where instead of torch.minimum: at ties min() splits the gradient between both branches,
    which is only right because clamp passes the gradient through inside the band; where() keeps the
    unclipped branch's full gradient explicitly.
    """
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
    clip_active = clipped < unclipped
    return torch.where(clip_active, clipped, unclipped), clip_active


def _proximal_logprobs(batch: PolicyBatch) -> torch.Tensor:
    old = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
    return old.detach()


def grpo(
    batch: PolicyBatch,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    std_eps: float = 1e-6,
    aggregation: str = "seq_mean_token_mean",
) -> LossOutput:
    """GRPO without a KL term: token-clipped ratio x std-normalised group advantage."""
    eps_low, eps_high = _check_clip(clip_eps, clip_eps_high)
    dtype = _float_dtype(batch)
    advantages = group_normalized_advantages(batch.rewards.to(dtype), batch.group_ids, std_eps)
    ratio = _clipped_token_ratio(batch, advantages[:, None])
    objective, clip_active = _clipped_objective(ratio, advantages[:, None], eps_low, eps_high)
    loss = -_aggregate(_masked(objective, batch.mask), batch.mask, aggregation)
    stats = _base_stats(batch, advantages)
    clip_rate = float((clip_active & batch.mask).sum()) / float(batch.mask.sum())
    measured = _ratio_stats(_true_ratio(batch), batch.mask)
    stats.update(loss=float(loss.detach()), clip_rate=clip_rate, **measured)
    return LossOutput(loss=loss, stats=stats, advantages=advantages.detach())


def gspo(
    batch: PolicyBatch,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    std_eps: float = 1e-6,
) -> LossOutput:
    """GSPO: sequence ratio s_i = exp(mean_t(l - l_old)), clipped, x std-normalised group advantage.

    Defaults 3e-4 / 4e-4 are the GSPO paper's sequence-level clip range (sequence ratios sit far
    closer to 1 than token ratios).
    """
    eps_low, eps_high = _check_clip(clip_eps, clip_eps_high)
    dtype = _float_dtype(batch)
    advantages = group_normalized_advantages(batch.rewards.to(dtype), batch.group_ids, std_eps)
    log_ratio = _log_ratio(batch, batch.learner_logprobs, _proximal_logprobs(batch))
    sequence_log_ratio = _flat_overflow_safe(log_ratio.sum(-1) / batch.lengths.to(dtype), advantages)
    sequence_ratio = torch.exp(sequence_log_ratio)
    # one token of probability 0 makes the geometric mean 0: the whole response then has weight 0
    fully_supported = (batch.active == batch.mask).all(-1)
    sequence_ratio = _masked(sequence_ratio, fully_supported)
    objective, clip_active = _clipped_objective(sequence_ratio, advantages, eps_low, eps_high)
    loss = -objective.mean()
    stats = _base_stats(batch, advantages)
    # the stats report the ratio as measured (inf where it overflowed), not the overflow-safe one
    measured = torch.exp(log_ratio.detach().sum(-1) / batch.lengths.to(dtype))
    seq = _masked(measured, fully_supported).to(torch.float64)
    stats.update(
        loss=float(loss.detach()),
        clip_rate=float(clip_active.to(torch.float64).mean()),
        ratio_mean=float(seq.mean()),
        ratio_max=float(seq.max()),
        ratio_min=float(seq.min()),
    )
    return LossOutput(loss=loss, stats=stats, advantages=advantages.detach())


def ppo_clip(
    batch: PolicyBatch,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    aggregation: str = "token_mean",
) -> LossOutput:
    """PPO-clip surrogate with caller-supplied advantages (``batch.advantages``, [B] or [B, L])."""
    if batch.advantages is None:
        raise ValueError("ppo_clip needs PolicyBatch.advantages ([B] or [B, L])")
    eps_low, eps_high = _check_clip(clip_eps, clip_eps_high)
    dtype = _float_dtype(batch)
    advantages = batch.advantages.detach().to(dtype)
    token_advantages = advantages[:, None].expand_as(batch.mask) if advantages.dim() == 1 else advantages
    token_advantages = _masked(token_advantages, batch.mask)
    if not bool(torch.isfinite(token_advantages).all()):
        raise ValueError("advantages has non-finite values at masked-in tokens")
    ratio = _clipped_token_ratio(batch, token_advantages)
    objective, clip_active = _clipped_objective(ratio, token_advantages, eps_low, eps_high)
    loss = -_aggregate(_masked(objective, batch.mask), batch.mask, aggregation)
    stats = _base_stats(batch, token_advantages)
    clip_rate = float((clip_active & batch.mask).sum()) / float(batch.mask.sum())
    measured = _ratio_stats(_true_ratio(batch), batch.mask)
    stats.update(loss=float(loss.detach()), clip_rate=clip_rate, **measured)
    return LossOutput(loss=loss, stats=stats, advantages=advantages)


LOSSES: dict[str, Callable[..., LossOutput]] = {
    "reinforce_zero": reinforce_zero,
    "reinforce": reinforce,
    "grpo": grpo,
    "gspo": gspo,
    "ppo_clip": ppo_clip,
    "tis": tis,
}


def compute_loss(name: str, batch: PolicyBatch, **options) -> LossOutput:
    """Look a loss up by name (config-friendly) and apply it."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
    return LOSSES[name](batch, **options)
