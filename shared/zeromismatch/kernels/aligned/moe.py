"""Aligned MoE: deterministic routing and experts whose result ignores the rest of the batch.

Routing (per token row; nothing is shared across rows):
- "softmax" (Qwen3-MoE): p = torch.softmax(logits) in fp32 (each row reduced on one thread,
  in an order fixed by the row length); top-k of p; with ``norm_topk_prob`` the k weights
  are divided by their sum.
- "sigmoid" (DeepSeek-V3 / Nemotron-H, transformers' ``*TopkRouter``): s = sigmoid(logits);
  selection uses s + correction_bias; experts are split into ``n_group`` groups, a group
  scores the sum of its two best biased scores, the best ``topk_group`` groups stay
  eligible; top-k among eligible experts; weights are the *unbiased* s of the chosen experts,
  divided by (sum + 1e-20) with ``norm_topk_prob``, then times ``routed_scaling_factor``.
- Top-k is a stable descending sort, so equal scores go to the lower expert index (torch.topk
  gives no such promise), and the k slots are ordered by score, then index.
- Sigmoid is ``torch.sigmoid`` run through ``dense.vector_path``: measured on this CPU,
  ``torch.sigmoid`` / ``F.silu`` give an element different bits depending on whether it lands
  in the vectorised body or the scalar tail of the loop (i.e. on the tensor's size);
  ``vector_path`` puts every element in the body. The weight normalisation sums the k
  weights left to right.

Experts: the (token, slot) pairs are grouped by expert with one stable sort; each expert's
tokens run through ``row_invariant_linear`` (gemm.py: a GEMM whose per-row bits do not depend
on the row count), so a token's activations do not depend on how many or which other tokens
share the expert. The activation is computed in
fp32 (silu through ``vector_path``, or relu(x)^2) and rounded once to the activation dtype. The
output is ``sum_j w_j * expert_out_j`` accumulated in fp32 in ascending slot j, rounded once
to x's dtype.
"""

from __future__ import annotations

import torch

from ..capture.allowed_host_reads import host_reads_for_checks
from .dense import silu, vector_path
from .gemm import linear_prepacked, packed_experts, row_invariant_linear

_SCORINGS = ("softmax", "sigmoid")
_ACTIVATIONS = ("silu", "relu2")


def stable_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """Sigmoid with bits independent of the tensor's size (see module docstring)."""
    return vector_path(torch.sigmoid, x)


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
        # torch's softmax reduces each row on one thread in a fixed order (row-invariant)
        scores = torch.softmax(logits, dim=-1)
        ranked = torch.sort(scores, dim=-1, descending=True, stable=True)
        ids, weights = ranked.indices[:, :top_k], ranked.values[:, :top_k]
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
    if isinstance(top_k, bool) or not hasattr(top_k, "__index__"):
        raise TypeError(f"top_k must be an integer, got {type(top_k).__name__} {top_k!r}")
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
    if topk_ids.shape[1] < 1:
        raise ValueError("topk_ids must choose at least one expert per token (k >= 1)")
    if topk_ids.is_floating_point() or topk_ids.is_complex() or topk_ids.dtype == torch.bool:
        raise TypeError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    if activation == "silu" and w_gate is None:
        raise ValueError("activation 'silu' is gated and needs w_gate")
    if activation == "relu2" and w_gate is not None:
        raise ValueError("activation 'relu2' is not gated; pass w_gate=None")
    num_experts, inter, hidden = w_up.shape
    if num_experts < 1:
        raise ValueError("w_up must hold at least one expert")
    if hidden != x.shape[1] or w_down.shape != (num_experts, hidden, inter):
        raise ValueError(f"w_up {tuple(w_up.shape)} / w_down {tuple(w_down.shape)} do not match x")
    if w_gate is not None and w_gate.shape != w_up.shape:
        raise ValueError(f"w_gate {tuple(w_gate.shape)} must match w_up {tuple(w_up.shape)}")
    with host_reads_for_checks():  # (a step graph's replay skips it; moe.c checks the ids too)
        out_of_range = topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts)
    if out_of_range:
        raise ValueError(f"topk_ids must be in [0, {num_experts})")


def _activate(gate_up: torch.Tensor, inter: int, activation: str, dtype: torch.dtype) -> torch.Tensor:
    """act(gate) * up (silu, gated) or relu(up)^2, in fp32, rounded once to ``dtype``; contiguous."""
    g32 = gate_up.float()
    if activation == "relu2":
        return torch.relu(g32).square().to(dtype)
    hidden = silu(g32)  # all 2I columns in one contiguous call; the up half is discarded
    hidden = hidden[:, :inter] * g32[:, inter:]
    return hidden.to(dtype) if dtype != torch.float32 else hidden.contiguous()


def _expert_rows(rows_sorted: torch.Tensor, offset: int, count: int) -> tuple[torch.Tensor, int]:
    """The expert's rows of the sorted batch, as a window of >= 2 rows when it has one row
    (a neighbour's row rides along: rows never interact in a GEMM, it only fills the second
    row the row-invariant GEMM needs) and where in the window the expert's rows start."""
    if count >= 2 or rows_sorted.shape[0] < 2:
        return rows_sorted[offset : offset + count], 0
    start = offset if offset + 2 <= rows_sorted.shape[0] else offset - 1
    return rows_sorted[start : start + 2], offset - start


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
    num_experts, inter, hidden_size = w_up.shape
    if num_tokens == 0:
        return x.new_zeros(0, hidden_size) + (w_up.sum() + w_down.sum()) * 0
    # group the (token, slot) pairs by expert with one stable sort instead of a mask per expert
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    rows_sorted = x.index_select(0, order // top_k)
    up_weights = (w_up,) if w_gate is None else (w_gate, w_up)  # gate and up: one fused GEMM
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, topk_weights, w_gate, w_up, w_down)
    )
    packed_up = None if grad else packed_experts(*up_weights)
    packed_down = None if packed_up is None else packed_experts(w_down)
    up_cols = inter * len(up_weights)
    outs, offset = [], 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        if packed_down is not None:
            rows, first = _expert_rows(rows_sorted, offset, count)
            gate_up = linear_prepacked(rows.contiguous(), packed_up[expert])
            # packed_experts pads a 1-column weight (relu2 at inter 1, or hidden 1) with a zero
            # row up to ONEDNN_MIN_COLS; its extra output column must not reach the next GEMM or
            # the slot sum (columns never interact, so the slice keeps the unpadded path's bits)
            if gate_up.shape[1] != up_cols:
                gate_up = gate_up[:, :up_cols].contiguous()
            out = linear_prepacked(_activate(gate_up, inter, activation, x.dtype), packed_down[expert])
            if out.shape[1] != hidden_size:
                out = out[:, :hidden_size]
            outs.append(out[first : first + count] if first or out.shape[0] != count else out)
        else:  # autograd, or weights that cannot be cached: the same GEMMs on the plain weights
            rows = rows_sorted[offset : offset + count]
            fused = torch.cat([w[expert] for w in up_weights]) if len(up_weights) > 1 else w_up[expert]
            gate_up = row_invariant_linear(rows, fused)
            outs.append(row_invariant_linear(_activate(gate_up, inter, activation, x.dtype), w_down[expert]))
        offset += count
    # weighted sum over slots in fp32, in ascending slot j: sum_j w_j * out_j, rounded once
    products = torch.cat(outs).float() * topk_weights.reshape(-1)[order].float()[:, None]
    slot_out = torch.empty_like(products).index_copy_(0, order, products).view(num_tokens, top_k, hidden_size)
    if grad:
        total = slot_out[:, 0]
        for j in range(1, top_k):
            total = total + slot_out[:, j]
    else:
        total = slot_out[:, 0].clone()
        for j in range(1, top_k):
            total.add_(slot_out[:, j])
    return total.to(x.dtype)
