"""Accuracy of the aligned dense ops against float64 references, plus sampler semantics.

Tolerances (stated per test, relative to the natural scale of each quantity):
- fp32 GEMM:   |err| <= 1e-5 * sqrt(K) * max|x| * max|w| + 1e-6
- bf16 GEMM:   |err| <= 2e-2 * sqrt(K) * max|x| * max|w|  (inputs rounded to bf16 first, so the
               reference uses the same rounded inputs; output rounding is 2^-8 relative)
- fp32 norms / activations / rope: rtol 1e-5, atol 1e-6; bf16 output: rtol 1.6e-2, atol 1e-2
- logprobs (fp32 head + log_softmax): atol 1e-4 for |logit| <= ~10
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromismatch.kernels import get_kernels

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


def _randn(shape, dtype=torch.float32, seed=0, scale=1.0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _gemm_bound(x, w, dtype):
    k = x.shape[-1]
    scale = x.double().abs().max() * w.double().abs().max()
    return (1e-5 if dtype == torch.float32 else 2e-2) * math.sqrt(k) * scale + 1e-6


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 20),
    k=st.integers(1, 512),
    n=st.integers(1, 200),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_linear_matches_float64(m, k, n, dtype, seed):
    x, w, b = _randn((m, k), dtype, seed), _randn((n, k), dtype, seed + 1), _randn((n,), dtype, seed + 2)
    out = ALIGNED.linear(x, w, b)
    ref = x.double() @ w.double().T + b.double()
    assert out.dtype == dtype
    assert (out.double() - ref).abs().max() <= _gemm_bound(x, w, dtype) + ref.abs().max() * 2**-8 * (
        dtype == torch.bfloat16
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_parallel_matches_float64(dtype):
    x, w = _randn((7, 512), dtype, 1), _randn((96, 512), dtype, 2)
    ref = x.double() @ w.double().T
    out = ALIGNED.row_parallel_linear(x, w, virtual_shards=8)
    assert (out.double() - ref).abs().max() <= _gemm_bound(x, w, dtype) + ref.abs().max() * 2**-7 * (
        dtype == torch.bfloat16
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h", [64, 1000, 40000])
def test_rms_norm_matches_float64(dtype, h):
    x, w = _randn((5, h), dtype, 0, 3.0), _randn((h,), dtype, 1)
    xd = x.double()
    ref = w.double() * (xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(ALIGNED.rms_norm(x, w, 1e-6).double(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_rms_norm_matches_float64(dtype):
    x, g, w = _randn((6, 128), dtype, 0), _randn((6, 128), dtype, 1, 3.0), _randn((128,), dtype, 2)
    h = x.double() * (g.double() * torch.sigmoid(g.double()))
    grouped = h.reshape(6, 4, 32)
    ref = (grouped / torch.sqrt((grouped**2).mean(-1, keepdim=True) + 1e-5)).reshape(6, 128) * w.double()
    torch.testing.assert_close(ALIGNED.gated_rms_norm(x, g, w, 1e-5, 32).double(), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_float64(dtype, interleaved):
    t, heads, half = 9, 3, 16
    x = _randn((t, heads, 2 * half), dtype, 0)
    pos = torch.tensor([0, 1, 2, 17, 100, 511, 1000, 4095, 8191])
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = pos.double()[:, None] * inv_freq.double()[None, :]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    xd = x.double()
    if interleaved:
        x1, x2 = xd[..., 0::2], xd[..., 1::2]
        ref = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).flatten(-2)
    else:
        x1, x2 = xd[..., :half], xd[..., half:]
        ref = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
    # fp32 angles at position 8191 carry ~1e-3 rad relative rounding of pos*inv_freq: atol 1e-3
    tol = dict(rtol=1e-5, atol=1e-3) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(ALIGNED.rope(x, pos, inv_freq, interleaved).double(), ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_and_relu2_match_float64(dtype):
    g, u = _randn((4, 300), dtype, 0, 6.0), _randn((4, 300), dtype, 1)
    gd, ud = g.double(), u.double()
    torch.testing.assert_close(ALIGNED.silu_mul(g, u).double(), gd * torch.sigmoid(gd) * ud, **TOL[dtype])
    torch.testing.assert_close(ALIGNED.relu2(g).double(), torch.relu(gd) ** 2, **TOL[dtype])


def test_silu_extreme_inputs_are_finite():
    g = torch.tensor([[-1000.0, -100.0, -0.0, 0.0, 100.0, 1000.0]])
    out = ALIGNED.silu_mul(g, torch.ones_like(g))
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 4:], g[0, 4:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lm_head_log_softmax_match_float64(dtype):
    hidden, w = _randn((5, 256), dtype, 0), _randn((1000, 256), dtype, 1, 0.1)
    logits = ALIGNED.lm_head(hidden, w)
    assert logits.dtype == torch.float32
    ref = hidden.double() @ w.double().T
    assert (logits.double() - ref).abs().max() <= 1e-5 * 16 * ref.abs().max()
    lp = ALIGNED.log_softmax(logits)
    torch.testing.assert_close(lp.double(), torch.log_softmax(ref, -1), rtol=0, atol=1e-4)


# ---- processed_log_softmax semantics -----------------------------------------------------
def _pls(logits, temp, k, p):
    n = logits.shape[0]
    params = torch.full((n,), temp), torch.full((n,), k), torch.full((n,), p)
    return ALIGNED.processed_log_softmax(logits, *params)


def test_processed_unfiltered_is_plain_log_softmax_of_scaled_logits():
    logits = _randn((3, 77), seed=0, scale=3.0)
    assert torch.equal(_pls(logits, 1.0, 0, 1.0), torch.log_softmax(logits, -1))
    assert torch.equal(_pls(logits, 0.5, -1, 1.0), torch.log_softmax(logits / 0.5, -1))


def test_processed_greedy_one_hot_with_lowest_id_on_ties():
    logits = torch.tensor([[1.0, 5.0, 5.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    out = _pls(logits, 0.0, 0, 1.0)
    expected = torch.tensor([[-math.inf, 0.0, -math.inf, -math.inf], [0.0, -math.inf, -math.inf, -math.inf]])
    assert torch.equal(out, expected)


def test_processed_top_k_ties_break_by_lower_id():
    logits = torch.tensor([[3.0, 1.0, 3.0, 3.0, 0.0]])
    out = _pls(logits, 1.0, 2, 1.0)
    assert torch.isfinite(out[0]).tolist() == [True, False, True, False, False]
    torch.testing.assert_close(out[0, [0, 2]], torch.full((2,), math.log(0.5)), rtol=0, atol=1e-6)


def test_processed_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert torch.isfinite(_pls(logits, 1.0, 0, 0.5)[0]).tolist() == [True, False, False, False]
    assert torch.isfinite(_pls(logits, 1.0, 0, 0.79)[0]).tolist() == [True, True, False, False]
    assert torch.isfinite(_pls(logits, 1.0, 0, 0.81)[0]).tolist() == [True, True, True, False]
    out = _pls(logits, 1.0, 0, 0.81)
    torch.testing.assert_close(out.exp().sum(), torch.tensor(1.0), rtol=0, atol=1e-6)
    torch.testing.assert_close(out[0, :3].exp(), probs[0, :3] / 0.95, rtol=1e-5, atol=1e-6)


def test_processed_top_k_then_top_p_order_and_float64_reference():
    logits = _randn((4, 200), seed=5, scale=2.0)
    out = _pls(logits, 0.7, 30, 0.8)
    ld = logits.double() / 0.7
    for row in range(4):
        order = torch.sort(ld[row], descending=True, stable=True).indices[:30]
        probs = torch.softmax(ld[row, order], -1)
        keep = order[(torch.cumsum(probs, 0) - probs) < 0.8]
        ref = torch.full((200,), -math.inf, dtype=torch.float64)
        ref[keep] = torch.log_softmax(ld[row, keep], -1)
        assert torch.equal(torch.isfinite(out[row]), torch.isfinite(ref))
        torch.testing.assert_close(out[row, keep].double(), ref[keep], rtol=0, atol=1e-5)


def test_processed_default_set_shares_the_definition():
    logits = _randn((5, 120), seed=1, scale=2.0)
    t = torch.tensor([0.0, 1.0, 0.6, 1.0, 2.0])
    k = torch.tensor([0, 10, 0, 3, 50])
    p = torch.tensor([1.0, 0.9, 0.7, 1.0, 0.95])
    assert torch.equal(
        ALIGNED.processed_log_softmax(logits, t, k, p), DEFAULT.processed_log_softmax(logits, t, k, p)
    )


@pytest.mark.parametrize(
    "temp, k, p, match",
    [
        (-1.0, 0, 1.0, "temperature"),
        (math.nan, 0, 1.0, "temperature"),
        (1.0, 0, 0.0, "top_p"),
        (1.0, 0, 1.5, "top_p"),
    ],
)
def test_processed_bad_params_raise(temp, k, p, match):
    with pytest.raises(ValueError, match=match):
        _pls(torch.zeros(2, 5), temp, k, p)


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="top_k"):
        ALIGNED.processed_log_softmax(torch.zeros(2, 5), torch.ones(2), torch.zeros(3), torch.ones(2))
    with pytest.raises(ValueError, match="does not match"):
        ALIGNED.linear(torch.zeros(2, 5), torch.zeros(3, 4))
    with pytest.raises(TypeError, match="dtype"):
        ALIGNED.linear(torch.zeros(2, 4), torch.zeros(3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="group_size"):
        ALIGNED.gated_rms_norm(torch.zeros(2, 6), torch.zeros(2, 6), torch.ones(6), 1e-5, 4)


def test_linear_is_differentiable():
    x = _randn((3, 16), seed=0).requires_grad_()
    w = _randn((5, 16), seed=1).requires_grad_()
    ALIGNED.linear(x, w).square().sum().backward()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.linear(xr, wr).square().sum().backward()
    # same math, different GEMM libraries and summation orders: fp32 rounding only (K = 16)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_are_differentiable_and_forward_bits_match_no_grad(dtype):
    # the trainer runs these with autograd on; its forward must equal the engine's no-grad bits
    x = _randn((3, 64), dtype, 0)
    g = _randn((3, 64), dtype, 1, 3.0)
    w = _randn((64,), dtype, 2)
    head = _randn((50, 64), dtype, 3, 0.2)
    ops = {
        "silu_mul": lambda a, b: ALIGNED.silu_mul(a, b),
        "gated_rms_norm": lambda a, b: ALIGNED.gated_rms_norm(a, b, w, 1e-5, 16),
        "rms_norm": lambda a, b: ALIGNED.rms_norm(a + b, w, 1e-6),
        "logprobs": lambda a, b: ALIGNED.log_softmax(ALIGNED.lm_head(a * b, head)),
    }
    for name, op in ops.items():
        with torch.no_grad():
            expected = op(x, g)
        xa, ga = x.clone().requires_grad_(), g.clone().requires_grad_()
        out = op(xa, ga)
        assert torch.equal(out.detach(), expected), name
        out.float().sum().backward()
        assert xa.grad is not None and ga.grad is not None and torch.isfinite(xa.grad).all(), name


def test_processed_logprobs_with_greedy_rows_are_differentiable():
    # the greedy rows used to be written into log_softmax's output in place, which autograd
    # rejected at backward ("modified by an inplace operation")
    for kernels in (get_kernels("aligned"), get_kernels("default")):
        logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
        temperature = torch.tensor([0.0, 1.0, 0.7])
        top_k, top_p = torch.zeros(3, dtype=torch.int64), torch.ones(3)
        out = kernels.processed_log_softmax(logits, temperature, top_k, top_p)
        out[1:].sum().backward()
        assert torch.isfinite(logits.grad).all() and torch.equal(logits.grad[0], torch.zeros(11))


def test_processed_reused_parameter_tensors_are_never_served_stale():
    """processed_log_softmax keeps what it derived from the last parameter values (a decode loop
    passes the same ones every step). Any change to them -- in place, through ``.data`` (no version
    bump), new tensors -- must give exactly what a fresh computation gives, a bad value must still
    raise, and a plan built under inference mode must not reach autograd."""
    from zeromismatch.kernels.aligned import dense

    logits = _randn((4, 60), seed=7, scale=2.0)
    t = torch.tensor([1.0, 0.0, 0.5, 1.0])
    k = torch.tensor([0, 0, 5, 0])
    p = torch.tensor([1.0, 1.0, 1.0, 0.8])

    def fresh(rows=None):
        dense._last_plan = None
        rows = logits if rows is None else rows
        return ALIGNED.processed_log_softmax(rows, t.clone(), k.clone(), p.clone())

    first = ALIGNED.processed_log_softmax(logits, t, k, p)
    assert torch.equal(first, fresh())
    assert torch.equal(ALIGNED.processed_log_softmax(logits, t, k, p), first)  # served from the plan
    edits = [
        lambda: t.__setitem__(1, 0.7),  # in place: bumps the version
        lambda: k.__setitem__(0, 3),
        lambda: p.__setitem__(0, 0.5),
        lambda: t.data.fill_(0.0),  # through .data: no version bump
        lambda: setattr(k, "data", torch.tensor([2, 0, 1, 7])),
        lambda: p.data.copy_(torch.tensor([0.9, 1.0, 0.3, 1.0])),
    ]
    for edit in edits:
        ALIGNED.processed_log_softmax(logits, t, k, p)
        edit()
        assert torch.equal(ALIGNED.processed_log_softmax(logits, t, k, p), fresh())
    # the same parameters with other logits
    other = _randn((4, 60), seed=8)
    ALIGNED.processed_log_softmax(logits, t, k, p)
    assert torch.equal(ALIGNED.processed_log_softmax(other, t, k, p), fresh(other))
    # a plan built under inference mode, then a call that needs a gradient
    with torch.inference_mode():
        ALIGNED.processed_log_softmax(logits, t, k, p)
    trained = logits.clone().requires_grad_(True)
    ALIGNED.processed_log_softmax(trained, t, k, p)[:, 0].sum().backward()
    assert trained.grad is not None
    t.data[0] = -1.0  # no version bump, still refused
    with pytest.raises(ValueError, match="temperature"):
        ALIGNED.processed_log_softmax(logits, t, k, p)
