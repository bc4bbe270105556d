"""The aligned-native set's C GEMM (linear, lm_head, row-parallel linear): a row's bits do not depend on
the batch (any M, any position), the thread count, the output columns requested or the TP
degree (``torch.equal``); an ``-O0`` build (portable C, which emulates vdpbf16ps) gives the bits
of the AVX-512 build; accuracy against float64 with stated tolerances; gradients are the aligned
op's. The default set breaking row invariance is shown in test_dense_invariance.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import NAMED_DTYPES, scaled_randn, torch_threads

from zeromismatch.kernels import collectives, get_kernels
from zeromismatch.kernels.native import NativeKernels, _build
from zeromismatch.kernels.native import gemm as native_gemm

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)

NATIVE = NativeKernels()
ALIGNED = get_kernels("aligned")
DTYPES = NAMED_DTYPES
_rand = scaled_randn


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 150),
    k=st.integers(1, 130),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_lm_head_rows_are_batch_invariant(m, n, k, dtype, seed):
    """Each row alone, and every contiguous sub-batch, gives the full batch's bits (odd K in bf16
    takes the fp32 rule; both sides take the same one)."""
    gen = torch.Generator().manual_seed(seed)
    h, w = _rand(gen, m, k, dtype=DTYPES[dtype]), _rand(gen, n, k, dtype=DTYPES[dtype], scale=0.2)
    full = NATIVE.lm_head(h, w)
    assert full.dtype == torch.float32 and full.shape == (m, n)
    for i in range(m):
        assert torch.equal(NATIVE.lm_head(h[i : i + 1], w), full[i : i + 1])
    lo, hi = m // 3, max(m // 3 + 1, 2 * m // 3)
    assert torch.equal(NATIVE.lm_head(h[lo:hi], w), full[lo:hi])
    out = NATIVE.linear(h, w)
    assert out.dtype == h.dtype
    for i in range(m):
        assert torch.equal(NATIVE.linear(h[i : i + 1], w), out[i : i + 1])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_linear_semantics_columns_and_bias(dtype):
    """F.linear semantics (any leading dims, bias after the rounding to x's dtype, as the aligned
    linear), a column slice of the weight (column-parallel shard) gives the slice of the output,
    and fp64 keeps the aligned op (the fp32 rule would lower its precision)."""
    gen = torch.Generator().manual_seed(9)
    x, w = _rand(gen, 3, 5, 48, dtype=dtype), _rand(gen, 80, 48, dtype=dtype, scale=0.2)
    b = _rand(gen, 80, dtype=dtype)
    out = NATIVE.linear(x, w, b)
    assert out.shape == (3, 5, 80) and out.dtype == dtype
    assert torch.equal(out, NATIVE.linear(x, w) + b)
    assert torch.equal(NATIVE.linear(x, w[16:56]), NATIVE.linear(x, w)[..., 16:56])
    ref = x.double() @ w.double().T + b.double()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ((out.double() - ref).abs().max() / ref.abs().max()) < tol
    x64, w64 = x.double(), w.double()
    assert torch.equal(NATIVE.linear(x64, w64), ALIGNED.linear(x64, w64))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_lm_head_threads_columns_and_strides(dtype):
    """1 vs 2 threads, a vocab slice (vocab-parallel shards), a 3-D input and a strided input."""
    gen = torch.Generator().manual_seed(1)
    h, w = _rand(gen, 23, 96, dtype=dtype), _rand(gen, 300, 96, dtype=dtype, scale=0.1)
    with torch_threads(1):
        one = NATIVE.lm_head(h, w)
    with torch_threads(2):
        assert torch.equal(NATIVE.lm_head(h, w), one)
    assert torch.equal(NATIVE.lm_head(h, w[70:201]), one[:, 70:201])
    assert torch.equal(NATIVE.lm_head(h.view(1, 23, 96), w), one)
    wide = _rand(gen, 23, 192, dtype=dtype)
    wide[:, ::2] = h
    assert torch.equal(NATIVE.lm_head(wide[:, ::2], w), one)


def _flush_boundary_cases(gen) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """bf16 rows whose dot-pair steps land near FLT_MIN: a normal accumulator meeting products that
    underflow, and exact results just below FLT_MIN that rounding onto the denormal grid would lift
    to FLT_MIN while vdpbf16ps (24-bit rounding, then flush) gives zero."""
    cases = [  # the first: -3 * 2^-152 + 2^-126 lies in [FLT_MIN - 2^-150, FLT_MIN)
        (torch.tensor([[-3 * 2.0**-76, 2.0**-63]]), torch.tensor([[2.0**-76, 2.0**-63]])),
        (torch.tensor([[2.0**-63, -(2.0**-76)]]), torch.tensor([[2.0**-63, 2.0**-76]])),
    ]
    for _ in range(3):  # products from 2^-152 to 2^-124: some rows underflow whole, some keep a normal sum
        x = torch.ldexp(torch.ones(4, 32), torch.randint(-76, -62, (4, 32), generator=gen))
        w = torch.ldexp(torch.ones(24, 32), torch.randint(-76, -62, (24, 32), generator=gen))
        x = x * torch.where(torch.rand(4, 32, generator=gen) < 0.5, -1.0, 1.0)
        cases.append((x * (1 + torch.randint(0, 8, (4, 32), generator=gen) / 8), w))
    return [(x.bfloat16(), w.bfloat16()) for x, w in cases]


def test_O0_build_gives_the_same_bits(monkeypatch):
    """The -O0 build is the portable C (no FMA or vdpbf16ps instructions: fmaf and an emulated
    dot pair); it must give the AVX-512 build's bits, also at the flush-to-zero boundary."""
    gen = torch.Generator().manual_seed(2)
    cases = []
    for dtype in DTYPES.values():
        h, w = _rand(gen, 13, 70, dtype=dtype), _rand(gen, 37, 70, dtype=dtype, scale=0.3)
        x, wr = _rand(gen, 9, 64, dtype=dtype), _rand(gen, 40, 64, dtype=dtype, scale=0.3)
        cases.append((h, w, x, wr))
    boundary = _flush_boundary_cases(gen)

    def run():
        outs = [
            (NATIVE.lm_head(h, w), NATIVE.row_parallel_linear(x, wr), NATIVE.linear(h, w))
            for h, w, x, wr in cases
        ]
        return outs + [(NATIVE.lm_head(x, w),) for x, w in boundary]

    vectorized = run()
    monkeypatch.setattr(_build, "build_flags", ("-O0",))
    scalar = run()
    monkeypatch.undo()
    for vector_outs, scalar_outs in zip(vectorized, scalar):
        for a, b in zip(vector_outs, scalar_outs):
            assert torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())
    # the boundary cases are not vacuous: the first one flushes to zero (where fmaf on the
    # denormal grid alone would give FLT_MIN), and the random ones mix zero and non-zero outputs
    assert vectorized[len(cases)][0].item() == 0.0
    mixed = torch.cat([out[0].flatten() for out in vectorized[len(cases) + 2 :]])
    assert (mixed == 0).any() and (mixed != 0).any()


def test_autograd_forward_gives_the_inference_bits():
    """The trainer's forward (autograd, weights being trained) and the engine's (no grad, cached
    packed weights) give the same bits: only the backward differs."""
    gen = torch.Generator().manual_seed(11)
    for dtype in DTYPES.values():
        x, w = _rand(gen, 7, 64, dtype=dtype), _rand(gen, 96, 64, dtype=dtype, scale=0.2)
        with torch.no_grad():
            plain = (NATIVE.linear(x, w), NATIVE.lm_head(x, w), NATIVE.row_parallel_linear(x, w[:, :64]))
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        trained = (NATIVE.linear(xg, wg), NATIVE.lm_head(xg, wg), NATIVE.row_parallel_linear(xg, wg[:, :64]))
        for a, b in zip(plain, trained):
            assert torch.equal(a, b.detach())


def test_engine_call_gives_the_general_paths_bits(monkeypatch):
    """linear and row_parallel_linear take a shorter route for the engine's call (no autograd, 2-D
    rows in place, cached weight): it must give the general route's bits, and must be taken."""
    from zeromismatch.kernels.native import gemm

    taken = []
    engine_call = gemm._engine_call
    monkeypatch.setattr(gemm, "_engine_call", lambda *a, **k: taken.append(engine_call(*a, **k)) or taken[-1])
    gen = torch.Generator().manual_seed(12)
    for dtype in DTYPES.values():
        for m in (1, 7, 13):
            x, w = _rand(gen, m, 64, dtype=dtype), _rand(gen, 40, 64, dtype=dtype, scale=0.2)
            with torch.no_grad():
                fast = (NATIVE.linear(x, w), NATIVE.row_parallel_linear(x, w))
            general = (  # autograd takes the general route (same forward bits)
                NATIVE.linear(x.clone().requires_grad_(), w).detach(),
                NATIVE.row_parallel_linear(x.clone().requires_grad_(), w).detach(),
            )
            assert all(torch.equal(a, b) for a, b in zip(fast, general)), (dtype, m)
    # the 12 no-grad calls took it; the 12 autograd calls were sent on to the general route
    assert sum(out is not None for out in taken) == 12 and sum(out is None for out in taken) == 12


def test_weights_being_trained_are_not_cached_and_updates_are_seen():
    from zeromismatch.kernels.aligned import gemm as aligned_gemm

    gen = torch.Generator().manual_seed(12)
    x, w = _rand(gen, 3, 32), _rand(gen, 40, 32, scale=0.2).requires_grad_()
    aligned_gemm.clear_packed_weights()
    NATIVE.lm_head(x.requires_grad_(), w).sum().backward()
    NATIVE.linear(x, w).sum().backward()
    assert aligned_gemm._PACKED.nbytes == 0  # the trainer's forward left nothing behind
    with torch.no_grad():
        before = NATIVE.linear(x, w)
        w.mul_(2)  # an in-place update bumps the version: the engine sees the new weight
        assert torch.equal(NATIVE.linear(x, w), (before.double() * 2).float())


def test_lazy_negated_weight_view_is_not_served_the_plain_weights_panels():
    gen = torch.Generator().manual_seed(13)
    h, w = _rand(gen, 4, 48), _rand(gen, 50, 48, scale=0.2)
    plain = NATIVE.lm_head(h, w)
    assert torch.equal(NATIVE.lm_head(h, torch._neg_view(w)), -plain)
    assert torch.equal(NATIVE.linear(h, torch._neg_view(w)), -NATIVE.linear(h, w))
    # the refusal lives in the shared packed-weight cache: the aligned GEMM is covered too
    assert torch.equal(ALIGNED.linear(h, torch._neg_view(w)), ALIGNED.linear(h, -w))


def test_pieces_and_weights_are_checked():
    gen = torch.Generator().manual_seed(14)
    x, w = _rand(gen, 2, 10), _rand(gen, 8, 10)
    for pieces in (3, 0, -1, 11):
        with pytest.raises(ValueError, match="pieces"):
            native_gemm.panel_gemm(x, w, pieces, reduce=True)
    with pytest.raises(ValueError, match="weight must be"):
        native_gemm.panel_gemm(x, _rand(gen, 8, 16))
    panels, _ = native_gemm._pack(w.bfloat16())
    bad = [
        native_gemm.PackedWeight(panels, 8, 10, torch.float16),  # not a rule dtype
        native_gemm.PackedWeight(panels, 200, 10, torch.bfloat16),  # more columns than panels
        native_gemm.PackedWeight(panels, 8, 12, torch.bfloat16),  # another K
    ]
    for packed in bad:
        with pytest.raises(ValueError, match="packed weight"):
            native_gemm.panel_gemm(x.bfloat16(), packed)
    with pytest.raises(ValueError, match="packed weight"):  # odd bf16 pieces
        native_gemm.panel_gemm(x.bfloat16(), native_gemm.PackedWeight(panels, 8, 10, torch.bfloat16), 2)


def test_many_virtual_shards_take_the_python_tree():
    """More pieces than gemm.c sums itself: the same tree in torch, the same bits."""
    gen = torch.Generator().manual_seed(15)
    x, w = _rand(gen, 5, 64), _rand(gen, 24, 64, scale=0.2)
    many = NATIVE.row_parallel_linear(x, w, virtual_shards=32)
    pieces = native_gemm.panel_gemm(x, w, 32)
    assert torch.equal(many, collectives.tree_sum(list(pieces.unbind(0))))
    assert torch.equal(NATIVE.row_parallel_linear(x[2:3], w, virtual_shards=32), many[2:3])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_row_parallel_is_layout_invariant(dtype):
    """TP 1 (partials and tree fused in C) == TP 2 and TP 4 (each rank's pieces, gathered, the
    same tree), and each piece's partial == a call on that piece alone; rows batch-invariant."""
    gen = torch.Generator().manual_seed(3)
    x, w = _rand(gen, 19, 256, dtype=dtype), _rand(gen, 72, 256, dtype=dtype, scale=0.1)
    tp1 = NATIVE.row_parallel_linear(x, w)
    pieces = native_gemm._native_pieces(x, w, 4)
    for j, piece in enumerate(pieces):
        alone = native_gemm._native_pieces(x[:, 64 * j : 64 * (j + 1)], w[:, 64 * j : 64 * (j + 1)], 1)[0]
        assert torch.equal(piece, alone)
    for degree in (2, 4):
        per_rank = [
            native_gemm._native_pieces(*collectives.shard_rows(x, w, degree, r), 4 // degree)
            for r in range(degree)
        ]
        gathered = collectives.tree_sum([p.float() for rank in per_rank for p in rank])
        assert torch.equal(gathered.to(dtype), tp1)
    for i in (0, 7, 18):
        assert torch.equal(NATIVE.row_parallel_linear(x[i : i + 1], w), tp1[i : i + 1])


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2e-6)], ids=["fp32", "bf16"])
def test_lm_head_accuracy_against_float64(dtype, tol):
    """Relative to max |logit|: fp32 sums of exact products (bf16) or fp32 FMAs, K = 1024
    sequential steps: ~K * 2^-24 / sqrt(K) typical, bounded well under 2e-6 here."""
    gen = torch.Generator().manual_seed(4)
    h, w = _rand(gen, 8, 1024, dtype=dtype), _rand(gen, 500, 1024, dtype=dtype, scale=0.05)
    ref = h.double() @ w.double().T
    err = (NATIVE.lm_head(h, w).double() - ref).abs().max() / ref.abs().max()
    assert err < tol


def test_row_parallel_accuracy_against_float64():
    """fp32: partials and tree in fp32 (1e-6 relative); bf16: partials rounded to bf16 as the
    aligned set's are, so bf16 rounding (2^-8 relative per partial)."""
    gen = torch.Generator().manual_seed(5)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        x, w = _rand(gen, 10, 512, dtype=dtype), _rand(gen, 64, 512, dtype=dtype, scale=0.05)
        ref = x.double() @ w.double().T
        err = (NATIVE.row_parallel_linear(x, w).double() - ref).abs().max() / ref.abs().max()
        assert err < tol


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quant_linear_is_the_native_linear_of_the_dequantized_weight(fmt):
    """Weight-only: the aligned set's cached dequantization, then the native GEMM; rows stay
    batch-invariant (no scale spans the batch)."""
    from zeromismatch.kernels.quant import cached_dequantize, quantize_fp8, quantize_nvfp4

    gen = torch.Generator().manual_seed(10)
    x, w = _rand(gen, 9, 64), _rand(gen, 48, 64, scale=0.1)
    qweight = quantize_fp8(w) if fmt == "fp8" else quantize_nvfp4(w)
    out = NATIVE.quant_linear(x, qweight)
    assert torch.equal(out, NATIVE.linear(x, cached_dequantize(qweight, x.dtype)))
    for i in range(9):
        assert torch.equal(NATIVE.quant_linear(x[i : i + 1], qweight), out[i : i + 1])
    with torch.inference_mode():  # panels cached on the quantized tensors: same bits
        assert torch.equal(NATIVE.quant_linear(x, qweight), out)
    xb = x.bfloat16()
    bias = _rand(gen, 48, dtype=torch.bfloat16)
    expected = NATIVE.linear(xb, cached_dequantize(qweight, xb.dtype), bias)
    assert torch.equal(NATIVE.quant_linear(xb, qweight, bias), expected)
    with pytest.raises(ValueError, match="bias"):
        NATIVE.quant_linear(x, qweight, torch.zeros(47))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        NATIVE.quant_linear(x, w)


@pytest.mark.parametrize(
    "dtype, tol",
    [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 3e-3)],
    ids=["fp32", "bf16", "fp16"],
)
def test_gradients_are_the_aligned_ops(dtype, tol):
    """The written-out backward against the aligned set's (autograd through its GEMMs), in each
    dtype's own precision (relative to the largest gradient)."""
    gen = torch.Generator().manual_seed(6)
    h, w = _rand(gen, 2, 3, 64, dtype=dtype), _rand(gen, 50, 64, dtype=dtype, scale=0.1)
    grads = []
    for kernels in (NATIVE, ALIGNED):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        loss = kernels.lm_head(hh, ww).square().sum()
        loss = loss + kernels.row_parallel_linear(hh, ww[:, :64]).float().sum()
        loss = loss + kernels.linear(hh, ww).float().sin().sum()
        loss.backward()
        assert hh.grad.dtype == dtype and ww.grad.dtype == dtype
        grads.append((hh.grad, ww.grad))
    for native, aligned in zip(*grads):
        scale = aligned.float().abs().max()
        assert ((native.float() - aligned.float()).abs().max() / scale) < tol


def test_fp16_takes_the_fp32_rule_and_rounds_once():
    """fp16 is upcast exactly to fp32; the linear rounds once to fp16; row-parallel partials are
    rounded to fp16 and summed by the same tree (in torch: gemm.c rounds only to bf16)."""
    gen = torch.Generator().manual_seed(16)
    x, w = _rand(gen, 5, 64, dtype=torch.float16), _rand(gen, 24, 64, dtype=torch.float16, scale=0.2)
    assert torch.equal(NATIVE.linear(x, w), NATIVE.linear(x.float(), w.float()).half())
    pieces = native_gemm.panel_gemm(x.float(), w.float(), 4).half().float()
    assert torch.equal(NATIVE.row_parallel_linear(x, w), collectives.tree_sum(list(pieces.unbind(0))).half())
    assert torch.equal(NATIVE.row_parallel_linear(x[3:4], w), NATIVE.row_parallel_linear(x, w)[3:4])


def test_packed_cache_sees_data_reassignment_and_clears():
    """The packed weight is keyed by the tensor, its storage, geometry and version: reassigning
    ``.data`` (as ``Module.to`` does; it keeps the object and version) is seen, and so is a write
    that bypasses the version counter once ``clear_packed_weights()`` is called."""
    from zeromismatch.kernels.aligned.gemm import clear_packed_weights

    gen = torch.Generator().manual_seed(17)
    x, w = _rand(gen, 3, 32), _rand(gen, 24, 32, scale=0.2)
    NATIVE.linear(x, w)
    w.data = w.data.t().contiguous().t()  # same values, new storage and strides
    assert torch.equal(NATIVE.linear(x, w), NATIVE.linear(x, w.detach().clone()))
    w.data = _rand(gen, 24, 64, scale=0.2)[:, :32]  # same shape, new values and strides
    assert torch.equal(NATIVE.linear(x, w), NATIVE.linear(x, w.detach().clone()))
    head = torch.nn.Linear(32, 24, bias=False)
    NATIVE.lm_head(x, head.weight)
    head.bfloat16().float()  # a Module.to round trip: .data reassigned twice
    assert torch.equal(NATIVE.lm_head(x, head.weight), NATIVE.lm_head(x, head.weight.detach().clone()))
    before = NATIVE.linear(x, w)
    w.data.mul_(2)  # in place through .data: no version bump, so only a clear reveals it
    clear_packed_weights()
    assert torch.equal(NATIVE.linear(x, w), NATIVE.linear(x, w.detach().clone()))
    assert not torch.equal(NATIVE.linear(x, w), before)


def test_quant_linear_paths_match_the_plain_definition():
    """fp16 and bf16 with an odd K (both the fp32 rule), a 3-D x, and the autograd path."""
    from zeromismatch.kernels.quant import cached_dequantize, quantize_fp8

    gen = torch.Generator().manual_seed(18)
    for k, dtype in ((64, torch.float16), (63, torch.bfloat16), (64, torch.bfloat16)):
        qweight = quantize_fp8(_rand(gen, 40, k, scale=0.1))
        x = _rand(gen, 2, 3, k, dtype=dtype)
        expected = NATIVE.linear(x, cached_dequantize(qweight, dtype))
        assert torch.equal(NATIVE.quant_linear(x, qweight), expected)
        xg = x.clone().requires_grad_()
        out = NATIVE.quant_linear(xg, qweight)
        assert torch.equal(out.detach(), expected)
        out.float().sum().backward()
        assert xg.grad is not None and xg.grad.shape == x.shape


def test_native_and_pure_torch_aligned_bf16_bits_differ():
    """In bf16 the orders differ (pair products odd-then-even vs the upcast fp32 GEMM's k order):
    engine and trainer must run the same set. (In fp32 the rule is one ascending FMA chain per
    output, which oneDNN's fp32 brgemm also computed here: equal bits measured, not promised.)"""
    gen = torch.Generator().manual_seed(7)
    h, w = _rand(gen, 8, 256, dtype=torch.bfloat16), _rand(gen, 300, 256, dtype=torch.bfloat16, scale=0.1)
    assert not torch.equal(NATIVE.lm_head(h, w), ALIGNED.lm_head(h, w))


def test_edge_inputs():
    gen = torch.Generator().manual_seed(8)
    w = _rand(gen, 10, 16)
    assert NATIVE.lm_head(torch.empty(0, 16), w).shape == (0, 10)
    assert torch.equal(NATIVE.lm_head(torch.randn(3, 0), torch.randn(10, 0)), torch.zeros(3, 10))
    with pytest.raises(ValueError, match="lm_head"):
        NATIVE.lm_head(torch.randn(3, 15), w)
    with pytest.raises(ValueError, match="divisible"):
        NATIVE.row_parallel_linear(torch.randn(2, 18), torch.randn(4, 18))
    with pytest.raises(ValueError, match="CPU only"):
        NATIVE.lm_head(torch.empty(2, 16, device="meta"), torch.empty(10, 16, device="meta"))
    # a quantized weight, or a packed one, off the CPU: gemm.c would read its panels
    from zeromismatch.kernels.native import gemm
    from zeromismatch.kernels.quant import quantize_fp8

    qweight = quantize_fp8(_rand(gen, 8, 32))
    on_meta = dataclasses.replace(qweight, data=qweight.data.to("meta"), scales=qweight.scales.to("meta"))
    with pytest.raises(ValueError, match="CPU only"):
        NATIVE.quant_linear(torch.randn(2, 32), on_meta)
    packed = gemm.PackedWeight(gemm._packed(w, torch.float32).to("meta"), 10, 16, torch.float32)
    with pytest.raises(ValueError, match="CPU only"):
        gemm.panel_gemm(torch.randn(2, 16), packed)
    nan_row = torch.randn(2, 16)
    nan_row[1, 3] = float("nan")
    out = NATIVE.lm_head(nan_row, w)
    assert out[1].isnan().all() and out[0].isfinite().all()
