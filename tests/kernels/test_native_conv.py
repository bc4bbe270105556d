"""The aligned-native set's Mamba2 causal conv1d in C (kernels/native/conv.c): a sequence's outputs
and new state do not depend on the other sequences, on how its tokens are split across calls
(chunked prefill, decode steps, carrying the state) or on the thread count (``torch.equal``); an
``-O0`` build gives the ``-O3 -march=native`` bits; without activation the bits are the pure-torch
aligned conv's, with silu in fp32 they differ (inverse: the sets must not be mixed); accuracy
against float64; gradients are the aligned op's."""

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


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])


def _conv_inputs(gen, lens, channels, width, dtype):
    x = scaled_randn(gen, sum(lens), channels, dtype=dtype)
    weight = scaled_randn(gen, channels, width, dtype=dtype, scale=0.5)
    bias = scaled_randn(gen, channels, dtype=dtype)
    state = scaled_randn(gen, len(lens), channels, width - 1, dtype=dtype)
    return x, weight, bias, state


@settings(max_examples=25, deadline=None)
@given(
    lens=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    channels=st.integers(1, 40),
    width=st.integers(2, 6),
    dtype=st.sampled_from(sorted(NAMED_DTYPES)),
    with_state=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_sequences_and_splits_are_invariant(lens, channels, width, dtype, with_state, seed):
    """Each sequence alone gives the batch's bits; splitting one sequence in two calls that carry
    the state gives the one call's outputs and final state."""
    gen = torch.Generator().manual_seed(seed)
    x, weight, bias, state = _conv_inputs(gen, lens, channels, width, NAMED_DTYPES[dtype])
    state = state if with_state else None
    cu = _cu(lens)
    y, new_state = NATIVE.causal_conv1d(x, weight, bias, cu, state)
    assert y.dtype == x.dtype and new_state.shape == (len(lens), channels, width - 1)
    for s, n in enumerate(lens):
        a, b = int(cu[s]), int(cu[s + 1])
        alone_state = None if state is None else state[s : s + 1]
        ys, ss = NATIVE.causal_conv1d(x[a:b], weight, bias, _cu([n]), alone_state)
        assert torch.equal(ys, y[a:b]) and torch.equal(ss, new_state[s : s + 1])
        cut = n // 2
        first_state = alone_state if alone_state is not None else torch.zeros_like(ss)
        y1, s1 = NATIVE.causal_conv1d(x[a : a + cut], weight, bias, _cu([cut]), first_state)
        y2, s2 = NATIVE.causal_conv1d(x[a + cut : b], weight, bias, _cu([n - cut]), s1)
        assert torch.equal(torch.cat([y1, y2]), y[a:b]) and torch.equal(s2, new_state[s : s + 1])


@pytest.mark.parametrize("dtype", NAMED_DTYPES.values(), ids=NAMED_DTYPES.keys())
def test_no_activation_is_the_aligned_conv_and_fp32_silu_is_not(dtype):
    gen = torch.Generator().manual_seed(1)
    x, weight, bias, state = _conv_inputs(gen, [7, 1, 12], 70, 4, dtype)
    cu = _cu([7, 1, 12])
    for native, aligned in zip(
        NATIVE.causal_conv1d(x, weight, bias, cu, state, None),
        ALIGNED.causal_conv1d(x, weight, bias, cu, state, None),
    ):
        assert torch.equal(native, aligned)
    # nan and inf inputs: the same values, and in bf16 the same nan encoding as torch's cast (0xffff)
    x[3, 5], x[9, 0], state[0, 2, 1] = float("nan"), float("inf"), float("nan")
    for native, aligned in zip(
        NATIVE.causal_conv1d(x, weight, bias, cu, state, None),
        ALIGNED.causal_conv1d(x, weight, bias, cu, state, None),
    ):
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        assert torch.equal(native.view(bits), aligned.view(bits))
    if dtype == torch.float32:
        native_y = NATIVE.causal_conv1d(x, weight, bias, cu, state)[0]
        assert not torch.equal(native_y, ALIGNED.causal_conv1d(x, weight, bias, cu, state)[0])


def test_threads_strided_input_and_O0_build(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    cases = []
    for dtype in NAMED_DTYPES.values():
        x, weight, bias, state = _conv_inputs(gen, [300, 5, 1], 100, 4, dtype)
        cases.append((x, weight, bias, _cu([300, 5, 1]), state))
        # 200 sequences x 100 channels: past the threshold where the C loop runs on threads
        lens = [i % 3 for i in range(200)]
        x, weight, bias, state = _conv_inputs(gen, lens, 100, 4, dtype)
        cases.append((x, weight, bias, _cu(lens), state))
    with torch_threads(1):
        one = [NATIVE.causal_conv1d(*c) for c in cases]
    with torch_threads(2):
        two = [NATIVE.causal_conv1d(*c) for c in cases]
    wide = torch.cat([cases[0][0], cases[0][0]], dim=1)[:, :100]  # rows 200 apart: read in place
    assert torch.equal(NATIVE.causal_conv1d(wide, *cases[0][1:])[0], one[0][0])
    monkeypatch.setattr(_build, "build_flags", ("-O0",))
    scalar = [NATIVE.causal_conv1d(*c) for c in cases]
    monkeypatch.undo()
    for a, b, c in zip(one, two, scalar):
        for u, v, w in zip(a, b, c):
            assert torch.equal(u, v) and torch.equal(u, w)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
def test_accuracy_against_float64(dtype, tol):
    gen = torch.Generator().manual_seed(3)
    x, weight, bias, state = _conv_inputs(gen, [10], 24, 4, dtype)
    window = torch.cat([state[0].T.double(), x.double()])
    ref = torch.stack([(window[t : t + 4] * weight.double().T).sum(0) for t in range(10)]) + bias.double()
    ref = torch.nn.functional.silu(ref)
    err = (
        NATIVE.causal_conv1d(x, weight, bias, _cu([10]), state)[0].double() - ref
    ).abs().max() / ref.abs().max()
    assert err < tol


def test_gradients_and_fallbacks():
    gen = torch.Generator().manual_seed(4)
    x, weight, bias, state = _conv_inputs(gen, [6, 3], 16, 4, torch.float32)
    cu = _cu([6, 3])
    grads = []
    for kernels in (NATIVE, ALIGNED):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias, state)]
        y, new_state = kernels.causal_conv1d(leaves[0], leaves[1], leaves[2], cu, leaves[3])
        (y.square().sum() + new_state.sum()).backward()
        grads.append([t.grad for t in leaves])
    for native, aligned in zip(*grads):
        assert ((native - aligned).abs().max() / aligned.abs().max()) < 1e-5
    # fp64 and widths above 16 keep the aligned op
    x64, w64, b64, s64 = (t.double() for t in (x, weight, bias, state))
    for native, aligned in zip(
        NATIVE.causal_conv1d(x64, w64, b64, cu, s64), ALIGNED.causal_conv1d(x64, w64, b64, cu, s64)
    ):
        assert torch.equal(native, aligned)
    x2, w2, b2, s2 = _conv_inputs(gen, [4], 8, 18, torch.float32)
    assert torch.equal(
        NATIVE.causal_conv1d(x2, w2, b2, _cu([4]), s2)[0], ALIGNED.causal_conv1d(x2, w2, b2, _cu([4]), s2)[0]
    )
    with pytest.raises(ValueError, match="conv_state must be"):
        NATIVE.causal_conv1d(x, weight, bias, cu, state[:1])


def _numpy_silu(g):
    """fixed_math.h's zm_silu (zm_exp: Cody-Waite + degree-7 Horner) in numpy float32, op for op."""
    import numpy as np

    f = np.float32
    g = g.astype(np.float32)
    x = -g
    with np.errstate(all="ignore"):
        n = (x * f(1.44269504088896341) + f(12582912.0)) - f(12582912.0)
        r = x - n * f(0.693359375)
        r = r - n * f(-2.12194440e-4)
        p = np.full_like(x, f(1.0) / f(5040.0))
        for c in (
            f(1.0) / f(720.0),
            f(1.0) / f(120.0),
            f(1.0) / f(24.0),
            f(1.0) / f(6.0),
            f(0.5),
            f(1.0),
            f(1.0),
        ):
            p = p * r + c
        e = np.where(np.isfinite(n), n, 0).astype(np.int32) + 127
        scale = (e.astype(np.uint32) << 23).view(np.float32)
        exp = np.where(np.isnan(x), x, np.where(x > f(-87.0), p * scale, f(0.0)))
        exp = np.where(x > f(88.0), f(np.inf), exp)
        return g / (f(1.0) + exp)


def test_silu_is_fixed_maths_rule_bit_for_bit():
    """Pins the silu rule itself (fixed_math.h's exp polynomial, vectorized 16 lanes at a time): a
    width-2 conv with weights [0, 1] and no bias passes x through to the activation."""
    gen = torch.Generator().manual_seed(5)
    values = torch.cat(
        [
            torch.randn(20000, generator=gen) * 30,
            torch.tensor(
                [1e-30, 87.0, 86.99, 88.0, 88.5, -88.0, -88.5, 100.0, -100.0, float("inf"), float("nan")]
            ),
        ]
    )
    values = values[: values.numel() // 17 * 17 - 17].reshape(-1, 17)  # every vector lane in use
    values = torch.cat(
        [
            values,
            torch.tensor(
                [
                    [1e-30, 87.0, 86.99, 88.0, 88.5, -88.0, -88.5, 100.0, -100.0]
                    + [float("inf"), float("nan")]
                    + [1.0] * 6
                ]
            ),
        ]
    )
    weight = torch.tensor([[0.0, 1.0]]).repeat(17, 1)
    y, _ = NATIVE.causal_conv1d(values, weight, None, _cu([values.shape[0]]))
    expected = torch.from_numpy(_numpy_silu(values.numpy()))
    assert torch.equal(y.isnan(), expected.isnan())
    keep = ~expected.isnan()
    assert torch.equal(y[keep], expected[keep])


def test_double_backward_is_an_error_not_a_missing_term():
    """Review finding: with ``y.sum()`` the incoming gradient needs no gradient, and
    ``once_differentiable`` alone let a create_graph=True backward drop the second-order term."""
    x = torch.randn(7, 5).requires_grad_()
    weight = torch.randn(5, 4).requires_grad_()
    y, _ = NATIVE.causal_conv1d(x, weight, None, _cu([7]), None, None)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)
    h = torch.randn(3, 8).requires_grad_()
    out = NATIVE.linear(h, torch.randn(4, 8).requires_grad_())
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(out.sum(), h, create_graph=True)


@pytest.mark.parametrize("activation", ["silu", None])
def test_a_tensor_off_the_cpu_raises_instead_of_falling_back(activation):
    """With silu the native bits differ from the aligned conv's, so running the aligned conv for a
    tensor on another device would silently break parity: any tensor off the CPU ("meta" stands in
    for a GPU) is refused, without activation too (one rule for the set)."""
    gen = torch.Generator().manual_seed(9)
    inputs, cu = _conv_inputs(gen, [3, 2], 8, 4, torch.float32), _cu([3, 2])
    for i in range(len(inputs)):
        moved = [t.to("meta") if j == i else t for j, t in enumerate(inputs)]
        with pytest.raises(ValueError, match="CPU only"):
            NATIVE.causal_conv1d(*moved[:3], cu, moved[3], activation)
