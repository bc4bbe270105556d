"""The aligned-native set's MoE routing (``kernels/native/route.py``, moe.c's ``zm_moe_route``) gives
the aligned route's weights and ids bit for bit -- softmax and sigmoid scoring, expert groups,
correction bias, normalisation and scaling -- on random scores, on scores with ties (the lower
expert wins, as a stable sort orders them), with nan and with -inf; and its gradient is the aligned
route's."""

from __future__ import annotations

import pytest
import torch

from zeromismatch.kernels.aligned import moe as aligned_moe
from zeromismatch.kernels.native import route

pytestmark = pytest.mark.native


def _logits(gen, tokens, experts, kind):
    logits = torch.randn(tokens, experts, generator=gen)
    if kind == "ties":
        logits = (logits * 2).round() / 2
    elif kind == "nan":
        logits[0, 1] = float("nan")
    elif kind == "-inf":
        logits[:, 0] = float("-inf")
    return logits


@pytest.mark.parametrize("kind", ["random", "ties", "nan", "-inf"])
@pytest.mark.parametrize("experts", [4, 8, 64])
def test_the_native_route_is_the_aligned_route_bit_for_bit(kind, experts):
    gen = torch.Generator().manual_seed(experts)
    checked = 0
    for trial in range(12):
        logits = _logits(gen, 1 + trial * 3, experts, kind)
        for scoring in ("softmax", "sigmoid"):
            for n_group, topk_group in ((1, 1), (2, 1), (4, 2)):
                if scoring == "softmax" and n_group > 1:
                    continue
                top_k = min(2 + trial % 3, topk_group * (experts // n_group))
                bias = (
                    torch.randn(experts, generator=gen) * 0.1 if scoring == "sigmoid" and trial % 2 else None
                )
                for norm, factor in ((True, 1.0), (True, 2.5), (False, 1.0), (False, 0.3)):
                    args = (top_k, scoring, norm, bias, n_group, topk_group, factor)
                    weights, ids = aligned_moe.moe_route(logits, *args)
                    native_weights, native_ids = route.moe_route(logits, *args)
                    assert torch.equal(ids, native_ids), args
                    assert torch.equal(weights.view(torch.int32), native_weights.view(torch.int32)), args
                    checked += 1
    assert checked > 100


def test_the_native_route_backward_is_the_aligned_routes():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 8, generator=gen)
    bias = torch.randn(8, generator=gen) * 0.1
    grads = []
    for op in (aligned_moe.moe_route, route.moe_route):
        x = logits.clone().requires_grad_(True)
        weights, _ = op(x, 2, "sigmoid", True, bias, 2, 1, 2.5)
        (weights * torch.arange(1.0, 3.0)).sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])
