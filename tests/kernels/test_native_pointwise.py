"""The aligned-native set's C RMSNorm, gated RMSNorm and RoPE (pointwise.c): a row's bits do not
depend on the batch, its position in it, strides or the thread count (``torch.equal``); the rope is
the pure-torch aligned rope bit for bit; an ``-O0`` build gives the ``-O3 -march=native`` bits;
accuracy against float64 with stated tolerances; gradients are the aligned ops'. Inverses: the
default set's norm breaks row invariance on long rows (test_dense_invariance.py), and the native
norm's bits differ from the pure-torch aligned norm's (below), so the two sets cannot be mixed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import NAMED_DTYPES, scaled_randn, torch_threads

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.native import NativeKernels, _build, pointwise

pytestmark = pytest.mark.native  # skipped without a C compiler, except under CI (tests/conftest.py)

NATIVE = NativeKernels()
ALIGNED = get_kernels("aligned")
DTYPES = NAMED_DTYPES
_rand = scaled_randn


def _inv_freq(d: int) -> torch.Tensor:
    return 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 24),
    h=st.integers(1, 300),
    dtype=st.sampled_from(sorted(DTYPES)),
    weight_dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_rows_are_batch_invariant(m, h, dtype, weight_dtype, seed):
    """Each row alone and any sub-batch give the full batch's bits; dtype as the aligned op's."""
    gen = torch.Generator().manual_seed(seed)
    x, w = _rand(gen, m, h, dtype=DTYPES[dtype]), _rand(gen, h, dtype=DTYPES[weight_dtype])
    full = NATIVE.rms_norm(x, w, 1e-6)
    assert full.dtype == ALIGNED.rms_norm(x, w, 1e-6).dtype and full.shape == x.shape
    for i in range(m):
        assert torch.equal(NATIVE.rms_norm(x[i : i + 1], w, 1e-6), full[i : i + 1])
    lo, hi = m // 3, max(m // 3 + 1, 2 * m // 3)
    assert torch.equal(NATIVE.rms_norm(x[lo:hi], w, 1e-6), full[lo:hi])


@settings(max_examples=20, deadline=None)
@given(
    t=st.integers(1, 20),
    heads=st.integers(1, 6),
    half=st.integers(1, 40),
    interleaved=st.booleans(),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_rope_is_the_aligned_rope_bit_for_bit(t, heads, half, interleaved, dtype, seed):
    """Same fp32 angles, same cos/sin (read from the table), same products and sums: equal to the
    pure-torch aligned rope, so per token independent of the batch as that one is."""
    gen = torch.Generator().manual_seed(seed)
    x = _rand(gen, t, heads, 2 * half, dtype=DTYPES[dtype])
    positions = torch.randint(0, 3000, (t,), generator=gen)
    inv_freq = _inv_freq(2 * half)
    out = NATIVE.rope(x, positions, inv_freq, interleaved)
    assert out.dtype == x.dtype
    assert torch.equal(out, ALIGNED.rope(x, positions, inv_freq, interleaved))
    assert torch.equal(NATIVE.rope(x[-1:], positions[-1:], inv_freq, interleaved), out[-1:])


@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(1, 8),
    groups=st.integers(1, 4),
    gs=st.sampled_from([8, 16, 64]),
    dtype=st.sampled_from(sorted(DTYPES)),
    seed=st.integers(0, 2**16),
)
def test_gated_rms_norm_rows_are_batch_invariant(m, groups, gs, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x, gate = _rand(gen, m, groups * gs, dtype=DTYPES[dtype]), _rand(gen, m, groups * gs, dtype=DTYPES[dtype])
    w = _rand(gen, groups * gs, dtype=DTYPES[dtype])
    full = NATIVE.gated_rms_norm(x, gate, w, 1e-5, gs)
    assert full.dtype == ALIGNED.gated_rms_norm(x, gate, w, 1e-5, gs).dtype
    for i in range(m):
        assert torch.equal(NATIVE.gated_rms_norm(x[i : i + 1], gate[i : i + 1], w, 1e-5, gs), full[i : i + 1])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_strided_views_threads_and_long_rows(dtype):
    """The q/k heads of a fused qkv (a strided view, read in place), 3-D and 4-D inputs, a
    transposed (copied) input, a lazily negated view, and 1 vs 2 threads on rows long enough for
    the threaded path (the default set's norm splits such rows, test_dense_invariance.py)."""
    gen = torch.Generator().manual_seed(3)
    qkv, w = _rand(gen, 7, 10, 64, dtype=dtype), _rand(gen, 64, dtype=dtype)
    q = qkv[:, :6]
    assert torch.equal(NATIVE.rms_norm(q, w, 1e-6), NATIVE.rms_norm(q.contiguous(), w, 1e-6))
    four = _rand(gen, 2, 3, 5, 64, dtype=dtype)
    assert torch.equal(
        NATIVE.rms_norm(four, w, 1e-6), NATIVE.rms_norm(four.reshape(-1, 64), w, 1e-6).view(four.shape)
    )
    odd = _rand(gen, 64, 9, dtype=dtype).t()
    assert torch.equal(NATIVE.rms_norm(odd, w, 1e-6), NATIVE.rms_norm(odd.contiguous(), w, 1e-6))
    x = _rand(gen, 5, 64, dtype=dtype)
    assert torch.equal(NATIVE.rms_norm(x._neg_view(), w, 1e-6), NATIVE.rms_norm(-x, w, 1e-6))
    positions = torch.arange(7) * 5
    rope_in = qkv[:, :8]
    assert torch.equal(
        NATIVE.rope(rope_in, positions, _inv_freq(64)),
        ALIGNED.rope(rope_in.contiguous(), positions, _inv_freq(64)),
    )
    long_rows = _rand(gen, 6, 40000, dtype=dtype)
    lw = _rand(gen, 40000, dtype=dtype)
    with torch_threads(1):
        one = NATIVE.rms_norm(long_rows, lw, 1e-6)
    with torch_threads(2):
        two = NATIVE.rms_norm(long_rows, lw, 1e-6)
    assert torch.equal(one, two)
    assert torch.equal(NATIVE.rms_norm(long_rows[2:3], lw, 1e-6), one[2:3])
    # rope past the size where its C loop runs on threads (2**16 values)
    many = _rand(gen, 300, 4, 64, dtype=dtype)
    many_positions = torch.arange(300)
    with torch_threads(1):
        one = NATIVE.rope(many, many_positions, _inv_freq(64))
    with torch_threads(2):
        two = NATIVE.rope(many, many_positions, _inv_freq(64))
    assert torch.equal(one, two)
    assert torch.equal(NATIVE.rope(many[5:6], many_positions[5:6], _inv_freq(64)), one[5:6])


def test_rope_outside_the_table_and_uncached_inv_freq_run_the_aligned_rope():
    """Positions past the table, negative ones, a lazily negated positions view, fractional ones,
    an inference-mode inv_freq and one that needs a gradient (which keeps its gradient) all give
    the aligned rope's result; the table never grows."""
    gen = torch.Generator().manual_seed(4)
    x, inv_freq = _rand(gen, 3, 2, 32), _inv_freq(32)
    far = torch.tensor([5, pointwise.ROPE_TABLE_POSITIONS, 1 << 24])
    for positions in (
        far,
        torch.tensor([0, -1, 2]),
        torch.tensor([-1, -2, -3])._neg_view(),
        torch.tensor([0.5, 1.0, 2.25]),
    ):
        assert torch.equal(NATIVE.rope(x, positions, inv_freq), ALIGNED.rope(x, positions, inv_freq))
    with torch.inference_mode():
        inference_freq = _inv_freq(32)
        positions = torch.tensor([1, 2, 3])
        assert torch.equal(
            NATIVE.rope(x, positions, inference_freq), ALIGNED.rope(x, positions, inference_freq)
        )
    trained_freq = _inv_freq(32).requires_grad_()
    out = NATIVE.rope(x, torch.tensor([1, 2, 3]), trained_freq)
    assert out.requires_grad
    out.sum().backward()
    assert trained_freq.grad is not None and torch.isfinite(trained_freq.grad).all()
    with pytest.raises(ValueError, match="positions shape"):
        NATIVE.rope(x, torch.tensor([0, 1]), inv_freq)


def test_bf16_nan_and_inf_rows_have_the_aligned_bits():
    """A nan becomes bf16 0xffff as torch's vectorized cast makes it (the rope's bitwise claim holds
    for nan and inf too); the norms keep nan rows nan."""
    x = torch.tensor([[[float("nan")] * 4 + [1.0] * 4], [[float("inf")] * 8]]).bfloat16()
    positions, inv_freq = torch.tensor([3, 4]), _inv_freq(8)
    native, aligned = NATIVE.rope(x, positions, inv_freq), ALIGNED.rope(x, positions, inv_freq)
    assert torch.equal(native.view(torch.int16), aligned.view(torch.int16))


def test_rope_table_follows_in_place_inv_freq_updates():
    gen = torch.Generator().manual_seed(5)
    x, positions = _rand(gen, 4, 2, 16), torch.tensor([1, 2, 3, 400])
    inv_freq = _inv_freq(16)
    before = NATIVE.rope(x, positions, inv_freq)
    inv_freq.mul_(0.5)
    after = NATIVE.rope(x, positions, inv_freq)
    assert not torch.equal(before, after)
    assert torch.equal(after, ALIGNED.rope(x, positions, inv_freq))


def test_O0_build_gives_the_same_bits(monkeypatch):
    """The -O0 build (scalar SSE2, no vector lanes) gives the -O3 -march=native bits."""
    gen = torch.Generator().manual_seed(6)
    cases = [
        (_rand(gen, 9, 200, dtype=dtype), _rand(gen, 200, dtype=dtype), _rand(gen, 9, 200, dtype=dtype))
        for dtype in DTYPES.values()
    ]
    # denormal and huge inputs: the sum of squares underflows / overflows the same way
    cases.append((torch.tensor([[1e-30] * 40, [3e18] * 40]), torch.ones(40), torch.ones(2, 40)))

    def run():
        outs = []
        for x, w, gate in cases:
            outs.append(NATIVE.rms_norm(x, w, 1e-6))
            outs.append(NATIVE.gated_rms_norm(x, gate, w, 1e-5, 40 if x.shape[-1] == 40 else 50))
            outs.append(NATIVE.rope(x.view(x.shape[0], -1, 20), torch.arange(x.shape[0]) * 37, _inv_freq(20)))
        return outs

    vectorized = run()
    monkeypatch.setattr(_build, "build_flags", ("-O0",))
    scalar = run()
    monkeypatch.undo()
    for a, b in zip(vectorized, scalar):
        assert torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_accuracy_against_float64(dtype, tol):
    """Relative to the largest output: fp32 within a few ulp, bf16 within its rounding of the
    normalized value and of the product (two bf16 roundings, 2 * 2^-8 relative)."""
    gen = torch.Generator().manual_seed(7)
    x, w = _rand(gen, 12, 333, dtype=dtype, scale=3.0), _rand(gen, 333, dtype=dtype)
    ref = w.double() * x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    err = (NATIVE.rms_norm(x, w, 1e-6).double() - ref).abs().max() / ref.abs().max()
    assert err < tol


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_gradients_are_the_aligned_ops(dtype, tol):
    """The backward differentiates the aligned ops (their gradients, up to the forward's rounding)."""
    gen = torch.Generator().manual_seed(8)
    x, gate = _rand(gen, 2, 5, 64, dtype=dtype), _rand(gen, 2, 5, 64, dtype=dtype)
    w = _rand(gen, 64, dtype=dtype)
    positions = torch.tensor([3, 9, 27, 81, 243])
    grads = []
    for kernels in (NATIVE, ALIGNED):
        xx, gg, ww = (t.clone().requires_grad_() for t in (x, gate, w))
        loss = kernels.rms_norm(xx, ww, 1e-6).float().square().sum()
        loss = loss + kernels.gated_rms_norm(xx, gg, ww, 1e-5, 16).float().sin().sum()
        loss = loss + kernels.rope(xx.view(10, 4, 16), positions.repeat(2), _inv_freq(16)).float().cos().sum()
        loss.backward()
        grads.append((xx.grad, gg.grad, ww.grad))
    for native, aligned in zip(*grads):
        assert native.dtype == aligned.dtype
        assert ((native.float() - aligned.float()).abs().max() / aligned.float().abs().max()) < tol


def test_autograd_forward_gives_the_inference_bits():
    """The trainer's forward (under autograd) and the engine's (no grad) give the same bits."""
    gen = torch.Generator().manual_seed(9)
    x, w = _rand(gen, 6, 64), _rand(gen, 64)
    with torch.no_grad():
        engine = NATIVE.rms_norm(x, w, 1e-6), NATIVE.rope(x.view(6, 2, 32), torch.arange(6), _inv_freq(32))
    trainer = (
        NATIVE.rms_norm(x.requires_grad_(), w.requires_grad_(), 1e-6),
        NATIVE.rope(x.view(6, 2, 32), torch.arange(6), _inv_freq(32)),
    )
    for a, b in zip(engine, trainer):
        assert b.requires_grad and torch.equal(a, b.detach())


def test_native_and_pure_torch_aligned_norm_bits_differ():
    """Inverse: the two aligned sets' norms are different fixed orders, so a run must not mix them
    (engine on one, trainer on the other); a search over rows finds a difference."""
    gen = torch.Generator().manual_seed(10)
    x, w = _rand(gen, 64, 256), _rand(gen, 256)
    assert not torch.equal(NATIVE.rms_norm(x, w, 1e-6), ALIGNED.rms_norm(x, w, 1e-6))


def test_other_dtypes_and_edge_inputs_keep_the_aligned_op():
    gen = torch.Generator().manual_seed(11)
    for dtype in (torch.float64, torch.float16):
        x, w = _rand(gen, 3, 32, dtype=dtype), _rand(gen, 32, dtype=dtype)
        assert torch.equal(NATIVE.rms_norm(x, w, 1e-6), ALIGNED.rms_norm(x, w, 1e-6))
        assert torch.equal(
            NATIVE.rope(x.view(3, 2, 16), torch.arange(3), _inv_freq(16)),
            ALIGNED.rope(x.view(3, 2, 16), torch.arange(3), _inv_freq(16)),
        )
    empty = torch.empty(0, 32)
    assert NATIVE.rms_norm(empty, torch.ones(32), 1e-6).shape == (0, 32)
    for kernels in (NATIVE, ALIGNED):
        assert kernels.gated_rms_norm(empty, empty, torch.ones(32), 1e-6, 8).shape == (0, 32)
        with pytest.raises(ValueError, match="scalar"):
            kernels.rms_norm(torch.tensor(1.0), torch.tensor(2.0), 1e-6)
    assert NATIVE.rope(torch.empty(0, 2, 16), torch.empty(0, dtype=torch.int64), _inv_freq(16)).shape == (
        0,
        2,
        16,
    )
    with pytest.raises(ValueError, match="weight shape"):
        NATIVE.rms_norm(torch.ones(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="group_size"):
        NATIVE.gated_rms_norm(torch.ones(2, 8), torch.ones(2, 8), torch.ones(8), 1e-6, 3)
    nan_row = torch.tensor([[1.0, float("nan"), 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]])
    out = NATIVE.rms_norm(nan_row, torch.ones(4), 1e-6)
    assert out[0].isnan().all() and torch.isfinite(out[1]).all()
    assert torch.equal(NATIVE.rms_norm(torch.zeros(1, 8), torch.ones(8), 1e-6), torch.zeros(1, 8))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_a_tensor_off_the_cpu_raises_instead_of_falling_back(dtype):
    """The native norms' bits differ from the aligned ops', so running the aligned op for a tensor on
    another device would silently break parity; each op refuses any of its tensors off the CPU ("meta"
    stands in for a GPU), empty ones and rope (whose bits would match) included. An fp64 input keeps
    the aligned op on every device: both sides take that route."""

    def meta(t: torch.Tensor) -> torch.Tensor:
        return t.to("meta")

    x, w = torch.ones(3, 8, dtype=dtype), torch.ones(8, dtype=dtype)
    rope_x, positions, inv_freq = torch.ones(3, 2, 16, dtype=dtype), torch.arange(3), _inv_freq(16)
    calls = [
        lambda: NATIVE.rms_norm(meta(x), meta(w), 1e-6),
        lambda: NATIVE.rms_norm(x, meta(w), 1e-6),
        lambda: NATIVE.rms_norm(meta(x[:0]), w, 1e-6),
        lambda: NATIVE.gated_rms_norm(meta(x), meta(x), meta(w), 1e-6, 4),
        lambda: NATIVE.gated_rms_norm(x, meta(x), w, 1e-6, 4),
        lambda: NATIVE.rope(meta(rope_x), positions, inv_freq),
        lambda: NATIVE.rope(rope_x, meta(positions), inv_freq),
        lambda: NATIVE.rope(rope_x, positions, meta(inv_freq)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="CPU only"):
            call()
    assert NATIVE.rms_norm(meta(x.double()), meta(w.double()), 1e-6).device.type == "meta"
