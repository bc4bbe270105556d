"""Row (batch) invariance of the aligned dense ops, exact, with inverse tests for the default set.

Property: an op's output row i computed inside any batch (any size M, any position, any
neighbours, extra padding rows, any leading dims) equals, by ``torch.equal``, the same row
computed alone. Hypothesis draws shapes, dtypes (fp32, bf16) and seeds.

Each property has an inverse test: a deterministic search over inputs that finds a case
where the default set breaks it, so the property tests cannot pass vacuously. Where the
stock CPU kernel is naturally row-invariant (rope, relu2, log_softmax, rms_norm below
32768 columns) the test says so and the inverse is shown at the nearest honest level
(see docs/parity.md).
"""

from __future__ import annotations

import contextlib

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import torch_threads

from zeromismatch.kernels import get_kernels
from zeromismatch.kernels.quant import quantize_fp8, quantize_nvfp4

ALIGNED = get_kernels("aligned")
DEFAULT = get_kernels("default")
DTYPES = st.sampled_from([torch.float32, torch.bfloat16])
SEEDS = st.integers(0, 2**16)


def _randn(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


@contextlib.contextmanager
def _mkl_fallback():
    """Aligned GEMMs on the MKL fallback (as on a torch build without oneDNN), restored on exit."""
    from zeromismatch.kernels.aligned import gemm

    saved = gemm._ONEDNN
    gemm._ONEDNN = False
    try:
        yield
    finally:
        gemm._ONEDNN = saved


def _row_invariant(fn, x: torch.Tensor, seed: int) -> bool:
    """fn(x)[i] == fn(x[i:i+1])[0] for all i, and == the row placed at another position
    of a bigger batch of strangers (with zero padding rows appended)."""
    full = fn(x)
    m = x.shape[0]
    for i in range(m):
        if not torch.equal(fn(x[i : i + 1])[0], full[i]):
            return False
    strangers = _randn((m + 5, *x.shape[1:]), x.dtype, seed + 1, scale=3.0)
    pos = seed % (m + 5)
    strangers[pos] = x[0]
    padded = torch.cat([strangers, torch.zeros(3, *x.shape[1:], dtype=x.dtype)])
    return torch.equal(fn(padded)[pos], full[0])


def _find_violation(fn_of_case, cases) -> object | None:
    for case in cases:
        if not fn_of_case(case):
            return case
    return None


# ---- linear -------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 24), k=st.integers(1, 300), n=st.integers(1, 300), dtype=DTYPES, seed=SEEDS)
def test_linear_row_invariant(m, k, n, dtype, seed):
    x = _randn((m, k), dtype, seed)
    w = _randn((n, k), dtype, seed + 7)
    b = _randn((n,), dtype, seed + 9)
    assert _row_invariant(lambda t: ALIGNED.linear(t, w, b), x, seed)


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 4), s=st.integers(1, 9), k=st.sampled_from([64, 256, 1024]), dtype=DTYPES, seed=SEEDS)
def test_linear_leading_dims_match_rows_alone(b, s, k, dtype, seed):
    x = _randn((b, s, k), dtype, seed)
    w = _randn((96, k), dtype, seed + 1)
    full = ALIGNED.linear(x, w)
    assert full.shape == (b, s, 96)
    for i in range(b):
        for j in range(s):
            assert torch.equal(ALIGNED.linear(x[i, j], w), full[i, j])


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 200),
    n=st.integers(1, 200),
    dtype=st.sampled_from([torch.float64, torch.float16, torch.float32]),
    seed=SEEDS,
)
def test_mkl_fallback_path_row_invariant(m, k, n, dtype, seed):
    # fp64/fp16 always take the F.linear fallback (rows padded to a multiple of 16); fp32 is
    # forced onto it here to cover builds without oneDNN -- inside this example only (a module-scoped
    # fixture used to leave it off for every later test in this file, off the production path)
    x = _randn((m, k), dtype, seed)
    w = _randn((n, k), dtype, seed + 7)
    with _mkl_fallback():
        assert _row_invariant(lambda t: ALIGNED.linear(t, w), x, seed)


def test_the_fallback_switch_is_restored():
    from zeromismatch.kernels.aligned import gemm

    before = gemm._ONEDNN
    with _mkl_fallback():
        assert gemm._ONEDNN is False
    assert gemm._ONEDNN == before


def test_default_linear_violates_row_invariance():
    cases = [
        (m, k, dt, s)
        for dt in (torch.float32, torch.bfloat16)
        for m in (3, 5, 7)
        for k in (256, 1024)
        for s in range(3)
    ]

    def ok(case):
        m, k, dt, s = case
        w = _randn((k, k), dt, s + 1)
        return _row_invariant(lambda t: DEFAULT.linear(t, w), _randn((m, k), dt, s), s)

    assert _find_violation(ok, cases) is not None


# ---- norms and activations ----------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 16), h=st.integers(1, 700), dtype=DTYPES, seed=SEEDS)
def test_rms_norm_row_invariant(m, h, dtype, seed):
    x = _randn((m, h), dtype, seed, scale=2.0)
    w = _randn((h,), dtype, seed + 1)
    assert _row_invariant(lambda t: ALIGNED.rms_norm(t, w, 1e-6), x, seed)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 16), h=st.integers(1, 5000), dtype=DTYPES, seed=SEEDS)
def test_rms_norm_fused_path_has_the_two_op_bits(m, h, dtype, seed):
    # below 32768 columns and without autograd the aligned norm calls torch's fused F.rms_norm;
    # its bits must be those of the definition written out (fp32 inside, HF rounding for bf16)
    x = _randn((m, h), dtype, seed, scale=2.0)
    w = _randn((h,), dtype, seed + 1)
    xf = x.float()
    normed = xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) / h + 1e-6)
    assert torch.equal(ALIGNED.rms_norm(x, w, 1e-6), w * normed.to(dtype))
    # under autograd (the trainer) the two-op form runs: the same forward bits
    with_grad = ALIGNED.rms_norm(x.clone().requires_grad_(True), w, 1e-6)
    assert torch.equal(with_grad.detach(), w * normed.to(dtype))


@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 4), h=st.integers(32768, 70000), dtype=DTYPES, seed=SEEDS)
def test_rms_norm_long_rows_row_invariant(m, h, dtype, seed):
    # >= 32768 columns: torch reduces a single row in two parallel passes, many rows one
    # per thread; the aligned norm cuts long rows into fixed chunks first. The regime where the
    # default drifts in fp32 (its inverse below), drawn over widths, dtypes and seeds; in bf16 the
    # default norm measured row-invariant at these widths (h 40000/70000, seeds 0-3, 2 threads), so
    # the bf16 examples have no inverse
    # at 2 threads, as the inverse runs: at one thread the stock norm is invariant too, so the test
    # passed with the default kernels under OMP_NUM_THREADS=1
    x = _randn((m, h), dtype, seed, scale=2.0)
    w = _randn((h,), dtype, seed + 1)
    with torch_threads(2):
        assert _row_invariant(lambda t: ALIGNED.rms_norm(t, w, 1e-6), x, seed)


def test_default_rms_norm_violates_row_invariance_on_long_rows():
    # the two-pass single-row reduction only happens with >= 2 threads: run at 2 whatever
    # OMP_NUM_THREADS says, so this inverse never skips
    cases = [(h, s) for h in (40000, 70000, 100000) for s in range(4)]

    def ok(case):
        h, s = case
        return _row_invariant(lambda t: DEFAULT.rms_norm(t, torch.ones(h), 1e-6), _randn((4, h), seed=s), s)

    with torch_threads(2):
        assert _find_violation(ok, cases) is not None


def test_rms_norm_is_naturally_row_invariant_below_32768_columns():
    # Honest record, not an inverse: the stock fused norm (F.rms_norm) is row-invariant at model sizes.
    for h in (64, 1000, 4096):
        w = _randn((h,), seed=h)
        assert _row_invariant(lambda t, w=w: DEFAULT.rms_norm(t, w, 1e-6), _randn((9, h), seed=h), h)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 12), groups=st.integers(1, 5), gs=st.integers(1, 70), dtype=DTYPES, seed=SEEDS)
def test_gated_rms_norm_row_invariant(m, groups, gs, dtype, seed):
    x = _randn((m, groups * gs), dtype, seed)
    gate = _randn((m, groups * gs), dtype, seed + 3, scale=3.0)
    w = _randn((groups * gs,), dtype, seed + 5)
    full = ALIGNED.gated_rms_norm(x, gate, w, 1e-5, gs)
    for i in range(m):
        assert torch.equal(ALIGNED.gated_rms_norm(x[i : i + 1], gate[i : i + 1], w, 1e-5, gs)[0], full[i])


def _silu_mul_invariant(kernels, m, h, dtype, seed):
    gate = _randn((m, h), dtype, seed, scale=4.0)
    up = _randn((m, h), dtype, seed + 1)
    full = kernels.silu_mul(gate, up)
    return all(torch.equal(kernels.silu_mul(gate[i : i + 1], up[i : i + 1])[0], full[i]) for i in range(m))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 16), h=st.integers(1, 300), dtype=DTYPES, seed=SEEDS)
def test_silu_mul_row_invariant(m, h, dtype, seed):
    assert _silu_mul_invariant(ALIGNED, m, h, dtype, seed)


def test_default_silu_mul_and_gated_norm_violate_row_invariance():
    # torch's fused silu runs a scalar std::exp on the tail of the buffer, a vector exp elsewhere
    cases = [(m, h, s) for h in (37, 45, 101, 131) for m in (3, 5) for s in range(4)]
    assert _find_violation(lambda c: _silu_mul_invariant(DEFAULT, c[0], c[1], torch.float32, c[2]), cases)

    def gated_ok(case):
        m, h, s = case
        x, gate = _randn((m, h), seed=s), _randn((m, h), seed=s + 1, scale=4.0)
        w = torch.ones(h)
        full = DEFAULT.gated_rms_norm(x, gate, w, 1e-5, h)
        return all(
            torch.equal(DEFAULT.gated_rms_norm(x[i : i + 1], gate[i : i + 1], w, 1e-5, h)[0], full[i])
            for i in range(m)
        )

    assert _find_violation(gated_ok, cases) is not None


@settings(max_examples=25, deadline=None)
@given(
    t=st.integers(1, 12),
    heads=st.integers(1, 4),
    half=st.integers(1, 40),
    inter=st.booleans(),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_rope_token_invariant_in_both_sets(t, heads, half, inter, dtype, seed):
    # rope is elementwise per token with cos/sin from that token's position: naturally
    # invariant in both sets (no inverse exists on this CPU; recorded in docs/parity.md)
    x = _randn((t, heads, 2 * half), dtype, seed)
    pos = torch.randint(0, 4096, (t,), generator=torch.Generator().manual_seed(seed))
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    for kernels in (ALIGNED, DEFAULT):
        full = kernels.rope(x, pos, inv_freq, inter)
        for i in range(t):
            assert torch.equal(kernels.rope(x[i : i + 1], pos[i : i + 1], inv_freq, inter)[0], full[i])


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 12), h=st.integers(1, 300), dtype=DTYPES, seed=SEEDS)
def test_relu2_row_invariant_in_both_sets(m, h, dtype, seed):
    # relu and one multiply are exact per element: naturally invariant (no inverse exists)
    x = _randn((m, h), dtype, seed)
    for kernels in (ALIGNED, DEFAULT):
        assert _row_invariant(kernels.relu2, x, seed)


# ---- logprobs -----------------------------------------------------------------------
def _logprobs(kernels, w):
    return lambda h: kernels.log_softmax(kernels.lm_head(h, w))


def _processed(kernels, w, temp, top_k, top_p):
    def fn(h):
        m = h.shape[0]
        return kernels.processed_log_softmax(
            kernels.lm_head(h, w), temp.expand(m).clone(), top_k.expand(m).clone(), top_p.expand(m).clone()
        )

    return fn


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 12),
    h=st.sampled_from([32, 64, 200, 256]),
    v=st.integers(2, 600),
    dtype=DTYPES,
    seed=SEEDS,
)
def test_logprobs_row_invariant(m, h, v, dtype, seed):
    hidden = _randn((m, h), dtype, seed)
    w = _randn((v, h), dtype, seed + 1, scale=0.2)
    assert _row_invariant(_logprobs(ALIGNED, w), hidden, seed)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 10),
    v=st.integers(2, 400),
    h=st.sampled_from([256, 1024]),
    dtype=DTYPES,
    temp=st.sampled_from([0.0, 0.6, 1.0, 1.7]),
    top_k=st.integers(-1, 50),
    top_p=st.sampled_from([0.3, 0.9, 1.0]),
    seed=SEEDS,
)
def test_processed_logprobs_row_invariant(m, v, h, dtype, temp, top_k, top_p, seed):
    # hidden 256 and 1024, fp32 and bf16: where the inverse below finds the default head row-variant
    # (the earlier bf16-only strategy at hidden 128, where the stock head happens to be invariant, also
    # passed with the default kernels)
    hidden = _randn((m, h), dtype, seed)
    w = _randn((v, h), dtype, seed + 1, scale=0.2)
    fn = _processed(ALIGNED, w, torch.tensor([temp]), torch.tensor([top_k]), torch.tensor([top_p]))
    assert _row_invariant(fn, hidden, seed)


def test_processed_logprobs_row_invariant_with_mixed_params_per_row():
    hidden = _randn((6, 64), seed=3)
    w = _randn((300, 64), seed=4, scale=0.3)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.2, 1.0, 0.5])
    top_k = torch.tensor([0, 0, 20, 5, -1, 300])
    top_p = torch.tensor([1.0, 0.8, 1.0, 0.5, 0.95, 0.2])
    full = ALIGNED.processed_log_softmax(ALIGNED.lm_head(hidden, w), temp, top_k, top_p)
    for i in range(6):
        alone = ALIGNED.processed_log_softmax(
            ALIGNED.lm_head(hidden[i : i + 1], w), temp[i : i + 1], top_k[i : i + 1], top_p[i : i + 1]
        )
        assert torch.equal(alone[0], full[i])


def test_log_softmax_row_invariant_at_a_real_vocab_size():
    # 151936 = Qwen3 vocab: one row is reduced on one thread whatever the row count
    logits = _randn((3, 151936), seed=0, scale=4.0)
    for kernels in (ALIGNED, DEFAULT):
        assert _row_invariant(kernels.log_softmax, logits, 0)


def test_default_logprobs_violate_row_invariance():
    # fp32 activations: the stock head is MKL sgemm with M-dependent kernels; bf16: the head
    # runs in bf16. Either way a token's logprob depends on the batch it came in.
    cases = [
        (m, h, dt, s)
        for dt in (torch.float32, torch.bfloat16)
        for m in (3, 5)
        for h in (256, 1024)
        for s in range(3)
    ]

    def ok(case):
        m, h, dt, s = case
        w = _randn((500, h), dt, s + 1, scale=0.2)
        return _row_invariant(_logprobs(DEFAULT, w), _randn((m, h), dt, s), s)

    assert _find_violation(ok, cases) is not None

    def processed_ok(case):
        m, h, dt, s = case
        w = _randn((500, h), dt, s + 1, scale=0.2)
        fn = _processed(DEFAULT, w, torch.tensor([0.8]), torch.tensor([40]), torch.tensor([0.9]))
        return _row_invariant(fn, _randn((m, h), dt, s), s)

    assert _find_violation(processed_ok, cases) is not None


def test_default_bf16_head_differs_from_fp32_head():
    # the nearest honest level for the dtype drift: same hidden states, bf16 vs fp32 head
    hidden = _randn((4, 256), torch.bfloat16, 0)
    w = _randn((1000, 256), torch.bfloat16, 1, scale=0.2)
    assert not torch.equal(DEFAULT.lm_head(hidden, w), ALIGNED.lm_head(hidden, w))
    assert ALIGNED.lm_head(hidden, w).dtype == torch.float32


# ---- quantized linear ---------------------------------------------------------------
QFORMATS = st.sampled_from(["fp8", "fp8-block", "nvfp4"])


def _quantize(fmt, w):
    if fmt == "fp8":
        return quantize_fp8(w)
    if fmt == "fp8-block":
        return quantize_fp8(w, (16, 32))
    return quantize_nvfp4(w)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 12),
    k16=st.integers(1, 12),
    n=st.integers(1, 100),
    fmt=QFORMATS,
    dtype=DTYPES,
    seed=SEEDS,
)
def test_quant_linear_row_invariant(m, k16, n, fmt, dtype, seed):
    qw = _quantize(fmt, _randn((n, 16 * k16), seed=seed + 1))
    x = _randn((m, 16 * k16), dtype, seed)
    assert _row_invariant(lambda t: ALIGNED.quant_linear(t, qw), x, seed)


def test_default_quant_linear_batch_wide_activation_scale_violates_row_invariance():
    # a stranger with a large activation raises the per-tensor scale and coarsens every row
    for fmt in ("fp8", "fp8-block", "nvfp4"):
        qw = _quantize(fmt, _randn((64, 128), seed=1))
        row = _randn((1, 128), seed=2)
        stranger = _randn((1, 128), seed=3, scale=50.0)
        alone = DEFAULT.quant_linear(row, qw)[0]
        batched = DEFAULT.quant_linear(torch.cat([row, stranger]), qw)[0]
        assert not torch.equal(alone, batched), fmt
        a_alone = ALIGNED.quant_linear(row, qw)[0]
        assert torch.equal(a_alone, ALIGNED.quant_linear(torch.cat([row, stranger]), qw)[0]), fmt
