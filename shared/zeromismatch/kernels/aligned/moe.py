"""Aligned MoE: deterministic routing and experts whose result ignores the rest of the batch.

Routing (per token row; nothing is shared across rows):
- "softmax" (Qwen3-MoE): p = softmax(logits) in fp32, written as exp(x - max) / sum; top-k of
  p; with ``norm_topk_prob`` the k weights are divided by their sum.
- "sigmoid" (DeepSeek-V3 / Nemotron-H, transformers' ``*TopkRouter``): s = sigmoid(logits);
  selection uses s + correction_bias; experts are split into ``n_group`` groups, a group
  scores the sum of its two best biased scores, the best ``topk_group`` groups stay
  eligible; top-k among eligible experts; weights are the *unbiased* s of the chosen experts,
  divided by (sum + 1e-20) with ``norm_topk_prob``, then times ``routed_scaling_factor``.
- Top-k is a stable descending sort, so equal scores go to the lower expert index (torch.topk
  gives no such promise), and the k slots are ordered by score, then index.
- Sigmoid is computed as 1 / (1 + exp(-x)): measured on this CPU, ``torch.sigmoid`` /
  ``F.silu`` give an element different bits depending on whether it lands in the vectorised
  body or the scalar tail of the loop (i.e. on the tensor's size), while ``torch.exp`` and
  division do not. The weight normalisation sums the k weights left to right.

Experts: the (token, slot) pairs are grouped by expert with one stable sort; each expert's
tokens run through ``row_invariant_linear`` (gemm.py: a GEMM whose per-row bits do not depend
on the row count), so a token's activations do not depend on how many or which other tokens
share the expert. The activation is computed in
fp32 (silu as x / (1 + exp(-x)), or relu(x)^2) and rounded once to the activation dtype. The
output is ``sum_j w_j * expert_out_j`` accumulated in fp32 in ascending slot j, rounded once
to x's dtype.
"""

from __future__ import annotations

import torch

from .gemm import row_invariant_linear

_SCORINGS = ("softmax", "sigmoid")
_ACTIVATIONS = ("silu", "relu2")


def stable_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Sigmoid with bits independent of the tensor's size (see module docstring)."""
    return 1.0 / (1.0 + torch.exp(-x))


def _stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest per row; ties go to the lower index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]


def _sum_left_to_right(x: torch.Tensor) -> torch.Tensor:
    total = x[:, 0]
    for j in range(1, x.shape[1]):
        total = total + x[:, j]
    return total


def moe_route(
    router_logits: torch.Tensor,
    top_k: int,
    scoring: str = "softmax",
    norm_topk_prob: bool = True,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights ``[T, top_k]`` fp32 and expert ids ``[T, top_k]`` int64 (see module docstring)."""
    num_experts = _check_route(router_logits, top_k, scoring, correction_bias, n_group, topk_group)
    logits = router_logits.float()
    if scoring == "softmax":
        shifted = torch.exp(logits - logits.amax(-1, keepdim=True))
        scores = shifted / shifted.sum(-1, keepdim=True)
        ids = _stable_topk(scores, top_k)
        weights = scores.gather(1, ids)
        if norm_topk_prob:
            weights = weights / _sum_left_to_right(weights)[:, None]
        return weights * routed_scaling_factor if routed_scaling_factor != 1.0 else weights, ids
    scores = stable_sigmoid(logits)
    choice = scores + correction_bias.float() if correction_bias is not None else scores
    if n_group > 1:
        per_group = choice.view(-1, n_group, num_experts // n_group)
        best_two = torch.sort(per_group, dim=-1, descending=True).values[..., :2]
        group_scores = best_two[..., 0] + best_two[..., 1] if best_two.shape[-1] == 2 else best_two[..., 0]
        keep_groups = _stable_topk(group_scores, topk_group)
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep_groups, True)
        expert_mask = group_mask[:, :, None].expand_as(per_group).reshape(-1, num_experts)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = _stable_topk(choice, top_k)
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (_sum_left_to_right(weights)[:, None] + 1e-20)
    return weights * routed_scaling_factor, ids


def _check_route(router_logits, top_k, scoring, correction_bias, n_group, topk_group) -> int:
    if router_logits.dim() != 2 or not router_logits.is_floating_point():
        raise ValueError(f"router_logits must be a floating [T, E] tensor, got {tuple(router_logits.shape)}")
    num_experts = router_logits.shape[1]
    if scoring not in _SCORINGS:
        raise ValueError(f"scoring must be one of {_SCORINGS}, got {scoring!r}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in 1..{num_experts}, got {top_k}")
    if correction_bias is not None and correction_bias.shape != (num_experts,):
        raise ValueError(f"correction_bias must be [{num_experts}], got {tuple(correction_bias.shape)}")
    if n_group < 1 or num_experts % n_group != 0 or not 1 <= topk_group <= n_group:
        raise ValueError(f"bad expert groups: n_group={n_group}, topk_group={topk_group}, E={num_experts}")
    if n_group > 1 and top_k > topk_group * (num_experts // n_group):
        raise ValueError(f"top_k={top_k} exceeds the experts in {topk_group} eligible groups")
    return num_experts


def check_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation) -> None:
    """Shape/argument validation shared with the default set."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got {tuple(x.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} / topk_weights {tuple(topk_weights.shape)} must be [T, k]"
        )
    if activation == "silu" and w_gate is None:
        raise ValueError("activation 'silu' is gated and needs w_gate")
    if activation == "relu2" and w_gate is not None:
        raise ValueError("activation 'relu2' is not gated; pass w_gate=None")
    num_experts, inter, hidden = w_up.shape
    if hidden != x.shape[1] or w_down.shape != (num_experts, hidden, inter):
        raise ValueError(f"w_up {tuple(w_up.shape)} / w_down {tuple(w_down.shape)} do not match x")
    if w_gate is not None and w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} must match w_up {tuple(w_up.shape)}")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"topk_ids must be in [0, {num_experts})")


def moe_experts(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w_gate: torch.Tensor | None,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """Routed experts, each token independent of its batch (see module docstring)."""
    check_experts(x, topk_weights, topk_ids, w_gate, w_up, w_down, activation)
    num_tokens, top_k = topk_ids.shape
    hidden_size = x.shape[1]
    # group the (token, slot) pairs by expert with one stable sort instead of a mask per expert
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w_up.shape[0]).tolist()
    rows_sorted = x[order // top_k]
    outs, offset = [], 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = rows_sorted[offset : offset + count]
        offset += count
        up = row_invariant_linear(rows, w_up[expert]).float()
        if activation == "silu":
            gate = row_invariant_linear(rows, w_gate[expert]).float()
            hidden = (gate / (1.0 + torch.exp(-gate)) * up).to(x.dtype)
        else:
            hidden = torch.relu(up).square().to(x.dtype)
        outs.append(row_invariant_linear(hidden, w_down[expert]))
    # slot_out[t, j] = expert topk_ids[t, j] applied to x[t]
    slot_out = torch.empty(num_tokens * top_k, hidden_size, dtype=x.dtype, device=x.device)
    slot_out[order] = torch.cat(outs) if outs else slot_out[:0]
    slot_out = slot_out.view(num_tokens, top_k, hidden_size)
    weights = topk_weights.float()
    total = weights[:, 0:1] * slot_out[:, 0].float()
    for j in range(1, top_k):
        total = total + weights[:, j : j + 1] * slot_out[:, j].float()
    return total.to(x.dtype)
