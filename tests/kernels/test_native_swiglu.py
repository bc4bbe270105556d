"""The aligned-native set's C SwiGLU product (swiglu.c): an element's bits do not depend on the batch,
its row's position, strides or the thread count (``torch.equal``); the AVX-512 path gives the
portable rule's bits (an ``-O0`` build, and the scalar reference in the same build), specials and the
exp clamps included; accuracy against float64 with stated tolerances; gradients are the aligned op's.
Inverses: the default set's silu_mul is not row-invariant on an unaligned buffer
(test_dense_invariance.py), and these bits differ from the pure-torch aligned op's (below), so the
two sets cannot be mixed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import NAMED_DTYPES, scaled_randn, torch_threads

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.native import NativeKernels, _build

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)

NATIVE = NativeKernels()
ALIGNED = get_kernels("aligned")
DTYPES = NAMED_DTYPES
_rand = scaled_randn
_IDS = ["fp32", "bf16"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (nan payloads compared too; ``torch.equal`` says nan != nan)."""
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _specials(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """gate values at the rule's edges (the exp clamps at -g = -87 and 88, both sides; nan; infs; zeros;
    huge; tiny) beside random ones, and up values including nan, inf and zero."""
    edges = [0.0, -0.0, 87.0, 86.9, 87.1, -88.0, -87.9, -88.1, -100.0, 100.0, 1e30, -1e30, 1e-30,
             float("nan"), float("inf"), float("-inf"), 3.0, -3.0, 0.5, -0.5]  # fmt: skip
    gen = torch.Generator().manual_seed(5)
    g = torch.cat((torch.tensor(edges), torch.randn(300, generator=gen) * 8)).to(dtype)
    u = torch.randn(g.numel(), generator=gen).to(dtype)
    u[:4] = torch.tensor([float("nan"), float("inf"), 0.0, -0.0]).to(dtype)
    # both operands nan (a nan gate with payloads and signs, -inf whose silu is nan, against nan ups
    # with other payloads): which payload survives a product depends on operand order (found in review)
    pairs = [(0x7FC00001, 0x7FC00003), (0xFFC00000, 0x7FC00000), (0xFF800000, 0x7FC00002)]
    pairs += [(0x7F800001, 0x7FC00000)]
    g_nan = torch.tensor([a for a, _ in pairs], dtype=torch.int64).to(torch.int32).view(torch.float32)
    u_nan = torch.tensor([b for _, b in pairs], dtype=torch.int64).to(torch.int32).view(torch.float32)
    g, u = torch.cat((g, g_nan.to(dtype))), torch.cat((u, u_nan.to(dtype)))
    return g.view(1, -1), u.view(1, -1)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 20),
    cols=st.integers(1, 200),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_rows_are_batch_invariant(m, cols, dtype, seed):
    """Each row alone, any sub-batch, and the halves of a fused gate/up buffer read in place give the
    full batch's bits."""
    gen = torch.Generator().manual_seed(seed)
    fused = _rand(gen, m, 2 * cols, dtype=DTYPES[dtype], scale=4.0)
    gate, up = fused[:, :cols], fused[:, cols:]
    full = NATIVE.silu_mul(gate.contiguous(), up.contiguous())
    assert full.dtype == gate.dtype and full.shape == gate.shape and full.is_contiguous()
    assert torch.equal(NATIVE.silu_mul(gate, up), full)
    for i in range(m):
        assert torch.equal(NATIVE.silu_mul(gate[i : i + 1], up[i : i + 1]), full[i : i + 1])
    lo, hi = m // 3, max(m // 3 + 1, 2 * m // 3)
    assert torch.equal(NATIVE.silu_mul(gate[lo:hi], up[lo:hi]), full[lo:hi])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_layouts_threads_and_leading_dims(dtype):
    gen = torch.Generator().manual_seed(1)
    g, u = _rand(gen, 3, 4, 37, dtype=dtype), _rand(gen, 3, 4, 37, dtype=dtype)
    flat = NATIVE.silu_mul(g.reshape(-1, 37), u.reshape(-1, 37))
    assert torch.equal(NATIVE.silu_mul(g, u), flat.view(3, 4, 37))
    gt, ut = _rand(gen, 37, 5, dtype=dtype).t(), _rand(gen, 37, 5, dtype=dtype).t()  # copied
    assert torch.equal(NATIVE.silu_mul(gt, ut), NATIVE.silu_mul(gt.contiguous(), ut.contiguous()))
    assert torch.equal(NATIVE.silu_mul(g._neg_view(), u), NATIVE.silu_mul(-g, u))
    assert torch.equal(NATIVE.silu_mul(g, u._neg_view()), NATIVE.silu_mul(g, -u))
    # overlapping rows (a sliding window, row stride 1): the output is still contiguous rows
    window = _rand(gen, 50, dtype=dtype).unfold(0, 40, 1)
    ones = torch.ones(11, 40, dtype=dtype)
    assert torch.equal(NATIVE.silu_mul(window, ones), NATIVE.silu_mul(window.contiguous(), ones))
    big_g, big_u = _rand(gen, 40, 3000, dtype=dtype, scale=3.0), _rand(gen, 40, 3000, dtype=dtype)
    with torch_threads(1):
        one = NATIVE.silu_mul(big_g, big_u)
    with torch_threads(2):
        two = NATIVE.silu_mul(big_g, big_u)
    assert torch.equal(one, two) and torch.equal(NATIVE.silu_mul(big_g[7:8], big_u[7:8]), one[7:8])


def test_O0_build_and_scalar_reference_give_the_same_bits(monkeypatch):
    """The -O0 build is the portable C (fmaf per element); the AVX-512 build (16 lanes, masked tails)
    must give its bits, nan payloads included; so must the scalar reference in the same build."""
    cases = [_specials(dtype) for dtype in DTYPES.values()]
    vectorized = [NATIVE.silu_mul(g, u) for g, u in cases]
    g32, u32 = cases[0]
    reference = torch.empty_like(g32)
    _build.library().cdll.zm_silu_mul_reference(
        g32.data_ptr(), u32.data_ptr(), g32.numel(), reference.data_ptr()
    )
    assert torch.equal(_bits(vectorized[0]), _bits(reference))
    monkeypatch.setattr(_build, "build_flags", ("-O0",))
    scalar = [NATIVE.silu_mul(g, u) for g, u in cases]
    for a, b in zip(vectorized, scalar):
        assert torch.equal(_bits(a), _bits(b))
    out = vectorized[0][0]
    assert out.isnan().any() and (out == 0).any()  # the specials were reached


def test_edges_of_the_rule():
    g = torch.tensor([[-88.5, -87.5, -200.0, 90.0, float("inf"), float("-inf"), float("nan"), 0.0]])
    out = NATIVE.silu_mul(g, torch.ones_like(g))[0]
    assert out[0].item() == 0.0 and out[0].signbit()  # -g > 88: g / inf = -0
    assert -1e-36 < out[1].item() < 0  # just inside: a tiny negative value
    assert out[2].item() == 0.0 and out[3].item() == 90.0  # exp(-90) vanishes beside 1
    assert out[4].item() == float("inf") and out[5].isnan() and out[6].isnan() and out[7].item() == 0.0


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 4e-7), (torch.bfloat16, 8e-3)], ids=["fp32", "bf16"]
)
def test_accuracy_against_float64(dtype, tol):
    """fp32: exp within ~1.2 ulp, then a division and a product (relative 4e-7 stated); bf16: one
    rounding of the fp32 result (2^-8 relative, 8e-3 stated). Plus an absolute floor for values
    near zero."""
    gen = torch.Generator().manual_seed(2)
    g, u = _rand(gen, 64, 512, dtype=dtype, scale=6.0), _rand(gen, 64, 512, dtype=dtype)
    g64, u64 = g.double(), u.double()
    exact = g64 / (1 + torch.exp(-g64)) * u64
    err = (NATIVE.silu_mul(g, u).double() - exact).abs()
    assert (err <= tol * exact.abs() + 1e-30).all()


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"]
)
def test_gradients_are_the_aligned_ops(dtype, tol):
    gen = torch.Generator().manual_seed(3)
    g, u = _rand(gen, 6, 40, dtype=dtype, scale=3.0), _rand(gen, 6, 40, dtype=dtype)
    grads = []
    for ks in (NATIVE, ALIGNED):
        gg, uu = g.clone().requires_grad_(), u.clone().requires_grad_()
        out = ks.silu_mul(gg, uu)
        out.float().pow(2).sum().backward()
        grads.append((gg.grad, uu.grad, out.detach()))
    for a, b in zip(grads[0][:2], grads[1][:2]):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
    with torch.no_grad():
        assert torch.equal(NATIVE.silu_mul(g, u), grads[0][2])  # the trainer's forward: engine bits


def test_native_and_pure_torch_aligned_bits_differ():
    gen = torch.Generator().manual_seed(4)
    g, u = _rand(gen, 16, 256, scale=4.0), _rand(gen, 16, 256)
    assert not torch.equal(NATIVE.silu_mul(g, u), ALIGNED.silu_mul(g, u))


def test_other_dtypes_bad_input_and_devices():
    g64, u64 = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(NATIVE.silu_mul(g64, u64), ALIGNED.silu_mul(g64, u64))
    scalar = torch.tensor(1.5)
    assert torch.equal(NATIVE.silu_mul(scalar, scalar), ALIGNED.silu_mul(scalar, scalar))
    assert NATIVE.silu_mul(torch.ones(0, 8), torch.ones(0, 8)).shape == (0, 8)
    with pytest.raises(ValueError, match="gate shape"):
        NATIVE.silu_mul(torch.ones(2, 8), torch.ones(2, 4))
    with pytest.raises(TypeError, match="gate dtype"):
        NATIVE.silu_mul(torch.ones(2, 8), torch.ones(2, 8, dtype=torch.bfloat16))
    for g, u in (
        (torch.ones(2, 8, device="meta"), torch.ones(2, 8)),
        (torch.ones(0, 8), torch.ones(0, 8, device="meta")),
    ):
        with pytest.raises(ValueError, match="CPU"):
            NATIVE.silu_mul(g, u)
