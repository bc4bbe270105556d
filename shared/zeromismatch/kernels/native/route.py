"""Native MoE routing: the aligned ``moe_route``'s bits, its selection in C.

Why. The aligned route (``kernels/aligned/moe.py``) picks experts with stable sorts, masks and
scatters: about ten small torch ops per MoE layer (~0.1 ms of a tiny-deepseek-v3 decode step, two
of its sorts alone ~30 us each), for [tokens, 8] scores.

What. The scores are the aligned op's own (torch's softmax, or the aligned sigmoid plus the
correction bias), computed by the same torch calls; ``moe.c``'s ``zm_moe_route`` then does what the
aligned op does after them -- the group scores (one addition), stable top-k selections in
``torch.sort``'s order (nan above every number, ties to the lower index), the gather, the
left-to-right sum, the division and the scaling, each the same IEEE operation in the same order --
so the weights and ids are the aligned op's, bit for bit (tested on random, tied and non-finite
scores). The backward is the aligned op's (``_autograd.py``). Shapes it does not take (more than
``moe.c``'s ROUTE_MAX_EXPERTS experts, tensors off the CPU) run the aligned op.
"""

from __future__ import annotations

import torch

from ..aligned import moe as aligned_moe
from . import _build
from ._autograd import native_with_reference_backward

#: moe.c's ROUTE_MAX_EXPERTS
_MAX_EXPERTS = 1024


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
    """Routing weights ``[T, top_k]`` fp32 and expert ids ``[T, top_k]`` int64: the aligned route."""
    args = (top_k, scoring, norm_topk_prob, correction_bias, n_group, topk_group, routed_scaling_factor)
    num_experts = aligned_moe._check_route(
        router_logits, top_k, scoring, correction_bias, n_group, topk_group
    )
    tensors = [router_logits] + ([correction_bias] if correction_bias is not None else [])
    if num_experts > _MAX_EXPERTS or any(t.device.type != "cpu" for t in tensors):
        return aligned_moe.moe_route(router_logits, *args)

    def forward():
        with torch.no_grad():
            logits = router_logits.float()
            if scoring == "softmax":
                scores = torch.softmax(logits, dim=-1)
                choice = scores
            else:
                scores = aligned_moe.stable_sigmoid(logits)
                choice = scores + correction_bias.float() if correction_bias is not None else scores
            scores, choice = scores.contiguous(), choice.contiguous()
            tokens = scores.shape[0]
            weights = torch.empty(tokens, top_k, dtype=torch.float32)
            ids = torch.empty(tokens, top_k, dtype=torch.int64)
            status = _build.library().zm_moe_route(
                scores.data_ptr(),
                choice.data_ptr(),
                tokens,
                num_experts,
                top_k,
                n_group if scoring != "softmax" else 1,
                topk_group,
                int(bool(norm_topk_prob)),
                int(scoring != "softmax"),  # the sigmoid route's + 1e-20 in the denominator
                # (the softmax route scales only when the factor is not 1; the sigmoid one always)
                int(scoring != "softmax" or routed_scaling_factor != 1.0),
                float(routed_scaling_factor),
                weights.data_ptr(),
                ids.data_ptr(),
            )
            if status != 0:  # unreachable: the shapes were checked above
                raise RuntimeError(f"zm_moe_route refused {num_experts} experts / top_k {top_k}")
            return weights, ids

    def reference(logits_, *bias):
        return aligned_moe.moe_route(logits_, top_k, scoring, norm_topk_prob, *(bias or (None,)), *args[4:])

    return native_with_reference_backward(forward, reference, *tensors)
