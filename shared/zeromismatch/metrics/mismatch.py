"""Train–inference mismatch metrics (definitions: docs/metrics.md, ARCHITECTURE.md).

Every statistic is computed in float64 from the given tokens, so the metric itself
adds no rounding worth speaking of, and identical inputs give exactly 0.0:

- ``logprob_diff_stats``: per sampled token, diff_t = l_trainer - l_rollout under the
  same weights; max |diff|, mean |diff|, population std of diff, and the k3 estimator
  mean(exp(d) - 1 - d) of KL(rollout || trainer) from rollout samples. "Zero mismatch"
  means all four are exactly 0.0 (``identical`` says the inputs are equal value for value).
  ``support_aware_diff_stats``: the same over tokens finite on both sides, counting the others
  (a sampled token outside one side's top-k/top-p support has logprob -inf there).
- ``is_weight_stats``: rho_t = exp(l_learner - l_rollout); peak deviation = max / median.
- ``clip_fraction``: share of ratios outside [1 - eps_low, 1 + eps_high].
- ``entropy_from_logprobs``: mean token entropy from full log-probability rows.
- ``pre_clip_grad_norm``: global L2 norm of gradients before any clipping.
- ``reward_stats``, ``lag_stats``.
- ``decompose_logprob_gap``: l_now - l_rollout = (l_now - l_at_rollout_version) [weight lag]
  + (l_at_rollout_version - l_rollout) [kernel mismatch].
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

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


def _as_tensor(values, name: str) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach()
    if isinstance(values, list | tuple) and values and all(isinstance(v, torch.Tensor) for v in values):
        # ragged per-request tensors (the engine returns one per request): compare them concatenated
        return torch.cat([v.detach().reshape(-1) for v in values])
    try:
        return torch.as_tensor(values)
    except (TypeError, ValueError, RuntimeError) as exc:
        kind = type(values).__name__
        raise TypeError(f"{name} must be a tensor or a sequence of numbers, got {kind}") from exc


def _check_mask(mask, shape: torch.Size, name: str = "mask") -> torch.Tensor | None:
    if mask is None:
        return None
    mask = _as_tensor(mask, name)
    if mask.shape != shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)} but the values have shape {tuple(shape)}")
    if mask.dtype != torch.bool:
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(f"{name} must hold only 0/1 (or bool) values")
        mask = mask != 0
    return mask


def _select_pair(
    first, second, mask, first_name: str, second_name: str, finite: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate two same-shaped float inputs and return their masked tokens (original dtype, 1-D);
    with ``finite`` (the default) every selected value must be finite."""
    first = _as_tensor(first, first_name)
    second = _as_tensor(second, second_name)
    for value, name in ((first, first_name), (second, second_name)):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if first.shape != second.shape:
        raise ValueError(
            f"{first_name} has shape {tuple(first.shape)} but {second_name} has shape {tuple(second.shape)}"
        )
    mask = _check_mask(mask, first.shape)
    if mask is not None:
        first, second = first[mask], second[mask]
    first, second = first.reshape(-1), second.reshape(-1)
    if first.numel() == 0:
        raise ValueError(f"no tokens to compare ({first_name} is empty or the mask selects nothing)")
    for value, name in ((first, first_name), (second, second_name)):
        if finite and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} contains non-finite values (NaN or inf) at selected tokens")
    return first, second


def _population_std(values: torch.Tensor) -> float:
    # correction=0: a single token has std 0.0 instead of NaN, and all-equal values give exactly 0.0.
    centred = values - values.mean()
    return math.sqrt(float((centred * centred).mean()))


def logprob_diff_stats(rollout_logprobs, trainer_logprobs, mask=None) -> dict:
    """Mismatch between rollout and trainer logprobs of the same sampled tokens, same weights.

    Returns ``dict(diff_max, diff_mean, diff_std, k3_kl, tokens, identical)``:
    diff_t = trainer - rollout (float64); diff_max = max |diff|; diff_mean = mean |diff|;
    diff_std = population std of diff; k3_kl = mean(expm1(d) - d) (>= 0; expm1 keeps tiny d
    accurate); tokens = number of compared tokens; identical = every selected value equal
    (``torch.equal`` when both have one dtype). Identical inputs give exactly 0.0 for all four.
    """
    rollout, trainer = _select_pair(
        rollout_logprobs, trainer_logprobs, mask, "rollout_logprobs", "trainer_logprobs"
    )
    if rollout.dtype == trainer.dtype:
        identical = bool(torch.equal(rollout, trainer))
    else:
        identical = bool(torch.equal(rollout.to(torch.float64), trainer.to(torch.float64)))
    diff = trainer.to(torch.float64) - rollout.to(torch.float64)
    abs_diff = diff.abs()
    return {
        "diff_max": float(abs_diff.max()),
        "diff_mean": float(abs_diff.mean()),
        "diff_std": _population_std(diff),
        "k3_kl": float((torch.expm1(diff) - diff).mean()),
        "tokens": int(diff.numel()),
        "identical": identical,
    }


def support_aware_diff_stats(rollout_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor) -> dict:
    """``logprob_diff_stats`` over the tokens both sides give a finite logprob, plus
    ``nonfinite_tokens``: the others. Under top-k / top-p a token outside one side's processed
    support has logprob -inf there; with unaligned kernels the engine can sample a token the
    trainer's support excludes -- the worst mismatch there is, counted here rather than refused as
    bad input (``logprob_diff_stats`` raises on it). ``tokens`` counts the finite tokens (all four
    statistics are 0.0 when there are none); ``identical`` compares every token (``torch.equal``:
    two -inf are equal, a nan never is). Zero mismatch here is ``identical``: the four statistics
    leave the non-finite tokens out. The inputs are validated as ``logprob_diff_stats`` does (float,
    same shape, not empty), except for finiteness."""
    rollout, trainer = _select_pair(
        rollout_logprobs, trainer_logprobs, None, "rollout_logprobs", "trainer_logprobs", finite=False
    )
    finite = torch.isfinite(rollout) & torch.isfinite(trainer)
    if bool(finite.any()):
        stats = logprob_diff_stats(rollout, trainer, mask=finite)
    else:
        stats = {"diff_max": 0.0, "diff_mean": 0.0, "diff_std": 0.0, "k3_kl": 0.0, "tokens": 0}
    stats["identical"] = bool(torch.equal(rollout, trainer))
    stats["nonfinite_tokens"] = int((~finite).sum())
    return stats


def _median(values: torch.Tensor) -> float:
    # The true median (mean of the two middle values for an even count); torch.median returns the lower one.
    ordered = values.sort().values
    n = ordered.numel()
    if n % 2:
        return float(ordered[n // 2])
    return float((ordered[n // 2 - 1] + ordered[n // 2]) / 2)


def is_weight_stats(learner_logprobs, rollout_logprobs, mask=None) -> dict:
    """Token importance weights rho_t = exp(l_learner - l_rollout) (float64) and their spread.

    ``peak_over_median`` = max rho / median rho, the "peak deviation" of S3 (1.0 when all weights
    are equal, e.g. exactly on-policy with aligned kernels). Also log_ratio_abs_max for overflow-safe reading.
    """
    learner, rollout = _select_pair(
        learner_logprobs, rollout_logprobs, mask, "learner_logprobs", "rollout_logprobs"
    )
    log_ratio = learner.to(torch.float64) - rollout.to(torch.float64)
    ratio = torch.exp(log_ratio)
    median = _median(ratio)
    peak = float(ratio.max())
    return {
        "is_mean": float(ratio.mean()),
        "is_max": peak,
        "is_min": float(ratio.min()),
        "is_median": median,
        "peak_over_median": peak / median if median > 0 else math.inf,
        "log_ratio_abs_max": float(log_ratio.abs().max()),
        "tokens": int(ratio.numel()),
    }


def clip_fraction(ratio, eps_low: float, eps_high: float | None = None, mask=None) -> float:
    """Share of selected ratios outside [1 - eps_low, 1 + eps_high] (eps_high defaults to eps_low).

    This is the band-based clip rate; the losses additionally report the *active* clip rate
    (tokens whose gradient the clipped PPO objective actually zeroes, which depends on the sign of A).
    """
    if eps_high is None:
        eps_high = eps_low
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip epsilons must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    ratio = _as_tensor(ratio, "ratio")
    if not ratio.is_floating_point():
        raise TypeError(f"ratio must be a floating-point tensor, got dtype {ratio.dtype}")
    mask = _check_mask(mask, ratio.shape)
    selected = ratio[mask] if mask is not None else ratio.reshape(-1)
    if selected.numel() == 0:
        raise ValueError("no tokens to measure (ratio is empty or the mask selects nothing)")
    # the band's edges in the ratio's own dtype, as the clipped losses' torch.clamp rounds them: an
    # fp32 ratio of exactly fp32(1.2) is on the edge, inside, not 4.8e-8 above a float64 1.2
    low = torch.tensor(1.0 - eps_low, dtype=selected.dtype)
    high = torch.tensor(1.0 + eps_high, dtype=selected.dtype)
    outside = (selected < low) | (selected > high)
    return float(outside.to(torch.float64).mean())


def entropy_from_logprobs(logprob_rows, mask=None) -> float:
    """Mean entropy H = -sum_v p_v log p_v over rows ``[..., V]`` of log-probabilities.

    Entries of -inf (tokens removed by top-k/top-p) contribute 0. ``mask`` has the shape of the
    leading dims and selects which rows count.
    """
    rows = _as_tensor(logprob_rows, "logprob_rows")
    if not rows.is_floating_point() or rows.dim() < 1:
        raise TypeError("logprob_rows must be a floating-point tensor with a vocabulary dimension")
    if bool(torch.isnan(rows).any()) or bool((rows == math.inf).any()):
        raise ValueError("logprob_rows contains NaN or +inf")
    rows = rows.to(torch.float64)
    probs = rows.exp()
    terms = torch.where(probs > 0, -probs * rows, torch.zeros_like(rows))
    per_row = terms.sum(-1)
    mask = _check_mask(mask, per_row.shape)
    selected = per_row[mask] if mask is not None else per_row.reshape(-1)
    if selected.numel() == 0:
        raise ValueError("no rows to measure (logprob_rows is empty or the mask selects nothing)")
    return float(selected.mean())


def pre_clip_grad_norm(parameters: Iterable[torch.Tensor] | torch.Tensor) -> float:
    """Global L2 norm of all present gradients, in float64, without modifying them.

    Call before ``clip_grad_norm_``; S3 compares the largest pre-clip norm of runs. Parameters
    without a gradient are skipped; if none has one the norm is 0.0. Non-finite norms are returned
    as is (inf/NaN) so that a blow-up is visible rather than hidden.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    squared = 0.0
    for param in parameters:
        if not isinstance(param, torch.Tensor):
            raise TypeError(f"parameters must be tensors, got {type(param).__name__}")
        if param.grad is None:
            continue
        grad = param.grad.detach().to(torch.float64)
        squared += float((grad * grad).sum())
    return math.sqrt(squared)


def reward_stats(rewards, group_ids=None) -> dict:
    """Mean/std/min/max of rewards; with ``group_ids`` also the share of groups whose rewards are
    all equal (their group-mean advantage is zero, so they carry no learning signal)."""
    rewards = _as_tensor(rewards, "rewards")
    if rewards.dim() != 1 or rewards.numel() == 0:
        raise ValueError(f"rewards must be a non-empty 1-D tensor, got shape {tuple(rewards.shape)}")
    values = rewards.to(torch.float64)
    if not bool(torch.isfinite(values).all()):
        raise ValueError("rewards contains non-finite values")
    stats = {
        "reward_mean": float(values.mean()),
        "reward_std": _population_std(values),
        "reward_min": float(values.min()),
        "reward_max": float(values.max()),
        "responses": int(values.numel()),
    }
    if group_ids is not None:
        group_ids = _as_tensor(group_ids, "group_ids")
        if group_ids.shape != rewards.shape:
            raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, rewards {tuple(rewards.shape)}")
        groups = torch.unique(group_ids)
        flat = sum(bool((values[group_ids == g] == values[group_ids == g][0]).all()) for g in groups)
        stats["groups"] = int(groups.numel())
        stats["zero_signal_group_fraction"] = flat / groups.numel()
    return stats


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k for one prompt from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    pass@1 reduces to c / n; average over prompts for the eval score (higher is better).
    """
    for value, name in ((num_samples, "num_samples"), (num_correct, "num_correct"), (k, "k")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not (0 <= num_correct <= num_samples and 1 <= k <= num_samples):
        raise ValueError(
            f"need 0 <= num_correct <= num_samples and 1 <= k <= num_samples, got "
            f"n={num_samples}, c={num_correct}, k={k}"
        )
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.comb(num_samples - num_correct, k) / math.comb(num_samples, k)


def lag_stats(token_versions, learner_version: int, mask=None) -> dict:
    """Policy lag = learner_version - weight version that produced each token (per token or response).

    Raises ValueError if any version is newer than the learner (a bookkeeping bug).
    """
    versions = _as_tensor(token_versions, "token_versions")
    if versions.is_floating_point() or versions.dtype == torch.bool:
        raise TypeError(f"token_versions must be an integer tensor, got dtype {versions.dtype}")
    mask = _check_mask(mask, versions.shape)
    selected = versions[mask] if mask is not None else versions.reshape(-1)
    if selected.numel() == 0:
        raise ValueError("no versions to measure (token_versions is empty or the mask selects nothing)")
    lag = int(learner_version) - selected.to(torch.int64)
    if bool((lag < 0).any()):
        raise ValueError(f"token_versions contains versions newer than learner_version={learner_version}")
    lag_f = lag.to(torch.float64)
    return {
        "lag_mean": float(lag_f.mean()),
        "lag_max": int(lag.max()),
        "lag_min": int(lag.min()),
        "lag_std": _population_std(lag_f),
        "tokens": int(lag.numel()),
    }


@dataclass(frozen=True)
class LogprobGapDecomposition:
    """Per-token float64 terms of l_now - l_rollout, selected by the mask (1-D)."""

    total: torch.Tensor  # l_learner_now - l_rollout
    weight_lag: torch.Tensor  # l_learner_now - l_learner_at_rollout_version
    kernel_mismatch: torch.Tensor  # l_learner_at_rollout_version - l_rollout

    def stats(self) -> dict:
        """abs-mean, mean, abs-max of each term; kernel_share = kernel abs-mean / (sum of both abs-means)."""
        out: dict = {"tokens": int(self.total.numel())}
        for name, term in (
            ("total", self.total),
            ("weight_lag", self.weight_lag),
            ("kernel", self.kernel_mismatch),
        ):
            out[f"{name}_abs_mean"] = float(term.abs().mean())
            out[f"{name}_mean"] = float(term.mean())
            out[f"{name}_abs_max"] = float(term.abs().max())
        denominator = out["weight_lag_abs_mean"] + out["kernel_abs_mean"]
        out["kernel_share"] = out["kernel_abs_mean"] / denominator if denominator > 0 else 0.0
        return out


def decompose_logprob_gap(
    learner_now, learner_at_rollout_version, rollout, mask=None
) -> LogprobGapDecomposition:
    """Split the learner-vs-rollout logprob gap into weight lag and kernel mismatch (S3).

    weight_lag = l_now - l_at_v (the learner's own kernels, two weight versions: changes smoothly);
    kernel_mismatch = l_at_v - l_rollout (same weights and tokens, two implementations: exactly 0
    with aligned kernels). The two float64 terms sum to ``total`` up to float64 rounding.
    """
    now, at_version = _select_pair(
        learner_now, learner_at_rollout_version, mask, "learner_now", "learner_at_rollout_version"
    )
    _, rollout_sel = _select_pair(learner_now, rollout, mask, "learner_now", "rollout")
    now, at_version, rollout_sel = (t.to(torch.float64) for t in (now, at_version, rollout_sel))
    return LogprobGapDecomposition(
        total=now - rollout_sel,
        weight_lag=now - at_version,
        kernel_mismatch=at_version - rollout_sel,
    )
