"""MoE kernels: deterministic routing, batch-independent experts, accuracy vs float64.

Bitwise properties use ``torch.equal``; each has an inverse test on the default set.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.kernels import get_kernels

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _experts(gen, num_experts: int, hidden: int, inter: int, gated: bool, dtype):
    def rnd(*shape):
        return (torch.randn(*shape, generator=gen) * shape[-1] ** -0.5).to(dtype)

    w_gate = rnd(num_experts, inter, hidden) if gated else None
    return w_gate, rnd(num_experts, inter, hidden), rnd(num_experts, hidden, inter)


def _route_args(scoring: str, num_experts: int, gen) -> dict:
    if scoring == "softmax":
        return {"scoring": "softmax", "norm_topk_prob": True}
    return {
        "scoring": "sigmoid",
        "norm_topk_prob": True,
        "correction_bias": torch.rand(num_experts, generator=gen) * 0.1,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
    }


moe_shapes = st.fixed_dictionaries(
    {
        "tokens": st.integers(2, 40),
        "num_experts": st.sampled_from([8, 16]),
        "top_k": st.integers(1, 4),
        "hidden": st.sampled_from([32, 64]),
        "inter": st.sampled_from([16, 48]),
        "activation": st.sampled_from(["silu", "relu2"]),
        "scoring": st.sampled_from(["softmax", "sigmoid"]),
        "dtype": st.sampled_from(sorted(DTYPES)),
        "seed": st.integers(0, 2**16),
    }
)


@settings(max_examples=30, deadline=None)
@given(shape=moe_shapes, data=st.data())
def test_token_output_ignores_rest_of_batch(shape, data):
    gen = torch.Generator().manual_seed(shape["seed"])
    dtype, n, e = DTYPES[shape["dtype"]], shape["tokens"], shape["num_experts"]
    x = torch.randn(n, shape["hidden"], generator=gen).to(dtype)
    logits = torch.randn(n, e, generator=gen)
    weights = _experts(gen, e, shape["hidden"], shape["inter"], shape["activation"] == "silu", dtype)
    route = _route_args(shape["scoring"], e, gen)
    topk_w, topk_ids = ALIGNED.moe_route(logits, shape["top_k"], **route)
    full = ALIGNED.moe_experts(x, topk_w, topk_ids, *weights, activation=shape["activation"])
    subset = sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n), label="subset")))
    idx = torch.tensor(subset)
    sub_w, sub_ids = ALIGNED.moe_route(logits[idx], shape["top_k"], **route)
    assert torch.equal(sub_w, topk_w[idx]) and torch.equal(sub_ids, topk_ids[idx])
    part = ALIGNED.moe_experts(x[idx], sub_w, sub_ids, *weights, activation=shape["activation"])
    assert torch.equal(part, full[idx])
    # every token alone (decode of one sequence)
    one = subset[0]
    alone = ALIGNED.moe_experts(
        x[one : one + 1],
        topk_w[one : one + 1],
        topk_ids[one : one + 1],
        *weights,
        activation=shape["activation"],
    )
    assert torch.equal(alone[0], full[one])


def test_default_experts_depend_on_batch():
    found = False
    for seed in range(10):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(24, 64, generator=gen)
        topk_w, topk_ids = DEFAULT.moe_route(torch.randn(24, 8, generator=gen), 2)
        weights = _experts(gen, 8, 64, 48, True, torch.float32)
        full = DEFAULT.moe_experts(x, topk_w, topk_ids, *weights)
        alone = DEFAULT.moe_experts(x[:1], topk_w[:1], topk_ids[:1], *weights)
        if not torch.equal(alone[0], full[0]):
            found = True
            break
    assert found


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("num_experts,top_k", [(8, 2), (16, 4), (64, 8)])
def test_ties_break_by_lower_expert_index(scoring, num_experts, top_k):
    logits = torch.zeros(3, num_experts)
    logits[1, 5:] = 1.0  # ties among the raised experts
    _, ids = ALIGNED.moe_route(logits, top_k, scoring=scoring, norm_topk_prob=False)
    assert ids[0].tolist() == list(range(top_k))
    assert ids[1].tolist() == list(range(5, 5 + top_k))


def test_grouped_ties_break_by_lower_index():
    logits = torch.zeros(2, 16)
    _, ids = ALIGNED.moe_route(logits, 4, scoring="sigmoid", n_group=4, topk_group=2)
    assert ids[0].tolist() == [0, 1, 2, 3]  # groups 0 and 1 win the tie; experts 0..3 inside them


def test_default_topk_ties_are_not_index_ordered():
    broken = False
    for num_experts, top_k in [(8, 2), (16, 4), (64, 8), (128, 8)]:
        _, ids = DEFAULT.moe_route(torch.zeros(2, num_experts), top_k)
        broken |= ids[0].tolist() != list(range(top_k))
    assert broken


def _reference(x, topk_w, topk_ids, w_gate, w_up, w_down, activation):
    out = torch.zeros(x.shape, dtype=torch.float64)
    xd = x.double()
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            up = w_up[e].double() @ xd[t]
            if activation == "silu":
                g = w_gate[e].double() @ xd[t]
                h = g * torch.sigmoid(g) * up
            else:
                h = torch.relu(up) ** 2
            out[t] += topk_w[t, j].double() * (w_down[e].double() @ h)
    return out


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_accuracy_against_float64(kernels, dtype, activation):
    """fp32: |err| <= 1e-5. bf16: |err| <= 2^-6 * max|ref| (8 significant bits; the GEMM outputs, the
    hidden activation and the output are each rounded to bf16 once)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(20, 64, generator=gen).to(DTYPES[dtype])
    weights = _experts(gen, 8, 64, 48, activation == "silu", DTYPES[dtype])
    topk_w, topk_ids = kernels.moe_route(torch.randn(20, 8, generator=gen), 3)
    out = kernels.moe_experts(x, topk_w, topk_ids, *weights, activation=activation)
    ref = _reference(x, topk_w, topk_ids, *weights, activation)
    err = (out.double() - ref).abs()
    if dtype == "fp32":
        assert err.max() <= 1e-5
    else:
        assert err.max() <= 2**-6 * ref.abs().max()


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_route_accuracy_against_float64(scoring):
    """Weights within 1e-6 of float64 transformers-router math; same experts (no near-ties here)."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(50, 16, generator=gen)
    bias = torch.rand(16, generator=gen) * 0.1
    args = _route_args(scoring, 16, gen) | ({"correction_bias": bias} if scoring == "sigmoid" else {})
    w, ids = ALIGNED.moe_route(logits, 4, **args)
    ld = logits.double()
    if scoring == "softmax":
        probs = ld.softmax(-1)
        ref_ids = probs.topk(4).indices
        ref_w = probs.gather(1, ref_ids)
        ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    else:
        scores = ld.sigmoid()
        choice = (scores + bias.double()).view(50, 2, 8)
        group = choice.topk(2, -1).values.sum(-1).argmax(-1)
        masked = torch.full_like(choice, float("-inf"))
        masked[torch.arange(50), group] = choice[torch.arange(50), group]
        ref_ids = masked.view(50, 16).topk(4).indices
        ref_w = scores.gather(1, ref_ids)
        ref_w = ref_w / (ref_w.sum(-1, keepdim=True) + 1e-20) * 2.5
    assert torch.equal(ids, ref_ids)
    assert (w.double() - ref_w).abs().max() <= 1e-6


@pytest.mark.parametrize("kernels", [ALIGNED, DEFAULT], ids=["aligned", "default"])
def test_autograd_gives_same_bits_and_gradients(kernels):
    """The trainer differentiates through routing weights and experts; grad mode keeps the bits."""
    gen = torch.Generator().manual_seed(6)
    x, logits = torch.randn(12, 32, generator=gen), torch.randn(12, 8, generator=gen)
    weights = _experts(gen, 8, 32, 16, True, torch.float32)
    with torch.no_grad():
        ref = kernels.moe_experts(x, *kernels.moe_route(logits, 2), *weights)
    leaves = [t.clone().requires_grad_() for t in (x, logits, *weights)]
    out = kernels.moe_experts(leaves[0], *kernels.moe_route(leaves[1], 2), *leaves[2:])
    assert torch.equal(out, ref)
    out.square().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in leaves)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="scoring"):
        ALIGNED.moe_route(torch.randn(2, 8), 2, scoring="tanh")
    with pytest.raises(ValueError, match="top_k"):
        ALIGNED.moe_route(torch.randn(2, 8), 9)
    w_gate, w_up, w_down = torch.randn(4, 8, 16), torch.randn(4, 8, 16), torch.randn(4, 16, 8)
    ids = torch.tensor([[0, 5]])
    with pytest.raises(ValueError, match="topk_ids"):
        ALIGNED.moe_experts(torch.randn(1, 16), torch.ones(1, 2), ids, w_gate, w_up, w_down)
    with pytest.raises(ValueError, match="w_gate"):
        ALIGNED.moe_experts(torch.randn(1, 16), torch.ones(1, 2), ids.clamp(max=3), None, w_up, w_down)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("activation", ["silu", "relu2"])
@pytest.mark.parametrize("hidden,inter", [(1, 1), (1, 8), (8, 1)])
def test_one_wide_hidden_or_intermediate(dtype, activation, hidden, inter):
    """A 1-column GEMM (hidden 1, or relu2's up at inter 1) once crashed the cached-weight path: the
    packed weight's zero padding column reached the next GEMM / the slot sum. Both sets compute it;
    the aligned bits match the autograd path's and each token alone gives the batch's bits."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(5, hidden, generator=gen).to(DTYPES[dtype])
    weights = _experts(gen, 4, hidden, inter, activation == "silu", DTYPES[dtype])
    topk_w, topk_ids = ALIGNED.moe_route(torch.randn(5, 4, generator=gen), 2)
    out = ALIGNED.moe_experts(x, topk_w, topk_ids, *weights, activation=activation)
    assert out.shape == x.shape and out.dtype == x.dtype
    leaves = [w if w is None else w.clone().requires_grad_() for w in weights]
    assert torch.equal(ALIGNED.moe_experts(x, topk_w, topk_ids, *leaves, activation=activation).detach(), out)
    for t in range(5):
        one = slice(t, t + 1)
        alone = ALIGNED.moe_experts(x[one], topk_w[one], topk_ids[one], *weights, activation=activation)
        assert torch.equal(alone, out[one])
    default = DEFAULT.moe_experts(x, topk_w, topk_ids, *weights, activation=activation)
    assert default.shape == x.shape and default.dtype == x.dtype
